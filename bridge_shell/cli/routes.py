"""`bridge routes from-connect FILE`: a Kafka Connect JDBC sink's configuration as routes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from bridge_shell.connect_config import SECRETS_DIR, read_connect_config, translate

app = typer.Typer(help="Consumer routes.")


@app.command(name="from-connect")
def from_connect(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, help="A .properties file, or the JSON of Connect's API."
        ),
    ],
    secrets_dir: Annotated[
        Path,
        typer.Option(
            "--secrets-dir",
            help="Where the output's `${file:...}` secrets are kept (the database's DSN, the "
            "registry's user:password).",
        ),
    ] = SECRETS_DIR,
) -> None:
    """Print the consumer configuration a Kafka Connect JDBC sink configuration translates to
    (YAML, for bridge's configuration file); what cannot be translated is refused, every key
    at once; notes go to stderr."""
    translated = translate(read_connect_config(file), secrets_dir=secrets_dir)
    for note in translated.notes:
        print(f"note: {note}", file=sys.stderr)
    print(translated.yaml(), end="")
