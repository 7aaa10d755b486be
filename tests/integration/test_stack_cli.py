"""`bridge stack up|status|down` as a user runs it: real processes, a client reading stack.env."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from confluent_kafka.schema_registry import SchemaRegistryClient

from bridge.kafka_admin import create_topic
from bridge.settings import load_settings
from bridge_shell.stack import LocalStack, process
from bridge_shell.stack.process import alive
from tests.cli import run_bridge
from tests.consumer_helpers import eventually
from tests.kafka_helpers import read_all, transactional_producer

pytestmark = pytest.mark.slow


def bridge(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bridge(*args)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bridge-test-cli-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        LocalStack(path).down()
        shutil.rmtree(path, ignore_errors=True)


def test_up_serves_transactions_and_down_leaves_nothing(data_dir: Path) -> None:
    first = bridge("stack", "up", "--data-dir", str(data_dir))
    assert first.returncode == 0, first.stderr
    env_file = data_dir / "stack.env"
    settings = load_settings(env_file=env_file)

    # An independent client, configured only by stack.env.
    bootstrap = settings.kafka.bootstrap_servers
    create_topic(bootstrap, "smoke")
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    producer.produce("smoke", value=b"hello")
    producer.commit_transaction(30)
    assert read_all(bootstrap, "smoke") == [b"hello"]
    with psycopg.connect(settings.postgres.dsn.get_secret_value()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert settings.schema_registry is not None
    with SchemaRegistryClient(settings.schema_registry.client_config()) as registry:
        assert registry.get_subjects() == []

    stack = LocalStack(data_dir)
    before = stack.status()
    again = bridge("stack", "up", "--data-dir", str(data_dir))
    assert again.returncode == 0, again.stderr
    after = stack.status()
    assert (after.kafka_pid, after.postgres_pid, after.registry_pid) == (
        before.kafka_pid,
        before.postgres_pid,
        before.registry_pid,
    )
    assert bridge("stack", "status", "--data-dir", str(data_dir)).returncode == 0

    down = bridge("stack", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stderr
    assert before.kafka_pid is not None and before.postgres_pid is not None
    assert before.registry_pid is not None
    assert not alive(before.kafka_pid, str(data_dir))
    assert not alive(before.postgres_pid, str(data_dir))
    assert not alive(before.registry_pid, str(data_dir))
    assert not _processes_mentioning(data_dir)
    assert not env_file.exists()
    assert bridge("stack", "status", "--data-dir", str(data_dir)).returncode == 1


def test_restart_keeps_addresses_and_data(data_dir: Path) -> None:
    stack = LocalStack(data_dir)
    stack.up()
    state = stack.state()
    dsn = stack.postgres(state).dsn
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    stack.down()
    stack.up()
    assert stack.state() == state
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(7,)]


def test_taken_port_is_refused_clearly(data_dir: Path) -> None:
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = bridge("stack", "up", "--data-dir", str(data_dir), "--postgres-port", str(port))
    assert result.returncode == 2
    assert f"port {port}" in result.stderr
    assert not _processes_mentioning(data_dir)


def _processes_mentioning(path: Path) -> list[int]:
    return process.processes(command_has=str(path))


@pytest.mark.secured
@pytest.mark.heavy
def test_demo_verifies_every_order_exactly_once_and_stops_its_stack(
    data_dir: Path, secure: bool
) -> None:
    """`bridge demo --format avro`: the orders as typed records through the stack's schema
    registry (the JSON demo runs on the cluster below). With pytest --secure, `bridge demo
    --secure`: the same pipeline with every component under its own principal and role, the
    registry over HTTPS, and no password anywhere but in the secrets directory."""
    extra = ("--secure", "--format", "avro") if secure else ("--format", "avro")
    result = bridge("demo", "--records", "3000", "--stack-dir", str(data_dir), *extra)
    output = " ".join(result.stdout.split())  # rich wraps long lines
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exactly once: 3,000 orders sent, 3,000 rows in public.demo_orders" in output
    assert "3,000 distinct ids, 0 missing, 0 duplicated, 0 dead letters" in output
    assert "offsets of group demo-" in output
    assert "as Avro registered in the schema registry" in output
    assert not _processes_mentioning(data_dir), "the demo stops the stack it started"
    if secure:
        _assert_no_password_outside_secrets(data_dir, result.stdout + result.stderr)


def _assert_no_password_outside_secrets(data_dir: Path, output: str) -> None:
    """Every password the stack made, searched for in the run's output and in every file it
    left (logs of Kafka, PostgreSQL, Spark and the consumer, configurations, checkpoints)."""
    secrets_dir = data_dir / "secrets"
    passwords = {p.name: p.read_text().strip() for p in secrets_dir.glob("*.password")}
    assert len(passwords) >= 6, f"the secured stack made too few passwords: {sorted(passwords)}"
    searched, found = 0, []
    for path in data_dir.rglob("*"):
        if not path.is_file() or secrets_dir in path.parents:
            continue
        content = path.read_bytes()
        searched += 1
        found += [f"{name} in {path}" for name, pw in passwords.items() if pw.encode() in content]
    found += [f"{name} in the output" for name, pw in passwords.items() if pw in output]
    assert not found, found
    assert searched > 20, f"only {searched} files to search: the logs are elsewhere"


@pytest.mark.heavy
def test_a_three_node_cluster_replicates_and_rides_out_a_lost_node(data_dir: Path) -> None:
    """`--brokers 3`: three KRaft nodes, topics and the transaction log with three replicas and
    two in sync; with one node SIGKILLed, transactions still commit and read back."""
    started = bridge("stack", "up", "--data-dir", str(data_dir), "--brokers", "3")
    assert started.returncode == 0, started.stdout + started.stderr
    for node in (1, 2, 3):
        assert f"kafka node {node}" in started.stdout, started.stdout
    settings = load_settings(env_file=data_dir / "stack.env")
    bootstrap = settings.kafka.bootstrap_servers
    assert len(bootstrap.split(",")) == 3

    create_topic(bootstrap, "replicated", partitions=3)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # The controller acknowledges the topic before every broker's metadata cache holds it; the
    # broker this metadata request reaches may still answer without it.
    eventually(lambda: "replicated" in admin.list_topics(timeout=10).topics, timeout=30)
    topics = admin.list_topics(timeout=10).topics
    assert len(admin.list_topics(timeout=10).brokers) == 3
    assert {len(p.replicas) for p in topics["replicated"].partitions.values()} == {3}
    config = ConfigResource(ConfigResource.Type.TOPIC, "replicated")
    described = admin.describe_configs([config])[config].result(30)
    assert described["min.insync.replicas"].value == "2"

    def commit(values: list[bytes]) -> None:
        producer = transactional_producer(bootstrap)
        producer.begin_transaction()
        for value in values:
            producer.produce("replicated", value)
        producer.commit_transaction(60)

    commit([b"before"])
    state = json.loads((data_dir / "stack.json").read_text())
    LocalStack(data_dir).kafka_nodes(LocalStack(data_dir).state())[2].kill()  # node 3
    commit([b"after"])  # two of three in sync: still accepted
    # Right after the failover a partition's new leader may report a high watermark that still
    # trails its log until the followers fetch again, and a reader stops at that end: read
    # until both records are there, bounded.
    eventually(
        lambda: (
            sorted(read_all(bootstrap, "replicated", partitions=3, timeout=60))
            == [b"after", b"before"]
        ),
        timeout=90,
    )
    assert len(state["extra_nodes"]) == 2

    status = bridge("stack", "status", "--data-dir", str(data_dir))
    assert status.returncode == 1 and "stopped" in status.stdout, status.stdout
    refused = bridge("stack", "up", "--data-dir", str(data_dir), "--brokers", "1")
    assert refused.returncode != 0 and "3 Kafka node(s)" in refused.stdout + refused.stderr

    assert bridge("stack", "down", "--data-dir", str(data_dir)).returncode == 0
    nodes = LocalStack(data_dir).kafka_nodes(LocalStack(data_dir).state())
    assert not any(node.running() for node in nodes)


@pytest.mark.heavy
def test_demo_runs_on_a_kafka_cluster_and_a_spark_cluster_and_stops_both(data_dir: Path) -> None:
    """`bridge demo --brokers 3 --spark-workers 2`: the same verified pipeline with the producer
    on a Spark standalone cluster (a master and two worker JVMs) and three Kafka nodes."""
    result = bridge(
        "demo", "--records", "3000", "--brokers", "3", "--spark-workers", "2",
        "--stack-dir", str(data_dir),
    )  # fmt: skip
    output = " ".join(result.stdout.split())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(3 nodes)" in output and "(2 workers)" in output, output
    assert "3,000 distinct ids, 0 missing, 0 duplicated, 0 dead letters" in output
    # The write tasks ran in executors the workers started, not in the driver.
    logs = [path.read_text() for path in data_dir.glob("spark/worker-*/work/app-*/*/stderr")]
    assert any("Committed partition" in log for log in logs), "no executor wrote"
    assert not _processes_mentioning(data_dir), "the demo stops the stack it started"


def test_a_stack_with_a_postgres_standby_streams_to_it_and_its_dsn_follows_a_promotion(
    data_dir: Path,
) -> None:
    up = bridge("stack", "up", "--data-dir", str(data_dir), "--postgres-standby", "sync")
    assert up.returncode == 0, up.stderr
    stack = LocalStack(data_dir)
    state = stack.state()
    primary, standby = stack.postgres(state), stack.postgres_standby(state)
    assert standby is not None and standby.is_standby
    assert primary.replication() == [("streaming", "sync")]
    dsn = load_settings(env_file=data_dir / "stack.env").postgres.dsn.get_secret_value()
    assert "target_session_attrs=read-write" in dsn and f":{standby.port}" in dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (7)")  # synchronous: on the standby when it returns
    primary.kill()
    standby.promote()
    with psycopg.connect(dsn, autocommit=True) as conn:  # the same DSN, now the standby's
        assert conn.execute("SELECT x FROM kept").fetchall() == [(7,)]
        conn.execute("INSERT INTO kept VALUES (8)")
    shown = bridge("stack", "status", "--data-dir", str(data_dir))
    assert "postgres standby" in shown.stdout and "promoted" in shown.stdout, shown.stdout
    assert bridge("stack", "down", "--data-dir", str(data_dir)).returncode == 0
    assert not _processes_mentioning(data_dir)
