"""`bridge dead-letters show|replay`: the records a group's routes refused, and each applied
again through its route, exactly once, after a fix (`consumers.dead_letter_replay`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from bridge.errors import BridgeError, ConfigError
from bridge.names import DEAD_LETTER_REPLAYS_TABLE, DEFAULT_STACK_DIR
from bridge.settings import BridgeSettings
from bridge_shell.cli.options import (
    ConfigFile,
    Format,
    Group,
    OutputFormat,
    Schema,
    StackDir,
    connect_postgres,
    group_of,
    output_console,
    requested_by,
    state_schema,
    tools_settings,
)

if TYPE_CHECKING:  # imported where used: every `bridge` command imports this module
    from consumers import Chosen, DeadLetter, Replayed

app = typer.Typer(help="Records a group's routes refused: see them, replay them after a fix.")
console = output_console()

Topic = Annotated[str | None, typer.Option("--topic", help="Only this topic's.")]
Partition = Annotated[int | None, typer.Option("--partition", help="Only this partition's.")]
ErrorPart = Annotated[
    str | None, typer.Option("--error", help="Only those whose error holds this text (any case).")
]
Since = Annotated[
    str | None,
    typer.Option("--since", help="Only those that failed at or after this ISO 8601 time (UTC "
                 "unless it says otherwise)."),
]  # fmt: skip
Until = Annotated[
    str | None, typer.Option("--until", help="Only those that failed before this time.")
]
Limit = Annotated[int | None, typer.Option("--limit", min=1, help="At most this many.")]
Execute = Annotated[
    bool, typer.Option("--execute", help="Replay; without it, only show what would be replayed.")
]


def _moment(option: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            [(option, f"{text!r} is not an ISO 8601 date-time such as 2026-11-22T08:00:00Z")],
            source="the command line",
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _chosen(
    settings: BridgeSettings,
    group: str | None,
    topic: str | None,
    partition: int | None,
    error: str | None,
    since: str | None,
    until: str | None,
    limit: int | None,
) -> Chosen:
    from consumers import Chosen

    return Chosen(group=group_of(settings, group), topic=topic, partition=partition,
                  error=error, since=_moment("--since", since), until=_moment("--until", until),
                  limit=limit)  # fmt: skip


def _found(settings: BridgeSettings, schema: str, chosen: Chosen) -> list[DeadLetter]:
    import psycopg

    from consumers import dead_letters, state_tables

    with connect_postgres(settings) as conn:
        try:
            return dead_letters(conn, state_tables(schema), chosen)
        except psycopg.errors.UndefinedColumn:
            raise BridgeError(
                f"the dead letters in schema {schema!r} are of an older release: start a "
                "consumer of this release on it once, which migrates them"
            ) from None
        except psycopg.errors.UndefinedTable:
            raise BridgeError(
                f"no dead letters in schema {schema!r}: no consumer ran there"
            ) from None


def _print(letters: list[DeadLetter], output: Format, title: str) -> None:
    rows: list[dict[str, Any]] = [
        {"id": d.id, "topic": d.topic, "partition": d.partition, "offset": d.offset,
         "attempts": d.attempts, "failed_at": d.failed_at.isoformat(), "error": d.error,
         "value_bytes": d.value_bytes}
        for d in letters
    ]  # fmt: skip
    if output is Format.JSON:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=title)
    for name in ("topic", "partition", "offset", "attempts", "failed at", "error"):
        table.add_column(name)
    for row in rows:
        table.add_row(row["topic"], str(row["partition"]), str(row["offset"]),
                      str(row["attempts"]), row["failed_at"][:19], row["error"][:120])  # fmt: skip
    console.print(table)


@app.command()
def show(
    group: Group = None,
    topic: Topic = None,
    partition: Partition = None,
    error: ErrorPart = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = None,
    output: OutputFormat = Format.TABLE,
    schema: Schema = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """The group's dead letters, in each partition's offset order: where each came from, why,
    and how many times it was tried."""
    settings = tools_settings(config, stack_dir)
    schema = state_schema(settings, schema)
    chosen = _chosen(settings, group, topic, partition, error, since, until, limit)
    letters = _found(settings, schema, chosen)
    _print(letters, output, f"dead letters of group {chosen.group}")
    if output is Format.TABLE and not letters:
        console.print(f"no dead letters of group {chosen.group!r} match")


@app.command()
def replay(
    group: Group = None,
    topic: Topic = None,
    partition: Partition = None,
    error: ErrorPart = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = None,
    execute: Execute = False,
    schema: Schema = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Apply the chosen dead letters again through their routes (the configuration's), each in
    one transaction that also deletes it, so it lands exactly once; one that still does not fit
    stays, with its new error and one more attempt. An audit row per replay. A dry run unless
    --execute; refused while a chosen dead letter's topic has no route."""
    settings = tools_settings(config, stack_dir)
    if settings.consumer is None or not settings.consumer.routes:
        raise BridgeError("replay needs the consumer's configuration (--config): its routes "
                          "say where each dead letter goes")  # fmt: skip
    schema = state_schema(settings, schema)
    chosen = _chosen(settings, group, topic, partition, error, since, until, limit)
    letters = _found(settings, schema, chosen)
    if not letters:
        console.print(f"no dead letters of group {chosen.group!r} match: nothing to replay")
        return
    unrouted = sorted({d.topic for d in letters if settings.consumer.route_for(d.topic) is None})
    if unrouted:
        raise BridgeError(
            f"no route of the configuration reads topic(s) {', '.join(unrouted)}: nothing was "
            "replayed (add the route, or choose other dead letters with --topic)"
        )
    _print(letters, Format.TABLE, f"dead letters of group {chosen.group} to replay")
    if not execute:
        console.print(f"dry run: {len(letters)} dead letter(s) would be replayed through their "
                      "routes; add --execute to replay them")  # fmt: skip
        return
    done = _replay(settings, schema, chosen.group, letters)
    console.print(
        f"replayed {len(letters)}: {done.landed} landed, {done.skipped} left out by the route's "
        f"mode, {done.dead_again} still do not fit, {done.gone} already gone; audit rows in "
        f'"{schema}".{DEAD_LETTER_REPLAYS_TABLE}'
    )
    if done.dead_again:
        raise typer.Exit(1)


def _replay(
    settings: BridgeSettings, schema: str, group: str, letters: list[DeadLetter]
) -> Replayed:
    import psycopg

    from consumers import Replayed, Replayer, Router, SchemaCache, state_tables

    consumer = settings.consumer
    assert consumer is not None  # noqa: S101 - checked by the caller
    config = consumer.model_copy(update={"group_id": group, "state_schema": schema})
    typed = any(r.needs_registry for r in config.routes)
    registry = settings.schema_registry
    schemas = SchemaCache(registry) if typed and registry is not None else None
    dsn = settings.postgres.dsn.get_secret_value()
    done = Replayed()
    try:
        with connect_postgres(settings) as conn:
            replayer = Replayer(conn, config=config, tables=state_tables(schema),
                                router=Router(dsn=dsn, config=config, schemas=schemas),
                                requested_by=requested_by())  # fmt: skip
            replayer.replay(letters, done)
    except (BridgeError, psycopg.Error) as exc:
        # The registry or a table not ready, the database lost, a dead letter another replay
        # holds: what committed stays, each dead letter once; the rest waits for a new run.
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BridgeError(
            f"the replay stopped after {done.landed + done.skipped + done.dead_again} of "
            f"{len(letters)} ({done.landed} landed): {why}. Those replayed are settled; run it "
            "again for the rest"
        ) from None
    finally:
        if schemas is not None:
            schemas.close()
    return done
