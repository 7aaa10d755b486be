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
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.consumer_helpers import eventually
from tests.harness import Endpoints

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
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
        "kafka", "postgres", "sample-data", "producer", "consumer", "prometheus", "grafana"
    }  # fmt: skip
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
        self.argv = [self._local(arg, mounts) for arg in spec["command"]]
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
                [sys.executable, "-m", "bridge.cli", *self.argv],
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


def test_the_compose_services_run_as_written_give_the_demos_result(
    stack: Endpoints, compose_database: str, tmp_path: Path
) -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    # The postgres service: its init files, in the order the image runs them.
    for init in sorted((ROOT / "deploy" / "postgres-init").glob("*.sql")):
        with psycopg.connect(compose_database, autocommit=True) as conn:
            conn.execute(init.read_text().encode())
    compose_dsn = yaml.safe_load(COMPOSE.read_text())["x-bridge-env"]["BRIDGE_POSTGRES__DSN"]
    hosts = {"kafka:9092": stack.bootstrap_servers, compose_dsn: compose_database}
    data = tmp_path / "bridge-data"  # the named volume
    mounts = {"/data": data, "/etc/bridge/bridge.yaml": ROOT / "deploy" / "bridge.yaml"}
    for name in ("sample-data", "producer", "consumer"):
        for volume in services[name].get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
                assert mounts.get(target) == ROOT / source.removeprefix("./")
    sample, producer, consumer = (
        ComposeService(n, services[n], mounts, hosts)
        for n in ("sample-data", "producer", "consumer")
    )

    # sample-data runs to completion first: the producer depends on it.
    assert sample.start(tmp_path / "sample-data.log").wait(120) == 0
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
