"""`bridge consume`: the long-running Kafka -> PostgreSQL consumer, or `--check` its plan."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bridge.names import DEFAULT_STACK_DIR
from bridge_shell.cli.options import ConfigFile, StackDir


def consume(
    config: ConfigFile = None,
    stack_dir: StackDir = Path(DEFAULT_STACK_DIR),
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Consume nothing: check the configuration, Kafka, PostgreSQL, the registry "
            "and each route's table; print each route's plan and every problem; exit 0 or 1.",
        ),
    ] = False,
) -> None:
    """Apply committed Kafka records to PostgreSQL, exactly once, until SIGTERM or SIGINT."""
    if check:
        _check(config, stack_dir)
        return
    from consumers import run_consumer

    run_consumer(config, stack_dir)


def _check(config: Path | None, stack_dir: Path) -> None:
    from bridge.errors import ConfigError
    from bridge.settings import load_settings, stack_env_files
    from consumers import Checked, check_routes

    try:
        settings = load_settings(config, env_file=stack_env_files(stack_dir, "consumer"))
    except ConfigError as exc:  # refused before anything is asked: all its problems at once
        found = Checked(problems=list(exc.problems))
    else:
        found = check_routes(settings)
    for plan in found.plans:
        typer.echo(plan)
    for where, what in found.problems:
        typer.echo(f"problem: {where}: {what}", err=True)
    if found.problems:
        typer.echo(f"{len(found.problems)} problem(s): the consumer would not run as configured",
                   err=True)  # fmt: skip
        raise typer.Exit(1)
    typer.echo("no problems: the consumer can run as configured")
