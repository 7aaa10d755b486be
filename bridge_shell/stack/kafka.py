"""Apache Kafka from Maven Central: resolve the broker's jars, run KRaft nodes on loopback."""

from __future__ import annotations

import base64
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from bridge.errors import ServerStartError
from bridge_shell.maven import cached_jars_dir, java_binary, packaged_pom, resolve_jars
from bridge_shell.stack import process
from bridge_shell.stack.secure import StackSecurity

ENV_KAFKA_LIBS = "BRIDGE_KAFKA_LIBS"
ENV_KAFKA_HEAP = "BRIDGE_KAFKA_HEAP"

# Every node is broker and controller (KRaft, a static quorum of all nodes).
_NODE = {
    "process.roles": "broker,controller",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    # Groups of the new protocol (KIP-848): the broker owns the session. A member that died is
    # replaced after 10 s rather than 45 (the same order as a classic member's 10 s default).
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.session.timeout.ms": "10000",
    "group.consumer.min.heartbeat.interval.ms": "1000",
    "group.consumer.heartbeat.interval.ms": "2000",
    "auto.create.topics.enable": "true",
    # The active controller's no-op record, which tells brokers the quorum is alive, every 5 s
    # rather than 0.5 s: an idle node's CPU went from 1.37 to 1.01 s a minute (two cores), and a
    # three-node cluster was ready as fast (6 s). Liveness and fencing are the heartbeats'.
    "metadata.max.idle.interval.ms": "5000",
}


def replication_settings(nodes: int) -> dict[str, str]:
    """One node: every topic, the internal ones included, with one replica, so that
    transactions (__transaction_state) and group offsets (__consumer_offsets) work at all.
    Three or more: three replicas and two in sync, so that a write acknowledged by all in-sync
    replicas survives the loss of any one node, and the cluster goes on without it."""
    replicas = str(min(nodes, 3))
    in_sync = "1" if nodes < 3 else "2"
    return {
        "default.replication.factor": replicas,
        "min.insync.replicas": in_sync,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": in_sync,
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


def resolve_kafka_libs() -> Path:
    """The broker's jars (kafka-pom.xml beside this module), resolved once from Maven Central."""
    pom = packaged_pom("bridge_shell", "stack", "kafka-pom.xml")
    return resolve_jars(
        pom, cached_jars_dir(pom, "kafka-libs", ENV_KAFKA_LIBS), override_env=ENV_KAFKA_LIBS
    )


@dataclass(frozen=True, kw_only=True)
class KafkaPorts:
    broker: int
    controller: int
    # The port clients are told to use, when a proxy stands in front of the broker (network
    # fault tests): a client follows the advertised address after its bootstrap.
    advertised: int | None = None


class KafkaServer:
    """One KRaft broker+controller whose files all live under `home`."""

    def __init__(
        self,
        *,
        home: Path,
        ports: KafkaPorts,
        cluster_id: str,
        libs_dir: Path | None = None,
        node_id: int = 1,
        voters: str | None = None,
        cluster_size: int = 1,
        security: StackSecurity | None = None,
    ) -> None:
        """`voters`: the quorum, `id@host:port,...` over every node's controller port (this
        node alone when not given); `cluster_size`: how many nodes, for the replication
        settings and for `wait_ready`; `security`: SASL_SSL with SCRAM and ACLs (see
        bridge_shell/stack/secure.py) instead of PLAINTEXT."""
        self.home = home
        self.ports = ports
        self.cluster_id = cluster_id
        self.node_id = node_id
        self.voters = voters or f"{node_id}@127.0.0.1:{ports.controller}"
        self.cluster_size = cluster_size
        self.security = security
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

    @property
    def listener(self) -> str:
        return "SASL_SSL" if self.security else "PLAINTEXT"

    def admin_config(self) -> dict[str, str]:
        """A client configuration with every right: the stack's own set-up, and the tests'."""
        if self.security is not None:
            return self.security.admin_config(self.bootstrap_servers)
        return {"bootstrap.servers": self.bootstrap_servers}

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
        """Ready means an AdminClient sees every broker of the cluster in its metadata."""
        deadline = time.monotonic() + timeout

        def listening() -> bool:
            if process.gone(self.pid):
                raise ServerStartError("Kafka", "the process exited", log_path=self._log_hint())
            return process.port_open("127.0.0.1", self.ports.broker)

        # Wait for the socket first: a client created earlier floods stderr with refusals.
        if process.wait_until(listening, timeout=timeout, interval=0.2):
            # Quiet: refusals from the nodes still starting are expected here, not news.
            admin = AdminClient({**self.admin_config(), "log_level": 2})

            def sees_broker() -> bool:
                try:
                    return len(admin.list_topics(timeout=2).brokers) >= self.cluster_size
                except KafkaException:
                    return False

            remaining = max(1.0, deadline - time.monotonic())
            if process.wait_until(sees_broker, timeout=remaining, interval=0.3):
                return
        raise ServerStartError(
            "Kafka", f"not ready after {timeout:.0f}s", log_path=self._log_hint()
        )

    def stop(self, *, grace: float = 30.0) -> None:
        stop_kafka_nodes([self], grace=grace)

    def kill(self) -> None:
        """SIGKILL, for fault-injection tests: no controlled shutdown, no flush."""
        pid = self.pid
        if pid is not None:
            process.terminate(pid, str(self.config_path), grace=0)

    def _log_hint(self) -> str:
        return str(self.log_dir / "server.log")

    def _write_config(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        settings = node_settings(
            node_id=self.node_id,
            cluster_size=self.cluster_size,
            listen_host="127.0.0.1",
            advertised_host="127.0.0.1",
            ports=self.ports,
            voters=self.voters,
            log_dirs=self.data_dir,
            security=self.security,
        )
        lines = [f"{key}={value}" for key, value in settings.items()]
        # Owner only: a secured node's configuration names where its secrets are.
        self.config_path.touch(mode=0o600)
        self.config_path.chmod(0o600)
        self.config_path.write_text("\n".join(lines) + "\n")
        (self.home / "log4j2.yaml").write_text(_LOG4J2.format(log_dir=self.log_dir))

    def _format_storage(self) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        argv = [
            java_binary(), "-cp", f"{self.libs_dir}/*", "kafka.tools.StorageTool", "format",
            f"--cluster-id={self.cluster_id}", "-c", str(self.config_path),
        ]  # fmt: skip
        if self.security is not None:
            argv += self.security.scram_format_arguments()
        result = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603
        if result.returncode != 0:
            raise ServerStartError(
                "Kafka", f"storage format failed: {result.stderr.strip()[-1000:]}"
            )


def node_settings(
    *,
    node_id: int,
    cluster_size: int,
    listen_host: str,
    advertised_host: str,
    ports: KafkaPorts,
    voters: str,
    log_dirs: Path,
    security: StackSecurity | None,
) -> dict[str, str]:
    """The server.properties of one node: the local stack's, and the secured compose broker's
    (`bridge stack credentials`), from the same settings."""
    listener = "SASL_SSL" if security else "PLAINTEXT"
    settings = {**_NODE, **replication_settings(cluster_size)}
    settings.update(
        {
            "node.id": str(node_id),
            "listeners": (
                f"{listener}://{listen_host}:{ports.broker},"
                f"CONTROLLER://{listen_host}:{ports.controller}"
            ),
            "advertised.listeners": (
                f"{listener}://{advertised_host}:{ports.advertised or ports.broker}"
            ),
            "controller.quorum.voters": voters,
            "log.dirs": str(log_dirs),
        }
    )
    if security is not None:
        settings.update(
            {
                "inter.broker.listener.name": listener,
                "listener.security.protocol.map": f"{listener}:SASL_SSL,CONTROLLER:SSL",
                **security.broker_settings(listener=listener),
            }
        )
    return settings


def stop_kafka_nodes(nodes: list[KafkaServer], *, grace: float = 30.0) -> None:
    """Stop the nodes of one cluster together (SIGTERM to all, SIGKILL to any still running
    after `grace`)."""
    targets = [(node.pid, str(node.config_path)) for node in nodes]
    process.terminate_together(
        [(pid, marker) for pid, marker in targets if pid is not None], grace=grace
    )
    for node in nodes:
        node.pid_path.unlink(missing_ok=True)


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding, as `random-uuid` prints.

    Like Kafka's own Uuid.randomUuid, never one that starts with '-' (read as an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
