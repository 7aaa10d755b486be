"""Options that several commands share, declared once."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bridge.names import ENV_STACK_DIR

ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", envvar="BRIDGE_CONFIG", show_envvar=True, help="The YAML file."),
]
StackDir = Annotated[
    Path,
    typer.Option(
        "--stack-dir",
        envvar=ENV_STACK_DIR,
        show_envvar=True,
        help="A local stack whose stack.env fills in Kafka and PostgreSQL addresses.",
    ),
]


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"


OutputFormat = Annotated[
    Format, typer.Option("--format", help="table (for people) or json (for scripts).")
]


def output_console() -> Console:
    """Standard output for tables: on a pipe or in a log, as wide as a table needs (rich would
    wrap at 80 columns), on a terminal as wide as the terminal."""
    return Console(width=None if sys.stdout.isatty() else 200)
