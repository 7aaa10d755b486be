"""The `bridge` command line. Each group of commands lives in a module of its own."""

from __future__ import annotations

import sys
from importlib.metadata import version as package_version

import typer
from rich.console import Console

from bridge.errors import BridgeError
from bridge_shell.cli import (
    consume,
    dead_letters,
    demo,
    epochs,
    offsets,
    produce,
    routes,
    stack,
    status,
    topics,
    txn,
)

app = typer.Typer(
    name="bridge",
    help="Exactly-once pipeline from Apache Spark, through Apache Kafka, into PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(stack.app, name="stack")
app.add_typer(offsets.app, name="offsets")
app.add_typer(epochs.app, name="epochs")
app.add_typer(dead_letters.app, name="dead-letters")
app.add_typer(txn.app, name="txn")
app.add_typer(topics.app, name="topics")
app.add_typer(routes.app, name="routes")
app.command()(produce.produce)
app.command(name="executor-env")(produce.executor_env)
app.command(name="executor")(produce.executor)
app.command()(consume.consume)
app.command()(demo.demo)
app.command(name="sample-orders")(demo.sample_orders)
app.command()(status.status)


def _version(shown: bool) -> None:
    if shown:
        typer.echo(f"bridge {package_version('bridge')}")
        raise typer.Exit


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
) -> None:
    """Exactly-once pipeline from Apache Spark, through Apache Kafka, into PostgreSQL."""


def main() -> None:
    """Entry point of the console script: refusals are one clear line, not a traceback."""
    try:
        app()
    except BridgeError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)
