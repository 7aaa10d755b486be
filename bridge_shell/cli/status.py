"""`bridge status`: is the pipeline healthy? One screen, or JSON; exit 1 when it is not."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from bridge.names import (
    DEFAULT_MARKER_TOPIC,
    DEFAULT_STACK_DIR,
)
from bridge.settings import load_settings, stack_env_files
from bridge_shell.cli.options import (
    ConfigFile,
    Format,
    OutputFormat,
    StackDir,
    output_console,
    state_schema,
)

if TYPE_CHECKING:
    from bridge_shell.status import Status


def status(
    consumer: Annotated[
        list[str] | None,
        typer.Option(
            "--consumer",
            help="A consumer's HTTP address (http://host:port) to ask /readyz; repeatable. "
            "Default: the configuration's consumer.http_port on this host, if set.",
        ),
    ] = None,
    prefix: Annotated[
        list[str] | None,
        typer.Option(
            "--prefix", help="A producer's transactional.id prefix; repeatable. Default: all."
        ),
    ] = None,
    schema: Annotated[
        str | None,
        typer.Option("--schema", help="The state schema; the configuration's, or 'bridge'."),
    ] = None,
    stall_after: Annotated[
        float,
        typer.Option(
            "--stall-after",
            min=0,
            help="A partition behind with nothing committed for this many seconds is stalled.",
        ),
    ] = 60.0,
    marker_topic: Annotated[
        str, typer.Option("--marker-topic", help="The sink's marker.topic.")
    ] = DEFAULT_MARKER_TOPIC,
    group: Annotated[
        list[str] | None,
        typer.Option("--group", help="Only this consumer group is shown and judged; repeatable."),
    ] = None,
    ignore_idle_after: Annotated[
        float | None,
        typer.Option(
            "--ignore-idle-after",
            min=0,
            help="A group with nothing committed for this many seconds is shown as idle and "
            "not judged (an abandoned group; `bridge offsets delete` removes it).",
        ),
    ] = None,
    output: OutputFormat = Format.TABLE,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Each component's health (brokers, PostgreSQL, the schema registry, consumers' /readyz),
    each consumer group's lag and stalled partitions, each producer's last committed epoch per
    Spark partition. Exits 1 when anything is wrong, so that it can serve as a probe."""
    from bridge_shell.status import gather

    settings = load_settings(config, env_file=stack_env_files(stack_dir, "tools"))
    consumers = list(consumer or [])
    if not consumers and settings.consumer is not None and settings.consumer.http_port:
        consumers = [f"http://127.0.0.1:{settings.consumer.http_port}"]
    schema = state_schema(settings, schema)
    found = gather(
        kafka_config=settings.kafka.client_config(),
        dsn=settings.postgres.dsn.get_secret_value(),
        schema=schema,
        consumers=consumers,
        prefixes=list(prefix) if prefix else None,
        marker_topic=marker_topic,
        stall_after=timedelta(seconds=stall_after),
        whole_topic=settings.consumer.whole_topic if settings.consumer else lambda topic: True,
        groups=list(group) if group else None,
        idle_after=None if ignore_idle_after is None else timedelta(seconds=ignore_idle_after),
        registry=settings.schema_registry.client_config() if settings.schema_registry else None,
    )
    if output is Format.JSON:
        print(json.dumps(found.as_json(), indent=2))
    else:
        _render(found)
    if found.problems:
        raise typer.Exit(1)


def _render(found: Status) -> None:
    console = output_console()
    parts = Table(title="components")
    for name in ("component", "health", "detail"):
        parts.add_column(name)
    for c in found.components:
        parts.add_row(c.name, "[green]ok[/]" if c.ok else "[bold red]down[/]", c.detail)
    console.print(parts)
    if found.groups:
        groups = Table(title="consumer groups")
        for name in ("group", "partitions", "lag", "stalled"):
            groups.add_column(name)
        for g in found.groups:
            groups.add_row(
                g.group,
                str(g.partitions),
                "?" if g.lag is None else str(g.lag),
                f"[dim]idle for {g.idle_s:.0f}s: not judged[/]"
                if g.idle_s is not None
                else "\n".join(f"[bold red]{s}[/]" for s in g.stalled) or "[green]none[/]",
            )
        console.print(groups)
    if found.producers:
        producers = Table(title="producers: last committed epoch per Spark partition")
        for name in ("prefix", "epochs"):
            producers.add_column(name)
        for p in found.producers:
            epochs = ", ".join(
                f"p{e.partition}: {'-' if e.epoch is None else e.epoch}"
                + (f" [bold red]({e.problem})[/]" if e.problem else "")
                for e in p.epochs
            )
            producers.add_row(p.prefix, epochs or "-")
        console.print(producers)
    if found.problems:
        console.print(f"[bold red]{len(found.problems)} problem(s)[/]")
    else:
        console.print("[green]healthy[/]")
