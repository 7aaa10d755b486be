"""`bridge offsets show|reset`: where each partition of a consumer group stands, and moving it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from bridge.errors import BridgeError
from bridge.kafka_admin import KafkaAdmin
from bridge.names import DEFAULT_STACK_DIR
from bridge_shell.cli.options import (
    ConfigFile,
    Format,
    Group,
    OutputFormat,
    Schema,
    StackDir,
    connect_postgres,
    output_console,
    state_schema,
    tools_settings,
)
from bridge_shell.tables import or_dash, positions_table

if TYPE_CHECKING:  # imported where used: every `bridge` command imports this module
    pass

app = typer.Typer(help="The consumer's stored positions: inspect them, move them safely.")
console = output_console()


@app.command()
def show(
    group: Group = None,
    output: OutputFormat = Format.TABLE,
    schema: Schema = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Per (group, topic, partition): the stored next offset against the log's range and lag,
    its owner, and a flag where the stored offset is outside the log."""
    from consumers import read_positions

    settings = tools_settings(config, stack_dir)
    schema = state_schema(settings, schema)
    if group is None and settings.consumer is not None:
        group = settings.consumer.group_id
    admin = KafkaAdmin(settings.kafka.client_config())
    with connect_postgres(settings) as conn:
        positions = read_positions(conn, schema, admin, group)
    if output is Format.JSON:
        print(json.dumps([p.as_json() for p in positions], indent=2))
        return
    table = positions_table(
        positions, title=f"stored offsets{f' of group {group}' if group else ''}"
    )
    console.print(table)
    if not positions:
        console.print("no stored offsets" + (f" for group {group!r}" if group else ""))


@app.command()
def reset(
    topic: Annotated[str, typer.Option("--topic", help="The topic whose positions move.")],
    to: Annotated[
        str, typer.Option("--to", help="earliest, latest, an offset, or an ISO 8601 date-time.")
    ],
    group: Group = None,
    partition: Annotated[
        int | None, typer.Option("--partition", help="One partition; all when not given.")
    ] = None,
    execute: Annotated[
        bool, typer.Option("--execute", help="Apply the reset; without it, only show it.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Also reset partitions a live member holds.")
    ] = False,
    schema: Schema = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Move a group's stored positions: a dry run unless --execute. Refused while a live member
    holds a partition, unless --force; the owner epoch is bumped either way, so a member still
    writing is fenced, and an audit row records each move."""
    from bridge.names import OFFSET_RESETS_TABLE
    from consumers import ensure_state, execute_reset, parse_reset_target, plan_reset

    settings = tools_settings(config, stack_dir)
    schema = state_schema(settings, schema)
    if group is None:
        if settings.consumer is None:
            raise BridgeError("--group is required (or a configuration with consumer.group_id)")
        group = settings.consumer.group_id
    target = parse_reset_target(to)
    # A group may be positioned before it first runs.
    ensure_state(settings.postgres.dsn.get_secret_value(), schema)
    admin = KafkaAdmin(settings.kafka.client_config())
    with connect_postgres(settings) as conn:
        steps = plan_reset(
            conn, schema, admin, group=group, topic=topic, partition=partition, target=target
        )
        table = Table(title=f"reset of group {group}, topic {topic}, to {target.text}")
        for name in ("partition", "old next offset", "new next offset", "owner", "live member"):
            table.add_column(name)
        for step in steps:
            table.add_row(
                str(step.partition),
                or_dash(step.old_offset),
                str(step.new_offset),
                step.owner or "-",
                step.live_owner or "-",
            )
        console.print(table)
        if not execute:
            console.print("dry run: nothing changed; add --execute to apply")
            return
        epochs = execute_reset(conn, schema, group=group, steps=steps, target=target, force=force)
    console.print(
        f"reset applied to {len(steps)} partition(s); owner epochs now {epochs}; "
        f'audit rows in "{schema}".{OFFSET_RESETS_TABLE}'
    )


@app.command()
def delete(
    group: Annotated[str, typer.Option("--group", help="The consumer group to delete.")],
    execute: Annotated[
        bool, typer.Option("--execute", help="Delete; without it, only show what would go.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Also while a live member holds a partition.")
    ] = False,
    schema: Schema = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Remove a group's stored positions (a group left behind, a pipeline retired), with an
    audit row per partition. A dry run unless --execute; refused while a live member of the
    group holds a partition, unless --force (that member is then fenced, and takes its
    partitions again as a new group would, from consumer.start_policy)."""
    from bridge.names import OFFSET_DELETIONS_TABLE
    from bridge_shell.cli.options import requested_by
    from consumers import OffsetStore, read_positions

    settings = tools_settings(config, stack_dir)
    schema = state_schema(settings, schema)
    admin = KafkaAdmin(settings.kafka.client_config())
    with connect_postgres(settings) as conn:
        positions = read_positions(conn, schema, admin, group)
        console.print(positions_table(positions, title=f"stored offsets of group {group}"))
        if not positions:
            console.print(f"no stored offsets for group {group!r}: nothing to delete")
            return
        held = [p for p in positions if p.live_owner]
        if held and not force:
            names = ", ".join(f"{p.topic}[{p.partition}] by {p.live_owner}" for p in held)
            raise BridgeError(
                f"group {group!r} has live members holding {names}: stop them first, or pass "
                "--force (each is fenced, and takes its partitions again as a new group would)"
            )
        if not execute:
            console.print(f"dry run: nothing changed; add --execute to delete the {len(positions)} "
                          f"position(s) of group {group!r}")  # fmt: skip
            return
        deleted = OffsetStore(schema=schema, group_id=group).delete(
            conn, forced=force, requested_by=requested_by(), lock_wait="30s"
        )
    console.print(f"deleted {len(deleted)} position(s) of group {group!r}; audit rows in "
                  f'"{schema}".{OFFSET_DELETIONS_TABLE}')  # fmt: skip
