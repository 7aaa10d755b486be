"""`bridge topics create`: a topic for the pipeline, with the same settings and security as the
other commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bridge.errors import ConfigError
from bridge.kafka_admin import KafkaAdmin
from bridge.names import DEFAULT_STACK_DIR
from bridge.settings import load_settings, stack_env_files
from bridge_shell.cli.options import ConfigFile, StackDir, output_console

app = typer.Typer(help="Kafka topics for the pipeline.")
console = output_console()


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="The topic's name.")],
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="At least the consumer members you run.")
    ] = 1,
    replication_factor: Annotated[
        int,
        typer.Option(
            "--replication-factor",
            min=-1,
            help="-1: the cluster's default.replication.factor. In production 3, with "
            "--topic-config min.insync.replicas=2 (docs/deploy.md).",
        ),
    ] = -1,
    topic_config: Annotated[
        list[str] | None,
        typer.Option(
            "--topic-config",
            help="A topic setting as KEY=VALUE, e.g. min.insync.replicas=2; repeat for more.",
        ),
    ] = None,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Create a topic (a topic that exists already is left as it is, and said so)."""
    entries = {}
    problems = []
    for entry in topic_config or []:
        key, equals, value = entry.partition("=")
        if not equals or not key.strip():
            problems.append(("--topic-config", f"{entry!r} is not KEY=VALUE"))
        entries[key.strip()] = value.strip()
    if problems:
        raise ConfigError(problems, source="bridge topics create")
    settings = load_settings(config, env_file=stack_env_files(stack_dir, "tools"))
    admin = KafkaAdmin(settings.kafka.client_config())
    created = admin.create_topic(
        name,
        partitions=partitions,
        replication_factor=replication_factor,
        topic_config=entries,
    )
    if created:
        console.print(f"created topic {name} with {partitions} partitions")
    else:
        found = admin.partitions(name)
        console.print(f"topic {name} exists already, with {len(found)} partitions: left as it is")
