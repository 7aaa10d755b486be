"""Where the tests' Kafka and PostgreSQL come from.

Order: an explicit external cluster from the environment > testcontainers when a Docker engine
answers > the local stack of real processes, started here and stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bridge.stack import LocalStack
from bridge.stack.kafka import KafkaServer
from bridge.stack.postgres import PostgresServer

ENV_TEST_KAFKA = "BRIDGE_TEST_KAFKA_BOOTSTRAP"
ENV_TEST_DSN = "BRIDGE_TEST_POSTGRES_DSN"
ENV_NO_DOCKER = "BRIDGE_TEST_NO_DOCKER"

KAFKA_IMAGE = "apache/kafka:4.1.1"
POSTGRES_IMAGE = "postgres:16"


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    """What every integration test needs. `kafka`/`postgres` are set only for the local stack,
    where fault-injection tests may stop, kill and restart the real processes."""

    bootstrap_servers: str
    dsn: str
    origin: str
    kafka: KafkaServer | None = None
    postgres: PostgresServer | None = None


@contextmanager
def endpoints() -> Iterator[Endpoints]:
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
        return Endpoints(bootstrap_servers=bootstrap, dsn=dsn, origin="external")
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

    from bridge.stack.process import free_port

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
def _local_stack() -> Iterator[Endpoints]:
    # Under /tmp rather than pytest's 0700 tmp root: when we run as root, PostgreSQL runs as
    # the `postgres` user, which must be able to enter its data directory's parents.
    data_dir = Path(tempfile.mkdtemp(prefix="bridge-test-stack-"))
    data_dir.chmod(0o755)
    stack = LocalStack(data_dir)
    try:
        stack.up(timeout=180)
        state = stack.state()
        yield Endpoints(
            bootstrap_servers=stack.kafka(state).bootstrap_servers,
            dsn=stack.postgres(state).dsn,
            origin="local stack",
            kafka=stack.kafka(state),
            postgres=stack.postgres(state),
        )
    finally:
        stack.down()
        shutil.rmtree(data_dir, ignore_errors=True)
