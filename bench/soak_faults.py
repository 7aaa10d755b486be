"""The soak's fault catalogue: every class of fault the pipeline must ride out, each injected for
a while and then healed. A fault is one call; the scheduler in `bench/soak.py` picks them.

Classes:
- `process-kill`: SIGKILL of the Spark driver (with its JVM), a consumer, the broker, or every
  PostgreSQL process at once (crash recovery on restart); down for a few seconds.
- `process-pause`: SIGSTOP, then SIGCONT, of the same processes: alive to the kernel, silent to
  everyone else.
- `postgres-link` / `kafka-link`: through Toxiproxy, a link gone silent without a reset (for
  Kafka, at times longer than the producer's transaction timeout), connections reset, latency on
  every packet.
- `database-refusal`: the database refuses writes: read-only as after a failover (25006), the
  table locked past the consumer's statement timeout (57014), too many connections for its
  role (53300).
- `bad-data`: poison records (dead letters, with their coordinates noted here for the final
  check), and a transaction that writes records and aborts (not one may reach a table).
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Message

from bench.soak_processes import Supervised, Supervisor, signal_tree, wait_for
from bridge_shell.stack.kafka import KafkaServer
from bridge_shell.stack.postgres import PostgresServer
from tests.kafka_helpers import transactional_producer
from tests.toxiproxy import Proxy

POISON_VALUES = (b"{not json", b"[1, 2, 3]", b'{"value": "not a number"}')


@dataclass
class Fault:
    cls: str
    kind: str
    started: float  # monotonic
    healed: float = 0.0
    detail: str = ""

    def as_json(self, origin: float) -> dict[str, Any]:
        return {
            "class": self.cls,
            "kind": self.kind,
            "at_s": round(self.started - origin, 1),
            "lasted_s": round(self.healed - self.started, 1),
            "detail": self.detail,
        }


@dataclass
class Pipeline:
    """What the faults act on."""

    kafka: KafkaServer
    postgres: PostgresServer
    kafka_proxy: Proxy
    postgres_proxy: Proxy
    driver: Supervised
    consumers: list[Supervised]
    supervisor: Supervisor
    admin_dsn: str  # a superuser, straight to the server (no proxy)
    consumer_role: str
    table: str
    topic: str
    bootstrap: str  # the proxy's address, which the broker advertises
    note: Callable[[str], None]
    poison: set[tuple[int, int]] = field(default_factory=set)  # (partition, offset)
    aborted_values: set[int] = field(default_factory=set)


Injector = Callable[[Pipeline, random.Random], tuple[str, str]]  # -> (kind, detail), once healed


# -- process-kill and process-pause ---------------------------------------------------------------


def _kill_process(p: Pipeline, rng: random.Random) -> tuple[str, str]:
    target = rng.choice(["driver", "consumer", "broker", "postgres"])
    down = rng.uniform(1, 8)
    if target in ("driver", "consumer"):
        process = p.driver if target == "driver" else rng.choice(p.consumers)
        with p.supervisor.holding(process):
            process.kill()
            time.sleep(down)
        return f"kill-{target}", f"{process.name} down {down:.1f}s"
    if target == "broker":
        pid = p.kafka.pid
        if pid is not None:
            signal_tree(pid, signal.SIGKILL)
            wait_for(lambda: not p.kafka.running(), timeout=30)
        time.sleep(down)
        p.kafka.start()
        return "kill-broker", f"down {down:.1f}s"
    pid = p.postgres.pid
    if pid is not None:
        signal_tree(pid, signal.SIGKILL)
    time.sleep(down)
    restart_postgres(p.postgres)
    return "kill-postgres", f"every process, down {down:.1f}s"


def restart_postgres(postgres: PostgresServer) -> None:
    """Start it again after a crash; the backends of the dead postmaster may take a moment to
    notice and let go of its shared memory, so a refused start is tried again."""
    deadline = time.monotonic() + 90
    while True:
        try:
            postgres.start(timeout=60)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def _pause_process(p: Pipeline, rng: random.Random) -> tuple[str, str]:
    target = rng.choice(["driver", "consumer", "broker", "postgres"])
    paused = rng.uniform(3, 20)
    if target in ("driver", "consumer"):
        process = p.driver if target == "driver" else rng.choice(p.consumers)
        process.pause()
        time.sleep(paused)
        process.resume()
        return f"pause-{target}", f"{process.name} {paused:.1f}s"
    pid = p.kafka.pid if target == "broker" else p.postgres.pid
    if pid is not None:
        signal_tree(pid, signal.SIGSTOP)
        time.sleep(paused)
        signal_tree(pid, signal.SIGCONT)
    return f"pause-{target}", f"{paused:.1f}s"


# -- links ----------------------------------------------------------------------------------------


def cut(proxies: list[Proxy], rng: random.Random, longest_silence: float) -> tuple[str, str]:
    """The links through `proxies` silent without a reset, reset, or slowed, for a while, then
    healed; (kind, detail)."""
    kind = rng.choice(["silent", "reset", "latency"])
    if kind == "silent":
        lasted = rng.uniform(5, longest_silence)
        for proxy in proxies:
            proxy.silence()
        detail = f"{lasted:.1f}s without a byte, no reset"
    elif kind == "reset":
        lasted = rng.uniform(0.5, 3)
        for proxy in proxies:
            proxy.reset_peer()
        detail = f"every connection reset for {lasted:.1f}s"
    else:
        lasted = rng.uniform(8, 20)
        ms = rng.choice([100, 300, 500])
        for proxy in proxies:
            proxy.latency(ms)
        detail = f"{ms} ms per packet for {lasted:.1f}s"
    time.sleep(lasted)
    for proxy in proxies:
        proxy.heal()
    return kind, detail


def _link(proxy_of: Callable[[Pipeline], Proxy], longest_silence: float) -> Injector:
    def inject(p: Pipeline, rng: random.Random) -> tuple[str, str]:
        kind, detail = cut([proxy_of(p)], rng, longest_silence)
        return f"link-{kind}", detail

    return inject


# -- database refusals ----------------------------------------------------------------------------


def _admin(p: Pipeline, statement: str) -> None:
    """A statement as the superuser; retried, since PostgreSQL may be in crash recovery."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with psycopg.connect(p.admin_dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(statement.encode())
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def set_read_only(p: Pipeline, on: bool) -> None:
    _admin(p, f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
    _admin(p, "SELECT pg_reload_conf()")


def set_connection_limit(p: Pipeline, limit: int) -> None:
    _admin(p, f"ALTER ROLE {p.consumer_role} CONNECTION LIMIT {limit}")


def _refuse(p: Pipeline, rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["read-only", "statement-timeout", "too-many-connections"])
    lasted = rng.uniform(5, 20)
    if kind == "read-only":
        set_read_only(p, True)
        time.sleep(lasted)
        set_read_only(p, False)
    elif kind == "too-many-connections":
        set_connection_limit(p, 0)
        # The limit binds at connect time: end the role's sessions, so that it must reconnect.
        _admin(
            p,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE usename = '{p.consumer_role}'",
        )
        time.sleep(lasted)
        set_connection_limit(p, -1)
    else:
        # A maintenance job holding the table: every write waits past the statement timeout.
        with psycopg.connect(p.admin_dsn, connect_timeout=5) as conn:
            conn.execute(f"LOCK TABLE {p.table} IN EXCLUSIVE MODE".encode())
            time.sleep(lasted)
            conn.rollback()
    return kind, f"{lasted:.1f}s"


# -- bad data -------------------------------------------------------------------------------------


def _bad_data(p: Pipeline, rng: random.Random) -> tuple[str, str]:
    producer = transactional_producer(p.bootstrap)
    delivered: list[Message] = []
    producer.begin_transaction()
    if rng.random() < 0.5:
        poison = rng.sample(POISON_VALUES, rng.randint(1, len(POISON_VALUES)))
        for raw in poison:
            producer.produce(p.topic, value=raw, on_delivery=lambda _e, m: delivered.append(m))
        producer.commit_transaction(60)
        coordinates = []
        for message in delivered:
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            coordinates.append((partition, offset))
        p.poison.update(coordinates)
        return "poison-records", f"{len(poison)} at (partition, offset) {coordinates}"
    first = -1 - len(p.aborted_values)
    aborted = list(range(first, first - rng.randint(1, 50), -1))
    for value in aborted:
        producer.produce(p.topic, value=json.dumps({"value": value}).encode())
    producer.flush(60)
    producer.abort_transaction(60)
    p.aborted_values.update(aborted)
    return "aborted-transaction", f"{len(aborted)} records, values {aborted[-1]}..{aborted[0]}"


CATALOGUE: dict[str, Injector] = {
    "process-kill": _kill_process,
    "process-pause": _pause_process,
    "postgres-link": _link(lambda p: p.postgres_proxy, longest_silence=40),
    # Up to 35 s: beyond the producer's 20 s transaction timeout, which the broker then enforces.
    "kafka-link": _link(lambda p: p.kafka_proxy, longest_silence=35),
    "database-refusal": _refuse,
    "bad-data": _bad_data,
}


def heal_everything(p: Pipeline) -> None:
    """Whatever a fault may have left behind when the run ends or fails mid-fault."""
    for proxy in (p.kafka_proxy, p.postgres_proxy):
        proxy.heal()
    for pid in (p.kafka.pid, p.postgres.pid):
        if pid is not None:
            signal_tree(pid, signal.SIGCONT)
    for process in (p.driver, *p.consumers):
        process.resume()
    if not p.postgres.running():
        restart_postgres(p.postgres)
    set_read_only(p, False)
    set_connection_limit(p, -1)
    if not p.kafka.running():
        p.kafka.start()
