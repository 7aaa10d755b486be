"""The local stack: Kafka (one KRaft node, or a cluster of several) and one PostgreSQL cluster
under a data directory.

`up` is idempotent: ports and the cluster id are chosen once and kept in `stack.json`, so a
restarted stack keeps its addresses and its data; `stack.env` tells clients where to connect.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bridge.errors import StackError
from bridge.names import ENV_KAFKA_BOOTSTRAP, ENV_POSTGRES_DSN, STACK_ENV_FILE, STACK_STATE_FILE
from bridge.stack import process
from bridge.stack.kafka import KafkaPorts, KafkaServer, new_cluster_id, resolve_kafka_libs
from bridge.stack.postgres import PostgresServer, find_bindir


@dataclass(frozen=True, kw_only=True)
class StackState:
    """What `up` decided once and every later command reuses."""

    kafka_port: int
    controller_port: int
    postgres_port: int
    cluster_id: str
    # Nodes 2..N of a Kafka cluster: [broker port, controller port] each.
    extra_nodes: list[list[int]] = field(default_factory=list)

    @property
    def brokers(self) -> int:
        return 1 + len(self.extra_nodes)

    @classmethod
    def load(cls, path: Path) -> StackState | None:
        if not path.exists():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:
            raise StackError(f"{path} is damaged ({exc}); remove the data directory") from exc

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)


@dataclass(frozen=True, kw_only=True)
class NodeStatus:
    node_id: int
    running: bool
    pid: int | None
    address: str


@dataclass(frozen=True, kw_only=True)
class StackStatus:
    data_dir: Path
    kafka_running: bool
    kafka_pid: int | None
    bootstrap_servers: str | None
    postgres_running: bool
    postgres_pid: int | None
    dsn: str | None
    kafka_nodes: tuple[NodeStatus, ...] = ()

    @property
    def running(self) -> bool:
        return self.kafka_running and self.postgres_running


class LocalStack:
    def __init__(
        self,
        data_dir: Path,
        *,
        kafka_port: int | None = None,
        postgres_port: int | None = None,
        brokers: int | None = None,
    ) -> None:
        """`brokers`: Kafka nodes for a new stack (1 unless given); an existing stack keeps
        its own count, and asking for another is refused."""
        self.data_dir = data_dir.resolve()
        self._requested_kafka_port = kafka_port
        self._requested_postgres_port = postgres_port
        self._requested_brokers = brokers
        self.state_path = self.data_dir / STACK_STATE_FILE
        self.env_path = self.data_dir / STACK_ENV_FILE

    # -- the two servers, built from the saved state ------------------------------------------

    def _state(self, *, create: bool) -> StackState | None:
        state = StackState.load(self.state_path)
        if state is None and create:
            state = StackState(
                kafka_port=self._requested_kafka_port or process.free_port(),
                controller_port=process.free_port(),
                postgres_port=self._requested_postgres_port or process.free_port(),
                cluster_id=new_cluster_id(),
                extra_nodes=[
                    [process.free_port(), process.free_port()]
                    for _ in range((self._requested_brokers or 1) - 1)
                ],
            )
            self.data_dir.mkdir(parents=True, exist_ok=True)
            state.save(self.state_path)
        if state is not None:
            self._refuse_port_change(state)
        return state

    def _refuse_port_change(self, state: StackState) -> None:
        for wanted, kept, name in (
            (self._requested_kafka_port, state.kafka_port, "Kafka"),
            (self._requested_postgres_port, state.postgres_port, "PostgreSQL"),
        ):
            if wanted is not None and wanted != kept:
                raise StackError(
                    f"{name} of the stack in {self.data_dir} uses port {kept}, not {wanted}: "
                    "run `bridge stack down` and remove the directory to change it"
                )
        wanted_brokers = self._requested_brokers
        if wanted_brokers is not None and wanted_brokers != state.brokers:
            raise StackError(
                f"the stack in {self.data_dir} has {state.brokers} Kafka node(s), not "
                f"{wanted_brokers}: run `bridge stack down` and remove the directory to change it"
            )

    def state(self) -> StackState:
        """The saved state of a stack that has been brought up at least once."""
        state = self._state(create=False)
        if state is None:
            raise StackError(f"no stack in {self.data_dir}: run `bridge stack up` first")
        return state

    def kafka(self, state: StackState) -> KafkaServer:
        """The first Kafka node (the only one of a single-node stack)."""
        return self.kafka_nodes(state)[0]

    def kafka_nodes(self, state: StackState) -> list[KafkaServer]:
        ports = [(state.kafka_port, state.controller_port)]
        ports += [(broker, controller) for broker, controller in state.extra_nodes]
        voters = ",".join(f"{n}@127.0.0.1:{c}" for n, (_, c) in enumerate(ports, start=1))
        return [
            KafkaServer(
                # The first node keeps the directory a single-node stack always had.
                home=self.data_dir / ("kafka" if node == 1 else f"kafka-{node}"),
                ports=KafkaPorts(broker=broker, controller=controller),
                cluster_id=state.cluster_id,
                node_id=node,
                voters=voters,
                cluster_size=len(ports),
            )
            for node, (broker, controller) in enumerate(ports, start=1)
        ]

    @staticmethod
    def bootstrap_servers(nodes: list[KafkaServer]) -> str:
        return ",".join(node.bootstrap_servers for node in nodes)

    def postgres(self, state: StackState) -> PostgresServer:
        return PostgresServer(home=self.data_dir / "postgres", port=state.postgres_port)

    # -- commands ------------------------------------------------------------------------------

    @staticmethod
    def prepare() -> None:
        """Everything `up` needs that takes time or the network: the Kafka jars, the binaries."""
        resolve_kafka_libs()
        find_bindir()

    def up(self, *, timeout: float = 120.0) -> StackStatus:
        state = self._state(create=True)
        assert state is not None  # noqa: S101 - create=True always yields a state
        nodes, postgres = self.kafka_nodes(state), self.postgres(state)
        started = time.monotonic()
        # Kafka takes seconds to start: launch it first and bring PostgreSQL up meanwhile.
        try:
            for node in nodes:
                node.start()
            postgres.start(timeout=timeout)
            for node in nodes:
                node.wait_ready(timeout=max(5.0, timeout - (time.monotonic() - started)))
        except BaseException:
            for node in nodes:
                node.stop()
            postgres.stop()
            raise
        self._write_env(nodes, postgres)
        return self.status()

    def down(self) -> StackStatus:
        state = self._state(create=False)
        if state is not None:
            # Stop all even if one refuses: `down` must leave no process behind.
            try:
                for node in self.kafka_nodes(state):
                    node.stop()
            finally:
                self.postgres(state).stop()
        self.env_path.unlink(missing_ok=True)
        return self.status()

    def status(self) -> StackStatus:
        state = self._state(create=False)
        if state is None:
            return StackStatus(
                data_dir=self.data_dir,
                kafka_running=False,
                kafka_pid=None,
                bootstrap_servers=None,
                postgres_running=False,
                postgres_pid=None,
                dsn=None,
            )
        nodes, postgres = self.kafka_nodes(state), self.postgres(state)
        return StackStatus(
            data_dir=self.data_dir,
            kafka_running=all(node.running() for node in nodes),
            kafka_pid=nodes[0].pid,
            bootstrap_servers=self.bootstrap_servers(nodes),
            postgres_running=postgres.running(),
            postgres_pid=postgres.pid,
            dsn=postgres.dsn,
            kafka_nodes=tuple(
                NodeStatus(
                    node_id=node.node_id,
                    running=node.running(),
                    pid=node.pid,
                    address=node.bootstrap_servers,
                )
                for node in nodes
            ),
        )

    def _write_env(self, nodes: list[KafkaServer], postgres: PostgresServer) -> None:
        text = (
            f"{ENV_KAFKA_BOOTSTRAP}={self.bootstrap_servers(nodes)}\n"
            f"{ENV_POSTGRES_DSN}={postgres.dsn}\n"
        )
        tmp = self.env_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.env_path)
