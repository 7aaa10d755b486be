"""`bridge epochs show|publish|discard`: the whole epochs a consumer group holds back, and an
operator's way out for one that cannot complete (its query stopped for good after some tasks
committed, a manifest that never came)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from bridge.errors import BridgeError
from bridge.names import DEFAULT_STACK_DIR, EPOCH_ACTIONS_TABLE
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
    import psycopg

    from consumers import EpochState, Held, LedgerNames

app = typer.Typer(
    help="Whole epochs a consumer group holds back: see them, publish or discard one."
)
console = output_console()

Query = Annotated[str, typer.Option("--query", help="The Spark query's id (bridge.query).")]
EpochNo = Annotated[int, typer.Option("--epoch", help="The epoch (Spark's batch id).")]
Execute = Annotated[
    bool, typer.Option("--execute", help="Act; without it, only show what would be done.")
]


def _whole_topic(settings: BridgeSettings) -> Any:
    """Which topics wait for their epoch: by the configuration's routes; without one, every
    topic a part names."""
    consumer = settings.consumer
    return consumer.whole_topic if consumer is not None else (lambda topic: True)


def _open(conn: psycopg.Connection[Any], schema: str, group: str) -> list[EpochState]:
    import psycopg

    from consumers import LedgerNames, open_epochs

    try:
        return open_epochs(conn, LedgerNames(schema), group)
    except psycopg.errors.UndefinedTable:
        raise BridgeError(
            f"no epoch ledger in schema {schema!r}: no consumer of this release has run there"
        ) from None


@app.command()
def show(
    group: Group = None,
    output: OutputFormat = Format.TABLE,
    schema: Schema = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """The group's epochs not yet published: their age, records staged, and what each lacks."""
    from consumers import age_s, database_now

    settings = tools_settings(config, stack_dir)
    schema = state_schema(settings, schema)
    group = group_of(settings, group)
    whole = _whole_topic(settings)
    with connect_postgres(settings) as conn:
        states = _open(conn, schema, group)
        now = database_now(conn)
    rows: list[dict[str, Any]] = [
        {
            "query": s.query,
            "epoch": s.epoch,
            "age_s": round(age_s(s, now), 1),
            "staged": s.staged_records,
            "forced": s.forced,
            "missing": s.missing(whole),
        }
        for s in states
    ]
    if output is Format.JSON:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"open epochs of group {group}")
    for name in ("query", "epoch", "age", "staged", "missing"):
        table.add_column(name)
    for row in rows:
        missing = "\n".join(row["missing"]) or "nothing: whole, publishing"
        table.add_row(row["query"], str(row["epoch"]), f"{row['age_s']:.0f}s",
                      str(row["staged"]), missing)  # fmt: skip
    console.print(table)
    if not rows:
        console.print(f"no open epochs for group {group!r}")


@app.command()
def publish(
    query: Query,
    epoch: EpochNo,
    group: Group = None,
    execute: Execute = False,
    schema: Schema = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Publish an epoch as it is, whole or not: the next member of the group to look applies
    what it holds, in one transaction. A dry run unless --execute; an audit row either way
    it acts."""
    from consumers import force_epoch

    def act(conn: psycopg.Connection[Any], names: LedgerNames, held: Held) -> str:
        force_epoch(conn, names, held, requested_by=requested_by())
        return "marked to publish: a running member of the group publishes it within a second"

    _act(query, epoch, group, execute, schema, tools_settings(config, stack_dir),
         dry="publish it as it is", act=act)  # fmt: skip


@app.command()
def discard(
    query: Query,
    epoch: EpochNo,
    group: Group = None,
    execute: Execute = False,
    schema: Schema = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Give an epoch up: its staged records go to the dead letters (kept, with why), none of it
    reaches the tables, and the epochs after it may publish. A dry run unless --execute; an
    audit row when it acts."""
    from psycopg import sql

    from bridge.names import DEAD_LETTERS_TABLE
    from consumers import discard_epoch

    def act(conn: psycopg.Connection[Any], names: LedgerNames, held: Held) -> str:
        dead_letters = sql.Identifier(names.schema, DEAD_LETTERS_TABLE)
        moved = discard_epoch(conn, names, dead_letters, held, requested_by=requested_by())
        return f'discarded: {moved} staged record(s) moved to "{names.schema}".{DEAD_LETTERS_TABLE}'

    _act(query, epoch, group, execute, schema, tools_settings(config, stack_dir),
         dry="discard it", act=act)  # fmt: skip


def _act(
    query: str,
    epoch: int,
    group: str | None,
    execute: bool,
    schema: str | None,
    settings: BridgeSettings,
    *,
    dry: str,
    act: Callable[[psycopg.Connection[Any], LedgerNames, Held], str],
) -> None:
    """In one transaction: lock the epoch, read it and judge it under the lock (nothing
    settles it meanwhile), say what it holds and lacks, and with --execute act on it."""
    import psycopg

    from consumers import LedgerNames, hold_epoch

    schema = state_schema(settings, schema)
    group = group_of(settings, group)
    names = LedgerNames(schema)
    with connect_postgres(settings) as conn:
        try:
            with conn.transaction():
                held = hold_epoch(conn, names, group, (query, epoch), _whole_topic(settings))
                console.print(
                    f"query {query} epoch {epoch} ({held.phase}): "
                    f"{held.state.staged_records} records staged; lacks: {held.lacking}"
                )
                if not execute:
                    console.print(f"dry run: nothing changed; add --execute to {dry}")
                    raise psycopg.Rollback()
                done = act(conn, names, held)
        except psycopg.errors.UndefinedTable:
            raise BridgeError(
                f"no epoch ledger in schema {schema!r}: no consumer of this release has run there"
            ) from None
    if execute:
        console.print(f'{done}; audit row in "{schema}".{EPOCH_ACTIONS_TABLE}')
