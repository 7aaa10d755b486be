"""Where the tests' Kafka and PostgreSQL come from.

Order: an explicit external cluster from the environment > testcontainers when a Docker engine
answers > the local stack of real processes, started here and stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.acls import ROLES
from bridge.secrets import resolve_file_reference
from bridge_shell.stack import LocalStack
from bridge_shell.stack.kafka import KafkaServer
from bridge_shell.stack.postgres import PostgresServer, grant_table
from bridge_shell.stack.registry import RegistryServer
from bridge_shell.stack.secure import KAFKA_ADMIN, KAFKA_USERS, POSTGRES_CONSUMER

ENV_TEST_KAFKA = "BRIDGE_TEST_KAFKA_BOOTSTRAP"
ENV_TEST_DSN = "BRIDGE_TEST_POSTGRES_DSN"
ENV_TEST_REGISTRY = "BRIDGE_TEST_SCHEMA_REGISTRY_URL"
ENV_NO_DOCKER = "BRIDGE_TEST_NO_DOCKER"

KAFKA_IMAGE = "apache/kafka:4.1.1"
POSTGRES_IMAGE = "postgres:16"


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    """What every integration test needs. `kafka`/`postgres` are set only for the local stack,
    where fault-injection tests may stop, kill and restart the real processes."""

    bootstrap_servers: str
    dsn: str  # the superuser's
    origin: str
    kafka: KafkaServer | None = None
    postgres: PostgresServer | None = None
    # The schema registry's Confluent-compatible API, and on the local stack its process.
    registry_url: str | None = None
    registry: RegistryServer | None = None
    # Its client's settings beyond the URL (the CA that verifies it on the secured stack).
    registry_properties: Mapping[str, str] = field(default_factory=dict)
    # A secured stack (pytest --secure): its data directory, and each role's librdkafka
    # security settings with passwords as ${file:...} references ("admin" has every right).
    stack_dir: Path | None = None
    role_properties: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    consumer_dsn: str | None = None  # the consumer's (and the tools') role of least rights

    @property
    def secure(self) -> bool:
        return bool(self.role_properties)

    def properties(self, role: str = "admin", *, resolved: bool = True) -> dict[str, str]:
        """The Kafka security settings of `role` (empty on a plain stack); `resolved`: with the
        password itself, for a client made here, rather than the reference to its file."""
        found = dict(self.role_properties.get(role, {}))
        return {k: resolve_file_reference(v) for k, v in found.items()} if resolved else found

    def client(self, role: str = "admin", **overrides: Any) -> dict[str, Any]:
        """A librdkafka configuration for a client of `role`."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.properties(role), **overrides}

    def role_dsn(self, role: str = "consumer") -> str:
        """The DSN the consumer or the tools log in with: a role of least rights when secured."""
        return self.consumer_dsn if self.consumer_dsn and role != "admin" else self.dsn

    def let_consumer_write(
        self, table: str, *, upsert: bool = False, schema: str | None = None
    ) -> None:
        """On a secured stack, what an administrator grants the consumer's role for a route to
        `table`, and its own state `schema`; nothing to do on a plain stack."""
        if not self.secure:
            return
        grant_table(self.dsn, table, POSTGRES_CONSUMER, upsert=upsert, deletes=upsert)
        if schema is not None:
            import psycopg
            from psycopg import sql

            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                    sql.Identifier(schema), sql.Identifier(POSTGRES_CONSUMER)))  # fmt: skip


@contextmanager
def endpoints(*, secure: bool = False) -> Iterator[Endpoints]:
    """`secure`: the local stack with TLS, SCRAM and ACLs (only the local stack has that)."""
    if secure:
        with _local_stack(secure=True) as found:
            yield found
        return
    external = _external()
    if external is not None:
        yield external
    elif _docker_answers():
        with _containers() as found:
            yield found
    else:
        with _local_stack() as found:
            yield found


def _external() -> Endpoints | None:
    bootstrap, dsn = os.environ.get(ENV_TEST_KAFKA), os.environ.get(ENV_TEST_DSN)
    if bootstrap and dsn:
        registry = os.environ.get(ENV_TEST_REGISTRY)  # optional: the typed-record tests need it
        return Endpoints(
            bootstrap_servers=bootstrap, dsn=dsn, origin="external", registry_url=registry
        )
    if bootstrap or dsn:
        raise RuntimeError(f"set both {ENV_TEST_KAFKA} and {ENV_TEST_DSN}, or neither")
    return None


def _docker_answers() -> bool:
    if os.environ.get(ENV_NO_DOCKER):
        return False
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no engine, no socket, no permission: all mean "no"
        return False


@contextmanager
def _containers() -> Iterator[Endpoints]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs
    from testcontainers.postgres import PostgresContainer

    from bridge_shell.stack.process import free_port

    # The official image advertises the address we give it, so the host port is fixed up front.
    port = free_port()
    kafka = (
        DockerContainer(KAFKA_IMAGE)
        .with_bind_ports(9092, port)
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://127.0.0.1:{port}")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
    )
    with kafka, PostgresContainer(POSTGRES_IMAGE, driver=None) as postgres:
        wait_for_logs(kafka, "Kafka Server started", timeout=120)
        yield Endpoints(
            bootstrap_servers=f"127.0.0.1:{port}",
            dsn=postgres.get_connection_url(),
            origin="testcontainers",
        )


@contextmanager
def _local_stack(*, secure: bool = False) -> Iterator[Endpoints]:
    # Under /tmp rather than pytest's 0700 tmp root: when we run as root, PostgreSQL runs as
    # the `postgres` user, which must be able to enter its data directory's parents.
    data_dir = Path(tempfile.mkdtemp(prefix="bridge-test-stack-"))
    data_dir.chmod(0o755)
    stack = LocalStack(data_dir, secure=secure)
    try:
        stack.up(timeout=180)
        state = stack.state()
        security = stack.security(state)
        postgres = stack.postgres(state)
        roles: dict[str, dict[str, str]] = {}
        if security is not None:
            roles = {role: security.kafka_properties(KAFKA_USERS[role]) for role in ROLES}
            roles["admin"] = security.kafka_properties(KAFKA_ADMIN)
        registry = stack.registry(state)
        yield Endpoints(
            bootstrap_servers=stack.kafka(state).bootstrap_servers,
            dsn=postgres.dsn,
            registry_url=registry.url if registry else None,
            registry=registry,
            registry_properties=registry.client_properties() if registry else {},
            origin="secured local stack" if secure else "local stack",
            kafka=stack.kafka(state),
            postgres=postgres,
            stack_dir=data_dir if secure else None,
            role_properties=roles,
            consumer_dsn=postgres.role_dsn(POSTGRES_CONSUMER) if secure else None,
        )
    finally:
        stack.down()
        shutil.rmtree(data_dir, ignore_errors=True)
