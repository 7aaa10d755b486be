"""The local stack: one Kafka node and one PostgreSQL cluster under a data directory.

`up` is idempotent: ports and the cluster id are chosen once and kept in `stack.json`, so a
restarted stack keeps its addresses and its data; `stack.env` tells clients where to connect.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
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
class StackStatus:
    data_dir: Path
    kafka_running: bool
    kafka_pid: int | None
    bootstrap_servers: str | None
    postgres_running: bool
    postgres_pid: int | None
    dsn: str | None

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
    ) -> None:
        self.data_dir = data_dir.resolve()
        self._requested_kafka_port = kafka_port
        self._requested_postgres_port = postgres_port
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

    def state(self) -> StackState:
        """The saved state of a stack that has been brought up at least once."""
        state = self._state(create=False)
        if state is None:
            raise StackError(f"no stack in {self.data_dir}: run `bridge stack up` first")
        return state

    def kafka(self, state: StackState) -> KafkaServer:
        return KafkaServer(
            home=self.data_dir / "kafka",
            ports=KafkaPorts(broker=state.kafka_port, controller=state.controller_port),
            cluster_id=state.cluster_id,
        )

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
        kafka, postgres = self.kafka(state), self.postgres(state)
        started = time.monotonic()
        # Kafka takes seconds to start: launch it first and bring PostgreSQL up meanwhile.
        kafka.start()
        try:
            postgres.start(timeout=timeout)
            kafka.wait_ready(timeout=max(5.0, timeout - (time.monotonic() - started)))
        except BaseException:
            kafka.stop()
            postgres.stop()
            raise
        self._write_env(kafka, postgres)
        return self.status()

    def down(self) -> StackStatus:
        state = self._state(create=False)
        if state is not None:
            # Stop both even if the first refuses: `down` must leave no process behind.
            try:
                self.kafka(state).stop()
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
        kafka, postgres = self.kafka(state), self.postgres(state)
        return StackStatus(
            data_dir=self.data_dir,
            kafka_running=kafka.running(),
            kafka_pid=kafka.pid,
            bootstrap_servers=kafka.bootstrap_servers,
            postgres_running=postgres.running(),
            postgres_pid=postgres.pid,
            dsn=postgres.dsn,
        )

    def _write_env(self, kafka: KafkaServer, postgres: PostgresServer) -> None:
        text = (
            f"{ENV_KAFKA_BOOTSTRAP}={kafka.bootstrap_servers}\n{ENV_POSTGRES_DSN}={postgres.dsn}\n"
        )
        tmp = self.env_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.env_path)
