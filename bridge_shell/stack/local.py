"""The local stack: Kafka (one KRaft node, or a cluster of several), one PostgreSQL cluster, a
schema registry, and optionally a Spark standalone master with workers, under a data directory.

`up` is idempotent: ports and the cluster id are chosen once and kept in `stack.json`, so a
restarted stack keeps its addresses and its data; `stack.env` tells clients where to connect.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bridge.errors import StackError
from bridge.names import (
    ENV_KAFKA_BOOTSTRAP,
    ENV_POSTGRES_DSN,
    ENV_SCHEMA_REGISTRY_PROPERTIES,
    ENV_SCHEMA_REGISTRY_URL,
    ENV_SPARK_MASTER,
    POSTGRES_DATABASE,
    POSTGRES_USER,
    STACK_ENV_FILE,
    STACK_STATE_FILE,
)
from bridge.settings import role_env_file
from bridge_shell.stack import process
from bridge_shell.stack.kafka import (
    KafkaPorts,
    KafkaServer,
    new_cluster_id,
    resolve_kafka_libs,
    stop_kafka_nodes,
)
from bridge_shell.stack.postgres import PostgresServer, find_bindir
from bridge_shell.stack.registry import RegistryServer, registry_dist
from bridge_shell.stack.secure import StackSecurity
from bridge_shell.stack.spark import DaemonPorts, SparkCluster

# The roles that get an env file of their own on a secured stack (bridge_shell/stack/secure.py).
_ROLE_FILES = ("producer", "consumer", "tools", "admin")


@dataclass(frozen=True, kw_only=True)
class StackState:
    """What `up` decided once and every later command reuses."""

    kafka_port: int
    controller_port: int
    postgres_port: int
    cluster_id: str
    # Nodes 2..N of a Kafka cluster: [broker port, controller port] each.
    extra_nodes: list[list[int]] = field(default_factory=list)
    # A Spark standalone cluster: the master's [rpc port, web UI port], and each worker's.
    spark_master: list[int] = field(default_factory=list)
    spark_workers: list[list[int]] = field(default_factory=list)
    # TLS, SASL/SCRAM and ACLs on Kafka; TLS and SCRAM on PostgreSQL (bridge_shell/stack/secure.py).
    secure: bool = False
    # The schema registry's port; 0 in the state of a stack made before it had one, which gets
    # one at its next `up`.
    registry_port: int = 0
    # A streaming standby of PostgreSQL ("" for none, "sync" or "async" replication) and its
    # port; clients get a DSN naming both, with target_session_attrs=read-write.
    postgres_standby: str = ""
    postgres_standby_port: int = 0

    @property
    def brokers(self) -> int:
        return 1 + len(self.extra_nodes)

    def with_spark_workers(self, count: int) -> StackState:
        """This state with `count` Spark workers (and a master when there are any): ports kept
        for those there were, new ones for those added."""
        workers = self.spark_workers[:count]
        workers += [[process.free_port(), process.free_port()] for _ in range(count - len(workers))]
        master = (self.spark_master or [process.free_port(), process.free_port()]) if count else []
        return replace(self, spark_master=master, spark_workers=workers)

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
    spark_master: str | None = None  # the master URL, when the stack has a Spark cluster
    spark_daemons: tuple[NodeStatus, ...] = ()  # the master (node 0) and the workers (1..N)
    secure: bool = False
    registry_running: bool = False
    registry_pid: int | None = None
    registry_url: str | None = None
    postgres_standby: NodeStatus | None = None  # a streaming standby, when the stack has one

    @property
    def running(self) -> bool:
        spark_running = all(daemon.running for daemon in self.spark_daemons)
        servers = self.kafka_running and self.postgres_running and self.registry_running
        return servers and spark_running


class LocalStack:
    def __init__(
        self,
        data_dir: Path,
        *,
        kafka_port: int | None = None,
        postgres_port: int | None = None,
        brokers: int | None = None,
        spark_workers: int | None = None,
        secure: bool | None = None,
        postgres_standby: str | None = None,
    ) -> None:
        """`postgres_standby`: for a new plain stack, a streaming standby of PostgreSQL with
        "sync" or "async" replication; an existing stack keeps what it was made with.
        `brokers`: Kafka nodes for a new stack (1 unless given); an existing stack keeps
        its own count, and asking for another is refused. `spark_workers`: Spark standalone
        workers (none unless given); an existing stack keeps its count unless given, and may
        change it, since a Spark cluster keeps no data. `secure`: a new stack with TLS,
        SCRAM and ACLs (plain unless given); an existing one keeps what it was made with."""
        self.data_dir = data_dir.resolve()
        self._requested_kafka_port = kafka_port
        self._requested_postgres_port = postgres_port
        self._requested_brokers = brokers
        self._requested_spark_workers = spark_workers
        self._requested_secure = secure
        if postgres_standby not in (None, "sync", "async"):
            raise StackError(f"--postgres-standby takes sync or async, not {postgres_standby!r}")
        if postgres_standby and secure:
            raise StackError("a PostgreSQL standby is only offered on a plain stack")
        self._requested_standby = postgres_standby
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
                secure=bool(self._requested_secure),
                registry_port=process.free_port(),
                postgres_standby=self._requested_standby or "",
                postgres_standby_port=process.free_port() if self._requested_standby else 0,
            )
            self.data_dir.mkdir(parents=True, exist_ok=True)
            state.save(self.state_path)
        elif state is not None and create and not state.registry_port:
            state = replace(state, registry_port=process.free_port())
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
        wanted_standby = self._requested_standby
        if wanted_standby is not None and wanted_standby != state.postgres_standby:
            kind = f"a {state.postgres_standby} standby" if state.postgres_standby else "no standby"
            raise StackError(
                f"the stack in {self.data_dir} has {kind} for PostgreSQL: run `bridge stack "
                "down` and remove the directory to change it"
            )
        wanted_secure = self._requested_secure
        if wanted_secure is not None and wanted_secure != state.secure:
            kind = "secured" if state.secure else "plain"
            raise StackError(
                f"the stack in {self.data_dir} is {kind}: run `bridge stack down` and remove "
                "the directory to change it"
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

    def security(self, state: StackState) -> StackSecurity | None:
        return StackSecurity(self.data_dir) if state.secure else None

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
                security=self.security(state),
            )
            for node, (broker, controller) in enumerate(ports, start=1)
        ]

    @staticmethod
    def bootstrap_servers(nodes: list[KafkaServer]) -> str:
        return ",".join(node.bootstrap_servers for node in nodes)

    def postgres(self, state: StackState) -> PostgresServer:
        return PostgresServer(
            home=self.data_dir / "postgres", port=state.postgres_port, security=self.security(state)
        )

    def postgres_standby(self, state: StackState) -> PostgresServer | None:
        if not state.postgres_standby:
            return None
        return PostgresServer(
            home=self.data_dir / "postgres-standby", port=state.postgres_standby_port
        )

    def dsn(self, state: StackState) -> str:
        """The superuser's DSN; with a standby, naming both servers, so that a client follows
        a promotion to whichever takes writes."""
        postgres, standby = self.postgres(state), self.postgres_standby(state)
        if standby is None:
            return postgres.dsn
        hosts = f"127.0.0.1:{postgres.port},127.0.0.1:{standby.port}"
        return (
            f"postgresql://{POSTGRES_USER}@{hosts}/{POSTGRES_DATABASE}"
            "?target_session_attrs=read-write"
        )

    def registry(self, state: StackState) -> RegistryServer | None:
        """None only for a stack made before it had a registry, until its next `up`."""
        if not state.registry_port:
            return None
        return RegistryServer(
            home=self.data_dir / "registry",
            port=state.registry_port,
            security=self.security(state),
        )

    def spark(self, state: StackState) -> SparkCluster | None:
        if not state.spark_master:
            return None
        rpc, web_ui = state.spark_master
        return SparkCluster(
            home=self.data_dir / "spark",
            master=DaemonPorts(rpc=rpc, web_ui=web_ui),
            workers=[DaemonPorts(rpc=r, web_ui=w) for r, w in state.spark_workers],
        )

    def _resize_spark(self, state: StackState) -> StackState:
        wanted = self._requested_spark_workers
        if wanted is None or wanted == len(state.spark_workers):
            return state
        current = self.spark(state)
        if current is not None:
            current.stop()  # workers keep the master URL they were started with: restart all
        resized = state.with_spark_workers(wanted)
        resized.save(self.state_path)
        return resized

    # -- commands ------------------------------------------------------------------------------

    @staticmethod
    def prepare() -> None:
        """Everything `up` needs that takes time or the network: the Kafka jars, the schema
        registry, the binaries."""
        resolve_kafka_libs()
        registry_dist()
        find_bindir()

    def up(self, *, timeout: float = 120.0) -> StackStatus:
        state = self._state(create=True)
        assert state is not None  # noqa: S101 - create=True always yields a state
        state = self._resize_spark(state)
        nodes, postgres, spark = self.kafka_nodes(state), self.postgres(state), self.spark(state)
        standby = self.postgres_standby(state)
        registry = self.registry(state)
        assert registry is not None  # noqa: S101 - create=True gives a stack its registry
        security = self.security(state)
        if security is not None:
            security.ensure()
        started = time.monotonic()

        def remaining() -> float:
            return max(5.0, timeout - (time.monotonic() - started))

        # Kafka and Spark take seconds to start: launch them first, PostgreSQL meanwhile.
        try:
            for node in nodes:
                node.start()
            registry.start()
            if spark is not None:
                spark.start()
            postgres.start(timeout=timeout)
            if standby is not None:
                # After the base backup: the setting stays the primary's own (a promoted
                # standby that kept it would wait for a standby of its own at every COMMIT).
                standby.follow(postgres, timeout=timeout)
                postgres.replicate_synchronously(state.postgres_standby == "sync")
            for node in nodes:
                node.wait_ready(timeout=remaining())
            registry.wait_ready(timeout=remaining())
            if spark is not None:
                spark.wait_ready(timeout=remaining())
            if security is not None:
                security.grant_roles(nodes[0].bootstrap_servers, timeout=remaining())
        except BaseException:
            stop_kafka_nodes(nodes)
            registry.stop()
            if spark is not None:
                spark.stop()
            if standby is not None:
                standby.stop()
            postgres.stop()
            raise
        self._write_env(nodes, postgres, registry, spark, dsn=self.dsn(state))
        return self.status()

    def down(self) -> StackStatus:
        state = self._state(create=False)
        if state is not None:
            # Stop all even if one refuses: `down` must leave no process behind.
            spark, registry = self.spark(state), self.registry(state)
            try:
                if spark is not None:
                    spark.stop()
                if registry is not None:
                    registry.stop()
                stop_kafka_nodes(self.kafka_nodes(state))
            finally:
                standby = self.postgres_standby(state)
                if standby is not None:
                    standby.stop()
                self.postgres(state).stop()
        self.env_path.unlink(missing_ok=True)
        for role in _ROLE_FILES:
            role_env_file(self.env_path, role).unlink(missing_ok=True)
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
        nodes, postgres, spark = self.kafka_nodes(state), self.postgres(state), self.spark(state)
        registry = self.registry(state)
        return StackStatus(
            data_dir=self.data_dir,
            kafka_running=all(node.running() for node in nodes),
            kafka_pid=nodes[0].pid,
            bootstrap_servers=self.bootstrap_servers(nodes),
            postgres_running=postgres.running(),
            postgres_pid=postgres.pid,
            dsn=self.dsn(state),
            postgres_standby=_standby_status(self.postgres_standby(state)),
            kafka_nodes=tuple(
                NodeStatus(
                    node_id=node.node_id,
                    running=node.running(),
                    pid=node.pid,
                    address=node.bootstrap_servers,
                )
                for node in nodes
            ),
            spark_master=spark.master_url if spark else None,
            spark_daemons=tuple(
                NodeStatus(
                    node_id=n,
                    running=daemon.running(),
                    pid=daemon.pid,
                    address=f"127.0.0.1:{daemon.ports.rpc} (web UI :{daemon.ports.web_ui})",
                )
                for n, daemon in enumerate(spark.daemons() if spark else [])
            ),
            secure=state.secure,
            registry_running=registry is not None and registry.running(),
            registry_pid=registry.pid if registry else None,
            registry_url=registry.url if registry else None,
        )

    def _write_env(
        self,
        nodes: list[KafkaServer],
        postgres: PostgresServer,
        registry: RegistryServer,
        spark: SparkCluster | None,
        *,
        dsn: str,
    ) -> None:
        text = f"{ENV_KAFKA_BOOTSTRAP}={self.bootstrap_servers(nodes)}\n"
        text += f"{ENV_SCHEMA_REGISTRY_URL}={registry.url}\n"
        registry_properties = registry.client_properties()
        if registry_properties:  # the CA to verify it by: nothing secret
            properties = json.dumps(registry_properties, separators=(",", ":"))
            text += f"{ENV_SCHEMA_REGISTRY_PROPERTIES}='{properties}'\n"
        if postgres.security is None:
            text += f"{ENV_POSTGRES_DSN}={dsn}\n"
        if spark is not None:
            text += f"{ENV_SPARK_MASTER}={spark.master_url}\n"
        _write_atomically(self.env_path, text)
        if postgres.security is not None:
            # No credentials in stack.env: each role's own, as references to their files.
            for role in _ROLE_FILES:
                role_text = postgres.security.role_env(role, postgres_port=postgres.port)
                _write_atomically(role_env_file(self.env_path, role), role_text)


def _standby_status(standby: PostgresServer | None) -> NodeStatus | None:
    if standby is None:
        return None
    role = "standby" if standby.is_standby else "promoted"
    return NodeStatus(
        node_id=standby.port,
        running=standby.running(),
        pid=standby.pid,
        address=f"127.0.0.1:{standby.port} ({role})",
    )


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
