"""`bridge txn show|abort`: a producer's committed epochs, and ending a lingering transaction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from bridge.errors import BridgeError
from bridge.kafka_admin import KafkaAdmin
from bridge.names import DEFAULT_MARKER_TOPIC, DEFAULT_STACK_DIR
from bridge.settings import load_settings, stack_env_files
from bridge_shell.cli.options import ConfigFile, Format, OutputFormat, StackDir, output_console

app = typer.Typer(help="The Spark producer's Kafka transactions: committed epochs, and aborts.")
console = output_console()

Prefix = Annotated[
    str, typer.Option("--prefix", help="The sink's transactional.id.prefix (bridge-<query id>).")
]
MarkerTopic = Annotated[str, typer.Option("--marker-topic", help="The sink's marker.topic.")]


@app.command()
def show(
    prefix: Prefix,
    marker_topic: MarkerTopic = DEFAULT_MARKER_TOPIC,
    output: OutputFormat = Format.TABLE,
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """The last epoch each Spark partition of the producer committed to Kafka."""
    from spark_jobs.txn_admin import committed_epochs

    settings = load_settings(config, env_file=stack_env_files(stack_dir, "tools"))
    epochs = committed_epochs(KafkaAdmin(settings.kafka.client_config()), prefix, marker_topic)
    if output is Format.JSON:
        print(json.dumps([
            {"partition": e.partition, "epoch": e.epoch, "details": dict(e.details),
             "problem": e.problem} for e in epochs
        ], indent=2))  # fmt: skip
        return
    table = Table(title=f"committed epochs of {prefix}")
    for name in ("spark partition", "committed epoch", "details"):
        table.add_column(name)
    for e in epochs:
        table.add_row(
            str(e.partition),
            "-" if e.epoch is None else str(e.epoch),
            e.problem or json.dumps(dict(e.details), sort_keys=True),
        )
    console.print(table)
    if not epochs:
        console.print(f"no epoch markers for prefix {prefix!r} on {marker_topic}")


@app.command()
def abort(
    prefix: Prefix,
    partitions: Annotated[
        str, typer.Option("--partitions", help="Spark partitions, comma-separated: 0,1,5.")
    ],
    epoch: Annotated[
        int | None,
        typer.Option(
            "--epoch",
            help="The epoch: required with per-epoch naming; with pooled, without it every id "
            "of each partition's pool is fenced.",
        ),
    ] = None,
    naming: Annotated[
        str,
        typer.Option("--naming", help="pooled, per-epoch or per-partition, as the sink's option."),
    ] = "pooled",
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Abort the open transaction of each id by fencing it: the broker aborts it, and a writer
    still holding the id fails instead of committing (Spark then retries its task)."""
    from spark_jobs.sink_options import IdNaming
    from spark_jobs.txn_admin import fence, transactional_ids

    try:
        id_naming = IdNaming(naming)
        numbers = sorted({int(p) for p in partitions.split(",") if p.strip()})
    except ValueError:
        raise BridgeError(
            f"--naming {naming!r} / --partitions {partitions!r}: expected pooled, per-epoch "
            "or per-partition, and partition numbers such as 0,1,5"
        ) from None
    if id_naming is IdNaming.PER_EPOCH and epoch is None:
        raise BridgeError("--epoch is required with per-epoch naming")
    settings = load_settings(config, env_file=stack_env_files(stack_dir, "tools"))
    for transactional_id in transactional_ids(prefix, numbers, epoch, id_naming):
        fence(settings.kafka.client_config(), transactional_id)
        console.print(f"fenced {transactional_id}: any open transaction of it is aborted")
