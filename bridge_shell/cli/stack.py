"""`bridge stack prepare|up|down|status`: the local stack of real Kafka and PostgreSQL processes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from bridge.errors import ConfigError
from bridge.names import DEFAULT_STACK_DIR, ENV_STACK_DIR
from bridge_shell.cli.options import Brokers, Secure, SparkWorkers

# Each command imports the stack's modules itself: every `bridge` command, `bridge produce`
# among them, imports this module as it starts, and they cost a tenth of a second.
if TYPE_CHECKING:
    from bridge_shell.stack import StackStatus

app = typer.Typer(
    help="A local stack: Apache Kafka (KRaft), PostgreSQL and optionally a Spark standalone "
    "cluster, on loopback."
)
console = Console()

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar=ENV_STACK_DIR,
        show_envvar=True,
        help="Where the servers keep their data, logs and stack.env.",
    ),
]


@app.command()
def prepare() -> None:
    """Resolve the Kafka jars from Maven Central and find the PostgreSQL server; start nothing."""
    from bridge_shell.stack import LocalStack

    LocalStack.prepare()
    console.print("stack prepared: Kafka jars resolved, PostgreSQL server found")


@app.command()
def up(
    data_dir: DataDir = Path(DEFAULT_STACK_DIR),
    kafka_port: Annotated[
        int | None, typer.Option(help="Kafka's port; a free one when not given.")
    ] = None,
    postgres_port: Annotated[
        int | None, typer.Option(help="PostgreSQL's port; a free one when not given.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for both servers.")] = 120.0,
    brokers: Brokers = None,
    spark_workers: SparkWorkers = None,
    secure: Secure = None,
    postgres_standby: Annotated[
        str | None,
        typer.Option(
            help="A new plain stack with a streaming standby of PostgreSQL, replicated `sync` "
            "or `async`; stack.env then names both servers with "
            "target_session_attrs=read-write, so clients follow a promotion. An existing "
            "stack keeps what it was made with.",
        ),
    ] = None,
) -> None:
    """Start Kafka and PostgreSQL, and a Spark cluster if asked (or leave them running), and
    write stack.env (and, on a secured stack, one env file per role beside it)."""
    from bridge_shell.stack import LocalStack

    stack = LocalStack(
        data_dir,
        kafka_port=kafka_port,
        postgres_port=postgres_port,
        brokers=brokers,
        spark_workers=spark_workers,
        secure=secure,
        postgres_standby=postgres_standby,
    )
    status = stack.up(timeout=timeout)
    _show(status)
    console.print(f"environment for clients: {stack.env_path}")
    if status.secure:
        console.print(
            "secured: each role's credentials in stack.<role>.env beside it (producer, "
            f"consumer, tools, admin); passwords in {stack.data_dir / 'secrets'}, the CA in "
            f"{stack.data_dir / 'tls' / 'ca.pem'}"
        )


@app.command()
def down(data_dir: DataDir = Path(DEFAULT_STACK_DIR)) -> None:
    """Stop both servers; their data stays in the data directory."""
    from bridge_shell.stack import LocalStack

    _show(LocalStack(data_dir).down())


@app.command()
def status(data_dir: DataDir = Path(DEFAULT_STACK_DIR)) -> None:
    """Say what runs where. Exits 1 when a server is down."""
    from bridge_shell.stack import LocalStack

    current = LocalStack(data_dir).status()
    _show(current)
    if not current.running:
        raise typer.Exit(1)


def _show(status: StackStatus) -> None:
    table = Table(title=f"stack in {status.data_dir}")
    for column in ("server", "state", "pid", "address"):
        table.add_column(column)
    servers: list[tuple[str, bool, int | None, str | None]] = [
        (f"kafka node {n.node_id}", n.running, n.pid, n.address) for n in status.kafka_nodes
    ] or [("kafka", status.kafka_running, status.kafka_pid, status.bootstrap_servers)]
    servers.append(("postgres", status.postgres_running, status.postgres_pid, status.dsn))
    standby = status.postgres_standby
    if standby is not None:
        servers.append(("postgres standby", standby.running, standby.pid, standby.address))
    servers.append(
        ("schema registry", status.registry_running, status.registry_pid, status.registry_url)
    )
    servers += [
        ("spark master" if d.node_id == 0 else f"spark worker {d.node_id}", d.running, d.pid,
         status.spark_master if d.node_id == 0 else d.address)
        for d in status.spark_daemons
    ]  # fmt: skip
    for name, running, pid, address in servers:
        state = "[green]running[/]" if running else "[red]stopped[/]"
        table.add_row(name, state, str(pid) if running else "-", address or "-")
    console.print(table)


CredentialsDir = Annotated[
    Path,
    typer.Option("--dir", help="The secured compose stack's credentials (its `secure` volume)."),
]


@app.command()
def credentials(
    directory: CredentialsDir = Path("/secure"),
    kafka_host: Annotated[str, typer.Option(help="The broker's host name.")] = "kafka",
    postgres_host: Annotated[str, typer.Option(help="PostgreSQL's host name.")] = "postgres",
    owner: Annotated[
        str | None, typer.Option(help="UID:GID to own the files (the containers' user).")
    ] = None,
    postgres_gid: Annotated[
        int | None, typer.Option(help="The postgres image's group, to read its key and init.")
    ] = None,
) -> None:
    """The secured compose stack's CA, certificates, passwords and first-start files
    (docker-compose.secure.yml runs this once); kept as they are on a second run."""
    from bridge_shell.stack.compose_credentials import Ownership, write_compose_credentials

    uid_gid = None
    if owner is not None:
        uid, _, gid = owner.partition(":")
        try:
            uid_gid = (int(uid), int(gid or uid))
        except ValueError:
            raise ConfigError(
                [("--owner", f"{owner!r} is not UID:GID")], source="the command line"
            ) from None
    write_compose_credentials(
        directory,
        kafka_host=kafka_host,
        postgres_host=postgres_host,
        ownership=Ownership(owner=uid_gid, postgres_gid=postgres_gid),
    )
    console.print(f"credentials in {directory}: CA {directory / 'tls' / 'ca.pem'}")


@app.command()
def grant(
    directory: CredentialsDir = Path("/secure"),
    bootstrap_servers: Annotated[str, typer.Option(help="The broker.")] = "kafka:9092",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the broker.")] = 60.0,
    topics: Annotated[
        list[str] | None, typer.Option("--topic", help="A topic to create first (repeatable).")
    ] = None,
    partitions: Annotated[int, typer.Option(help="Partitions of each new topic.")] = 3,
) -> None:
    """Create the pipeline's topics and grant each role's ACLs (README, Security) to its
    principal, as the admin principal of the credentials in --dir: the secured compose
    stack's step once its broker is up. Both are kept as they are when they exist."""
    from bridge.kafka_admin import create_topic
    from bridge_shell.stack.secure import KAFKA_USERS, StackSecurity

    if not (directory / "secrets").is_dir():
        raise ConfigError(
            [("--dir", f"{directory} holds no credentials: run `bridge stack credentials` first")],
            source="the command line",
        )
    security = StackSecurity(directory)
    admin = security.admin_config(bootstrap_servers)
    for topic in topics or []:
        create_topic(bootstrap_servers, topic, partitions=partitions, timeout=timeout,
                     config=admin)  # fmt: skip
    security.grant_roles(bootstrap_servers, timeout=timeout)
    console.print(f"ACLs granted to the {', '.join(KAFKA_USERS.values())} principals")
