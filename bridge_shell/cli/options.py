"""Options that several commands share, declared once."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from bridge.errors import BridgeError, ConfigError
from bridge.names import DEFAULT_STATE_SCHEMA, ENV_STACK_DIR
from bridge.settings import BridgeSettings, load_settings, schema_name, stack_env_files

if TYPE_CHECKING:  # imported where used: every `bridge` command imports this module
    import psycopg

Brokers = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=9,
        help="Kafka nodes of a new stack: 1 (the default), or 3 and more for a replicated "
        "cluster (3 replicas, 2 in sync). An existing stack keeps its count.",
    ),
]
Secure = Annotated[
    bool | None,
    typer.Option(
        "--secure/--plain",
        help="A new stack with TLS, SASL/SCRAM and ACLs on Kafka and TLS with SCRAM on "
        "PostgreSQL, a principal of least rights per role (README: Security). Default: a new "
        "stack is plain, an existing one keeps what it was made with.",
        show_default=False,
    ),
]
SparkWorkers = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=8,
        help="Spark standalone workers, with their master (stack.env gains its URL, and the "
        "producer runs there); 0 for none. Default: a new stack has none, an existing one keeps "
        "its own.",
    ),
]
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


Group = Annotated[
    str | None,
    typer.Option("--group", help="The consumer group; the configuration's consumer.group_id."),
]
Schema = Annotated[
    str | None,
    typer.Option("--schema", help="The state schema; the configuration's consumer.state_schema."),
]


def tools_settings(config: Path | None, stack_dir: Path) -> BridgeSettings:
    """The settings an operator's command runs with: the file, the environment, and the
    stack's files for the tools' principal."""
    return load_settings(config, env_file=stack_env_files(stack_dir, "tools"))


def connect_postgres(settings: BridgeSettings) -> psycopg.Connection[Any]:
    import psycopg

    try:
        return psycopg.connect(settings.postgres.dsn.get_secret_value(), autocommit=True)
    except psycopg.OperationalError as exc:
        raise BridgeError(f"cannot reach PostgreSQL: {str(exc).strip()}") from None


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


def state_schema(settings: BridgeSettings, schema: str | None) -> str:
    """The consumer's state schema: `--schema` if given (refused unless it is a plain name,
    as the configuration's is), else the configuration's, else the default."""
    if schema is not None:
        try:
            return schema_name(schema)
        except ValueError as exc:
            raise ConfigError([("--schema", str(exc))], source="the command line") from None
    return settings.consumer.state_schema if settings.consumer else DEFAULT_STATE_SCHEMA


def group_of(settings: BridgeSettings, group: str | None) -> str:
    """`--group`, else the configuration's consumer.group_id."""
    if group is not None:
        return group
    if settings.consumer is None:
        raise BridgeError("--group is required (or a configuration with consumer.group_id)")
    return settings.consumer.group_id


def requested_by() -> str:
    """Who runs an operator's command, for its audit rows: user@host."""
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"
