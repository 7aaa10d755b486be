"""Options that several commands share, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", envvar="BRIDGE_CONFIG", show_envvar=True, help="The YAML file."),
]
StackDir = Annotated[
    Path,
    typer.Option(
        "--stack-dir",
        envvar="BRIDGE_STACK_DIR",
        show_envvar=True,
        help="A local stack whose stack.env fills in Kafka and PostgreSQL addresses.",
    ),
]
