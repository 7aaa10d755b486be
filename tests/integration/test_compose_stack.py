"""docker-compose.yml, proven without a Docker engine: loaded by compose-go (what Docker Compose
loads files with), then each of its pipeline services run as the command, environment and
mounted files it gives, against the local stack, in its dependency order, with the demo's
result: every sample order in PostgreSQL exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bridge.secrets import resolve_file_reference
from bridge_shell.maven import java_binary
from bridge_shell.stack.kafka import resolve_kafka_libs
from bridge_shell.stack.postgres import consumer_role_statements
from bridge_shell.stack.process import free_port
from bridge_shell.stack.secure import KAFKA_USERS, StackSecurity
from tests.cli import run_bridge
from tests.consumer_helpers import eventually
from tests.harness import Endpoints
from tests.kafka_helpers import read_all, transactional_producer

pytestmark = pytest.mark.slow
# The services run as written bind the compose file's fixed ports (the consumer's 9464, the
# producer's 9465): the plain and the secured run never overlap (`make test` runs its two
# passes side by side; tests/heavy_slots.py).
COMPOSE_PORTS = "compose-ports"

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SECURE_OVERLAY = ROOT / "docker-compose.secure.yml"
ENSURE = ROOT / "scripts" / "ensure-composecheck.sh"


def test_compose_go_loads_the_file_and_its_specification_holds() -> None:
    built = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.fail(f"composecheck unavailable ({built.stderr.strip()}); run `make setup`")
    binary = built.stdout.strip().splitlines()[-1]
    loaded = subprocess.run([binary, str(COMPOSE)], capture_output=True, text=True, check=False)
    assert loaded.returncode == 0, loaded.stderr
    project = json.loads(loaded.stdout)
    assert set(project["services"]) == {
        "kafka", "postgres", "schema-registry", "sample-data", "producer", "consumer",
        "prometheus", "grafana",
    }  # fmt: skip
    registry = project["services"]["schema-registry"]
    assert registry["depends_on"]["postgres"]["condition"] == "service_healthy"
    consumer = project["services"]["consumer"]
    assert consumer["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_compose_go_refuses_a_file_that_breaks_the_specification(tmp_path: Path) -> None:
    """The check above can fail: a service key the specification does not know is refused."""
    built = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, check=True)
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["consumer"]["healthchek"] = broken["services"]["consumer"]["healthcheck"]
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    loaded = subprocess.run(
        [built.stdout.strip().splitlines()[-1], str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert loaded.returncode != 0 and "healthchek" in loaded.stderr, loaded.stderr


def test_the_secure_overlay_merges_over_the_base_with_no_secret_in_it() -> None:
    project = _load(COMPOSE, SECURE_OVERLAY)
    services = project["services"]
    assert {"credentials", "acls"} <= set(services)
    for name in ("kafka", "postgres"):
        assert services[name]["depends_on"]["credentials"]["condition"] == (
            "service_completed_successfully"
        )
    for name in ("producer", "consumer"):
        assert services[name]["depends_on"]["acls"]["condition"] == (
            "service_completed_successfully"
        )
        properties = json.loads(services[name]["environment"]["BRIDGE_KAFKA__PROPERTIES"])
        assert properties["security.protocol"] == "SASL_SSL"
        assert properties["sasl.password"].startswith("${file:/secure/secrets/")
    assert "BRIDGE_POSTGRES__DSN" not in services["producer"]["environment"]
    dsn = conninfo_to_dict(services["consumer"]["environment"]["BRIDGE_POSTGRES__DSN"])
    assert dsn["sslmode"] == "verify-full" and "password" not in dsn
    assert "POSTGRES_PASSWORD" not in services["postgres"]["environment"]  # only its _FILE
    for service in services.values():
        for volume in service.get("volumes", []):
            source, _ = _volume(volume)
            if source.startswith(f"{ROOT}/"):
                assert Path(source).exists(), f"a mount of a missing {source}"


def test_the_overlays_credentials_start_a_secured_broker_its_acls_service_grants(
    tmp_path: Path,
) -> None:
    """What the overlay's kafka service runs, on this machine: `bridge stack credentials` as
    the credentials service runs it, the storage formatted with its SCRAM arguments read the
    way deploy/secure/kafka-start.sh reads them, the broker on its server.properties (only the
    compose network's host and ports swapped for free local ones), then the acls service's
    command; the producer's principal then commits a transaction the consumer's reads."""
    secure = tmp_path / "secure"
    made = run_bridge("stack", "credentials", f"--dir={secure}", "--kafka-host=localhost",
                      "--postgres-host=localhost")  # fmt: skip
    assert made.returncode == 0, made.stderr
    broker, controller = free_port(), free_port()
    path = secure / "kafka" / "server.properties"
    config = path.read_text().replace(":9092", f":{broker}").replace(":9093", f":{controller}")
    path.write_text(config.replace("log.dirs=/var/lib/kafka/data", f"log.dirs={tmp_path}/data"))
    java, classpath = java_binary(), f"{resolve_kafka_libs()}/*"
    formatted = subprocess.run(
        [java, "-cp", classpath, "kafka.tools.StorageTool", "format", "--ignore-formatted",
         "--cluster-id", (secure / "kafka" / "cluster-id").read_text().strip(),
         "--config", str(path), *(secure / "kafka" / "scram-arguments").read_text().split()],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert formatted.returncode == 0, formatted.stderr[-2000:]
    log = tmp_path / "kafka.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [java, "-Xmx512m", "-cp", classpath, "kafka.Kafka", str(path)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    bootstrap = f"localhost:{broker}"
    try:
        security = StackSecurity(secure)
        admin = AdminClient({**security.admin_config(bootstrap), "log_level": 2})
        eventually(lambda: _brokers(admin) == 1, timeout=120)
        granted = run_bridge("stack", "grant", f"--dir={secure}",
                             f"--bootstrap-servers={bootstrap}", "--topic=orders")  # fmt: skip
        assert granted.returncode == 0, granted.stdout + granted.stderr

        def principal(role: str) -> dict[str, str]:
            found = security.kafka_properties(KAFKA_USERS[role])
            return {k: resolve_file_reference(v) for k, v in found.items()}

        producer = transactional_producer(bootstrap, config=principal("producer"))
        producer.begin_transaction()
        producer.produce("orders", value=b"secured")
        producer.commit_transaction(30)
        assert read_all(bootstrap, "orders", partitions=3, config=principal("consumer")) == [
            b"secured"
        ]
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)
    assert "ERROR" not in log.read_text().split("started (kafka.server.KafkaRaftServer)")[0]


def _brokers(admin: AdminClient) -> int:
    try:
        return len(admin.list_topics(timeout=2).brokers)
    except KafkaException:
        return 0


@pytest.fixture
def compose_database(stack: Endpoints) -> Iterator[str]:
    """A database of this test's own, as the postgres service's is: empty, then initialised by
    the files the service mounts into /docker-entrypoint-initdb.d."""
    name = f"compose_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(stack.dsn, dbname=name)
    try:
        yield dsn
    finally:
        with psycopg.connect(stack.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


class ComposeService:
    """One service of the compose file as a local process: its command after the image's
    entrypoint (`bridge`), its environment with the service names swapped for the local stack,
    its mounts mapped onto local paths."""

    def __init__(
        self, name: str, spec: dict[str, Any], mounts: dict[str, Path], hosts: dict[str, str]
    ) -> None:
        self.name = name
        self.argv = [_swap(self._local(arg, mounts), hosts) for arg in spec["command"]]
        self.env = {k: _swap(str(v), hosts) for k, v in spec.get("environment", {}).items()}
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _local(arg: str, mounts: dict[str, Path]) -> str:
        for target, source in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if target in arg:
                return arg.replace(target, str(source))
        return arg

    def start(self, log: Path) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")} | self.env
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bridge_shell.cli", *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=log.parent,
            )
        return self.process


def _swap(value: str, hosts: dict[str, str]) -> str:
    for compose_address, local_address in hosts.items():
        value = value.replace(compose_address, local_address)
    return value


@pytest.mark.heavy
@pytest.mark.exclusive(COMPOSE_PORTS)
def test_the_compose_services_run_as_written_give_the_demos_result(
    stack: Endpoints, compose_database: str, tmp_path: Path
) -> None:
    if stack.secure:
        pytest.skip("the plain compose file: runs on the plain stack")
    project = yaml.safe_load(COMPOSE.read_text())
    for init in sorted((ROOT / "deploy" / "postgres-init").glob("*.sql")):
        _run_sql(compose_database, init.read_text())
    compose_dsn = project["x-bridge-env"]["BRIDGE_POSTGRES__DSN"]
    hosts = {"kafka:9092": stack.bootstrap_servers, compose_dsn: compose_database}
    if stack.registry_url is not None:
        hosts[project["x-bridge-env"]["BRIDGE_SCHEMA_REGISTRY__URL"]] = stack.registry_url
    _run_the_pipeline(project["services"], hosts, compose_database, tmp_path)


@pytest.mark.secured
@pytest.mark.heavy
@pytest.mark.exclusive(COMPOSE_PORTS)
def test_the_secured_overlays_services_run_as_written_give_the_demos_result(
    stack: Endpoints, compose_database: str, tmp_path: Path
) -> None:
    """docker-compose.secure.yml over docker-compose.yml: the producer and the consumer as
    the overlay configures them (their principals, /secure's files, TLS and SCRAM to
    PostgreSQL as the consumer's role), against the secured stack, whose data directory has
    the layout of the `secure` volume."""
    if not stack.secure:
        pytest.skip("needs the secured stack: runs under pytest --secure")
    assert stack.stack_dir is not None and stack.postgres is not None
    services = _load(COMPOSE, SECURE_OVERLAY)["services"]
    name = str(conninfo_to_dict(compose_database)["dbname"])
    # What the postgres service's first start does: its base init, then the overlay's (the
    # role exists already on this server, so only its rights are given here).
    for init in sorted((ROOT / "deploy" / "postgres-init").glob("*.sql")):
        _run_sql(compose_database, init.read_text())
    with psycopg.connect(compose_database, autocommit=True) as conn:
        for statement in consumer_role_statements(None, database=name):
            conn.execute(statement)
        conn.execute(_heredoc_sql(ROOT / "deploy" / "secure" / "postgres-init" / "02-roles.sh"))
    hosts = {"kafka:9092": stack.bootstrap_servers, "/secure/": f"{stack.stack_dir}/",
             "postgres:5432/bridge": f"127.0.0.1:{stack.postgres.port}/{name}"}  # fmt: skip
    # The acls service first (its topic and grants), as the admin of /secure.
    _run_the_pipeline(services, hosts, compose_database, tmp_path, first=("acls", "sample-data"),
                      volumes={"/secure": stack.stack_dir})  # fmt: skip


def _run_the_pipeline(
    services: dict[str, Any],
    hosts: dict[str, str],
    compose_database: str,
    tmp_path: Path,
    *,
    first: tuple[str, ...] = ("sample-data",),
    volumes: dict[str, Path] | None = None,
) -> None:
    """The one-shot services `first`, each to completion, then producer and consumer, as the
    services say; every sample order in PostgreSQL exactly once, the producer's metrics and
    the consumer's healthcheck true."""
    data = tmp_path / "bridge-data"  # the named volume
    mounts = {"/data": data, "/etc/bridge/bridge.yaml": ROOT / "deploy" / "bridge.yaml",
              **(volumes or {})}  # fmt: skip
    for name in (*first, "producer", "consumer"):
        for volume in services[name].get("volumes", []):
            source, target = _volume(volume)
            if source.startswith(("./", f"{ROOT}/")):
                local = ROOT / source.removeprefix("./").removeprefix(f"{ROOT}/")
                assert local.exists(), f"{name} mounts missing {source}"
                assert mounts.get(target) == local
    producer, consumer = (
        ComposeService(n, services[n], mounts, hosts) for n in ("producer", "consumer")
    )

    # The one-shot services run to completion first: the producer depends on them.
    for name in first:
        log = tmp_path / f"{name}.log"
        one_shot = ComposeService(name, services[name], mounts, hosts)
        assert one_shot.start(log).wait(120) == 0, log.read_text()[-2000:]
    expected = sum(len(f.read_text().splitlines()) for f in (data / "input").iterdir())
    running = [producer.start(tmp_path / "producer.log"), consumer.start(tmp_path / "consumer.log")]
    try:
        eventually(lambda: _orders(compose_database) == (expected, expected), timeout=300)
        # What Prometheus scrapes from the producer (deploy/prometheus/prometheus.yml).
        producer_port = next(
            a.split("=", 1)[1] for a in producer.argv if a.startswith("--metrics-port=")
        )
        written = f"bridge_producer_rows_written_total {float(expected)}".encode()

        def producer_counted_all() -> bool:
            url = f"http://localhost:{producer_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:
                return written in answer.read()

        eventually(producer_counted_all, timeout=60)
        # The consumer's healthcheck, as compose runs it (curl in the image).
        port = yaml.safe_load((ROOT / "deploy" / "bridge.yaml").read_text())["consumer"][
            "http_port"
        ]
        eventually(lambda: _ready(port), timeout=60)
        time.sleep(3)  # a late duplicate would show now
        assert _orders(compose_database) == (expected, expected)
        with psycopg.connect(compose_database, autocommit=True) as conn:
            dead = conn.execute("SELECT count(*) FROM bridge.dead_letters").fetchone()
        assert dead == (0,)
    finally:
        for process in running:
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(120) for process in running]
    assert codes == [0, 0], [
        (tmp_path / f"{n}.log").read_text()[-2000:] for n in ("producer", "consumer")
    ]


def _volume(volume: Any) -> tuple[str, str]:
    """(source, target) of a volume as written (`src:dst[:mode]`) or as compose-go loads it."""
    if isinstance(volume, dict):
        return str(volume.get("source", "")), str(volume["target"])
    source, target = str(volume).split(":")[:2]
    return source, target


def _run_sql(dsn: str, text: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text.encode())


def _heredoc_sql(script: Path) -> bytes:
    """The SQL of a first-start script's here-document (`<<'SQL' ... SQL`)."""
    text = script.read_text()
    return text.split("<<'SQL'\n", 1)[1].split("\nSQL\n", 1)[0].encode()


def _load(*files: Path) -> dict[str, Any]:
    """The files merged by compose-go, as `docker compose -f ... -f ...` merges them."""
    built = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.fail(f"composecheck unavailable ({built.stderr.strip()}); run `make setup`")
    binary = built.stdout.strip().splitlines()[-1]
    loaded = subprocess.run([binary, *map(str, files)], capture_output=True, text=True, check=False)
    assert loaded.returncode == 0, loaded.stderr
    project: dict[str, Any] = json.loads(loaded.stdout)
    return project


def _orders(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT order_id) FROM public.orders"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _ready(port: int) -> bool:
    """`curl -fsS http://localhost:<port>/readyz` succeeds: a 2xx answer."""
    try:
        with urllib.request.urlopen(f"http://localhost:{port}/readyz", timeout=5) as answer:
            status: int = answer.status
    except OSError:
        return False
    return 200 <= status < 300
