"""Apache Kafka from Maven Central: resolve the broker's jars, run one KRaft node on loopback."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from bridge.errors import MissingToolError, ServerStartError, StackError
from bridge.stack import process

ENV_KAFKA_LIBS = "BRIDGE_KAFKA_LIBS"
ENV_KAFKA_HEAP = "BRIDGE_KAFKA_HEAP"
_COMPLETE = ".complete"

# Single-node settings: every internal topic with one replica, so that transactions
# (__transaction_state) and group offsets (__consumer_offsets) work on one broker.
_SINGLE_NODE = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "true",
}

_LOG4J2 = """\
Configuration:
  Appenders:
    RollingFile:
      name: server
      fileName: "{log_dir}/server.log"
      filePattern: "{log_dir}/server.log.%i"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
      SizeBasedTriggeringPolicy:
        size: 50MB
      DefaultRolloverStrategy:
        max: 3
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: server
    Logger:
      - name: org.apache.kafka.coordinator
        level: WARN
"""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_pom() -> Path:
    return repo_root() / "pom.xml"


def default_libs_dir(pom: Path) -> Path:
    """A cache outside the work tree, keyed by the pom's content, so fresh clones reuse it."""
    if os.environ.get(ENV_KAFKA_LIBS):
        return Path(os.environ[ENV_KAFKA_LIBS])
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "bridge" / f"kafka-libs-{digest}"


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise MissingToolError(
            "java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)"
        )
    return found


def resolve_kafka_libs(pom: Path | None = None, libs_dir: Path | None = None) -> Path:
    """Copy the broker's jars from Maven Central into `libs_dir`, once; return the directory."""
    pom = pom or default_pom()
    libs_dir = libs_dir or default_libs_dir(pom)
    if (libs_dir / _COMPLETE).exists():
        return libs_dir
    if not pom.is_file():
        raise StackError(f"no pom.xml at {pom}: set {ENV_KAFKA_LIBS} to a directory of Kafka jars")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingToolError("mvn", "install Apache Maven (Debian: apt-get install maven)")
    java_binary()
    libs_dir.parent.mkdir(parents=True, exist_ok=True)
    # Copy into a scratch directory and rename, so an interrupted download is never taken as done.
    scratch = Path(tempfile.mkdtemp(prefix=libs_dir.name + ".", dir=libs_dir.parent))
    argv = [
        mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
        f"-DoutputDirectory={scratch}", "-DincludeScope=runtime",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        tail = (result.stdout + result.stderr).strip()[-2000:]
        raise StackError(f"Maven could not resolve the Kafka jars from {pom}:\n{tail}")
    (scratch / _COMPLETE).touch()
    try:
        scratch.rename(libs_dir)
    except OSError:
        # Another process finished first; its copy is as good as ours.
        shutil.rmtree(scratch, ignore_errors=True)
    return libs_dir


@dataclass(frozen=True, kw_only=True)
class KafkaPorts:
    broker: int
    controller: int


class KafkaServer:
    """One KRaft broker+controller whose files all live under `home`."""

    def __init__(
        self, *, home: Path, ports: KafkaPorts, cluster_id: str, libs_dir: Path | None = None
    ) -> None:
        self.home = home
        self.ports = ports
        self.cluster_id = cluster_id
        self._libs_dir = libs_dir
        self.config_path = home / "server.properties"
        self.log_dir = home / "logs"
        self.data_dir = home / "data"
        self.pid_path = home / "kafka.pid"

    @property
    def libs_dir(self) -> Path:
        """The broker's jars, resolved on first use so that `status` and `down` never download."""
        if self._libs_dir is None:
            self._libs_dir = resolve_kafka_libs()
        return self._libs_dir

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.ports.broker}"

    @property
    def pid(self) -> int | None:
        return process.read_pid(self.pid_path)

    def running(self) -> bool:
        return process.alive(self.pid, str(self.config_path))

    def start(self) -> None:
        """Start the broker without waiting for it; `wait_ready` does that."""
        if self.running():
            return
        for port in (self.ports.broker, self.ports.controller):
            if process.port_open("127.0.0.1", port):
                raise ServerStartError("Kafka", f"port {port} on 127.0.0.1 is already taken")
        self._write_config()
        self._format_storage()
        java = java_binary()
        heap = os.environ.get(ENV_KAFKA_HEAP, "512m")
        argv = [
            java, f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.yaml'}",
            "-cp", f"{self.libs_dir}/*", "kafka.Kafka", str(self.config_path),
        ]  # fmt: skip
        pid = process.spawn_detached(argv, log_path=self.log_dir / "stdout.log", cwd=self.home)
        self.pid_path.write_text(f"{pid}\n")

    def wait_ready(self, timeout: float) -> None:
        """Ready means an AdminClient sees the broker in the cluster metadata."""
        deadline = time.monotonic() + timeout

        def listening() -> bool:
            if not self.running():
                raise ServerStartError("Kafka", "the process exited", log_path=self._log_hint())
            return process.port_open("127.0.0.1", self.ports.broker)

        # Wait for the socket first: a client created earlier floods stderr with refusals.
        if process.wait_until(listening, timeout=timeout, interval=0.2):
            admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})

            def sees_broker() -> bool:
                try:
                    return bool(admin.list_topics(timeout=2).brokers)
                except KafkaException:
                    return False

            remaining = max(1.0, deadline - time.monotonic())
            if process.wait_until(sees_broker, timeout=remaining, interval=0.3):
                return
        raise ServerStartError(
            "Kafka", f"not ready after {timeout:.0f}s", log_path=self._log_hint()
        )

    def stop(self, *, grace: float = 30.0) -> None:
        pid = self.pid
        if pid is not None:
            process.terminate(pid, str(self.config_path), grace=grace)
        self.pid_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL, for fault-injection tests: no controlled shutdown, no flush."""
        pid = self.pid
        if pid is not None:
            process.terminate(pid, str(self.config_path), grace=0)

    def _log_hint(self) -> str:
        return str(self.log_dir / "server.log")

    def _write_config(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        settings = dict(_SINGLE_NODE)
        settings.update(
            {
                "listeners": (
                    f"PLAINTEXT://127.0.0.1:{self.ports.broker},"
                    f"CONTROLLER://127.0.0.1:{self.ports.controller}"
                ),
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.ports.broker}",
                "controller.quorum.voters": f"1@127.0.0.1:{self.ports.controller}",
                "log.dirs": str(self.data_dir),
            }
        )
        lines = [f"{key}={value}" for key, value in settings.items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        (self.home / "log4j2.yaml").write_text(_LOG4J2.format(log_dir=self.log_dir))

    def _format_storage(self) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        argv = [
            java_binary(), "-cp", f"{self.libs_dir}/*", "kafka.tools.StorageTool", "format",
            f"--cluster-id={self.cluster_id}", "-c", str(self.config_path),
        ]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603
        if result.returncode != 0:
            raise ServerStartError(
                "Kafka", f"storage format failed: {result.stderr.strip()[-1000:]}"
            )


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding, as `random-uuid` prints.

    Like Kafka's own Uuid.randomUuid, never one that starts with '-' (read as an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
