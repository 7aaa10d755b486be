"""`bridge demo`: the whole pipeline once on the local stack, verified; non-zero on a mismatch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bridge.names import DEFAULT_STACK_DIR
from bridge_shell.cli.options import Brokers, Secure, SparkWorkers, StackDir, output_console


def demo(
    records: Annotated[
        int, typer.Option("--records", min=1, help="How many sample orders.")
    ] = 50_000,
    keep_stack: Annotated[
        bool, typer.Option("--keep-stack", help="Leave the stack running afterwards.")
    ] = False,
    value_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="json, or avro or json-schema: typed records through the stack's schema registry.",
        ),
    ] = "json",
    brokers: Brokers = None,
    spark_workers: SparkWorkers = None,
    secure: Secure = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
) -> None:
    """Sample orders through Spark, Kafka and the consumer into PostgreSQL; verify that every
    order id arrived exactly once; print the offsets and a summary."""
    from bridge.errors import ConfigError
    from bridge_shell.demo import DemoFailed, run_demo
    from bridge_shell.stack import LocalStack

    if value_format not in ("json", "avro", "json-schema"):
        raise ConfigError([("--format", f"{value_format!r} is not json, avro or json-schema")])
    console = output_console()
    stack = LocalStack(stack_dir, brokers=brokers, spark_workers=spark_workers, secure=secure)
    try:
        ok = run_demo(
            console,
            stack=stack,
            records=records,
            keep_stack=keep_stack,
            value_format=value_format,
        )
    except DemoFailed as exc:
        console.print(f"[bold red]demo failed:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    if not ok:
        raise typer.Exit(1)


def sample_orders(
    output: Annotated[Path, typer.Option("--output", help="Directory for the JSON-lines files.")],
    count: Annotated[int, typer.Option("--count", min=1, help="How many orders.")] = 50_000,
    files: Annotated[int, typer.Option("--files", min=1, help="Spread over this many files.")] = 10,
    run: Annotated[
        str, typer.Option("--run", help="Tags every order (`run_id`); seeds the values.")
    ] = "sample",
) -> None:
    """Write the demo's sample orders (unique `order_id`s from 0) as JSON-lines files: the
    input of the files source, for docker-compose and for trying the producer by hand."""
    from bridge_shell.demo import write_orders

    write_orders(output, run, count, files)
    output_console().print(f"{count} orders in {files} files under {output}")
