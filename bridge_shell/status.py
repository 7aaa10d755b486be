"""`bridge status`: the pipeline's health at a glance, gathered from the outside.

Each part is asked the way an operator would: the brokers through Kafka's metadata, PostgreSQL
with a query, each consumer through its `/readyz`, each consumer group through its stored
offsets against Kafka's log, each producer through its epoch markers. Every question has a
bound, so a dead part makes a red line, never a hang. `problems` is what makes the command
exit non-zero, so it can serve as a probe.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from bridge.errors import BridgeError
from bridge.kafka_admin import KafkaAdmin, TopicError
from bridge.kafka_client_log import ClientLog
from bridge.names import MARKER_GROUP_INFIX
from consumers import LedgerNames, Position, age_s, database_now, open_epochs, read_positions
from spark_jobs.txn_admin import PartitionEpoch, committed_epochs

_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Component:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class GroupStatus:
    group: str
    lag: int | None  # None: Kafka could not tell for some partition
    partitions: int
    stalled: tuple[str, ...]  # "topic[partition]: why"
    # Not judged: nothing committed for longer than `--ignore-idle-after` (an abandoned group);
    # its lines are shown, not counted as problems.
    idle_s: float | None = None


@dataclass(frozen=True)
class ProducerStatus:
    prefix: str
    epochs: tuple[PartitionEpoch, ...]


@dataclass
class Status:
    components: list[Component] = field(default_factory=list)
    groups: list[GroupStatus] = field(default_factory=list)
    producers: list[ProducerStatus] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        found = [f"{c.name}: {c.detail}" for c in self.components if not c.ok]
        found += [
            f"group {g.group}: {s}" for g in self.groups if g.idle_s is None for s in g.stalled
        ]
        found += [
            f"producer {p.prefix} partition {e.partition}: {e.problem}"
            for p in self.producers
            for e in p.epochs
            if e.problem
        ]
        return found

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "problems": self.problems,
            "components": [vars(c) for c in self.components],
            "groups": [
                {
                    "group": g.group,
                    "lag": g.lag,
                    "partitions": g.partitions,
                    "stalled": list(g.stalled),
                    "ignored_idle_s": g.idle_s,
                }
                for g in self.groups
            ],
            "producers": [
                {
                    "prefix": p.prefix,
                    "epochs": [
                        {"partition": e.partition, "epoch": e.epoch, "problem": e.problem}
                        for e in p.epochs
                    ],
                }
                for p in self.producers
            ],
        }


def gather(
    *,
    kafka_config: dict[str, Any],
    dsn: str,
    schema: str,
    consumers: list[str],
    prefixes: list[str] | None,
    marker_topic: str,
    stall_after: timedelta,
    whole_topic: Callable[[str], bool] = lambda topic: True,
    groups: list[str] | None = None,
    idle_after: timedelta | None = None,
    registry: dict[str, str] | None = None,
) -> Status:
    """`whole_topic`: which topics wait for whole epochs (the configuration's routes); an
    epoch open longer than `stall_after` is a group's problem, naming what it lacks. `groups`:
    only these are shown and judged; `idle_after`: a group with nothing committed for longer
    is shown but not judged (one left behind by a test or a retired pipeline). `registry`: the
    schema registry's client configuration (`url` and its properties), when one is set."""
    status = Status()
    kafka_ok = _brokers(status, kafka_config)
    conn = _postgres(status, dsn)
    if registry is not None:
        status.components.append(_registry(registry))
    for url in consumers:
        status.components.append(_readiness(url))
    admin = KafkaAdmin(kafka_config, timeout=_TIMEOUT_S) if kafka_ok else None
    if conn is not None:
        with conn:
            if admin is not None:
                try:
                    positions = read_positions(conn, schema, admin, None)
                except BridgeError as exc:  # no offsets table in that schema, and the like
                    status.components.append(Component("consumer groups", False, str(exc)))
                else:
                    if groups is not None:
                        positions = [p for p in positions if p.group in groups]
                    status.groups = _groups(positions, stall_after)
                    status.groups = _incomplete_epochs(
                        conn, schema, status.groups, stall_after, whole_topic
                    )
                    if idle_after is not None:
                        status.groups = _idle(positions, status.groups, idle_after)
    if admin is not None:
        try:
            for prefix in prefixes if prefixes is not None else _prefixes(admin):
                epochs = committed_epochs(admin, prefix, marker_topic)
                status.producers.append(ProducerStatus(prefix, tuple(epochs)))
        except TopicError as exc:  # the groups could not be listed: say so, never "healthy"
            status.components.append(Component("producers", False, str(exc)))
    return status


def _brokers(status: Status, config: dict[str, Any]) -> bool:
    log = ClientLog()
    admin = AdminClient({**config, "logger": log.logger})  # type: ignore[dict-item]
    try:
        metadata = admin.list_topics(timeout=_TIMEOUT_S)
    except KafkaException as exc:
        detail = f"unreachable: {exc.args[0].str()}{log.cause(admin)}"
        status.components.append(Component("kafka", False, detail))
        return False
    for broker in sorted(metadata.brokers.values(), key=lambda b: b.id):
        where = f"{broker.host}:{broker.port}"
        leader = "controller" if broker.id == metadata.controller_id else "broker"
        status.components.append(Component(f"kafka broker {broker.id}", True, f"{leader} {where}"))
    return True


def _postgres(status: Status, dsn: str) -> psycopg.Connection[Any] | None:
    conn = None
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=int(_TIMEOUT_S))
        row = conn.execute("SELECT current_setting('server_version')").fetchone()
    except psycopg.Error as exc:
        if conn is not None:
            conn.close()
        status.components.append(Component("postgresql", False, str(exc).strip().splitlines()[0]))
        return None
    status.components.append(Component("postgresql", True, f"version {row[0] if row else '?'}"))
    return conn


def _registry(config: dict[str, str]) -> Component:
    """The schema registry, asked for its subjects as the consumer's client would ask it."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    name = f"schema registry {config['url']}"
    try:
        with SchemaRegistryClient(
            {**config, "timeout": int(_TIMEOUT_S), "max.retries": 0}
        ) as client:
            subjects = client.get_subjects()
    except Exception as exc:  # noqa: BLE001 - its errors are many (HTTP, TLS, auth): all a red line
        return Component(name, False, f"not answering: {exc}")
    return Component(name, True, f"{len(subjects)} subject(s)")


def _readiness(url: str) -> Component:
    """A consumer's `/readyz`: 200 ready, 503 with its reasons, or not answering."""
    name = f"consumer {url}"
    if not url.startswith(("http://", "https://")):
        return Component(name, False, "not an http:// or https:// address")
    readyz = f"{url.rstrip('/')}/readyz"
    try:
        with urllib.request.urlopen(readyz, timeout=_TIMEOUT_S) as answer:  # noqa: S310 - checked
            return Component(name, True, answer.read().decode().strip() or "ready")
    except urllib.error.HTTPError as exc:
        reasons = exc.read().decode().strip().replace("\n", "; ")
        return Component(name, False, f"not ready: {reasons}")
    except OSError as exc:
        return Component(name, False, f"not answering: {getattr(exc, 'reason', exc)}")


def _groups(positions: list[Position], stall_after: timedelta) -> list[GroupStatus]:
    now = datetime.now(UTC)
    groups = []
    for group in sorted({p.group for p in positions}):
        mine = [p for p in positions if p.group == group]
        stalled = []
        for p in mine:
            where = f"{p.topic}[{p.partition}]"
            if p.out_of_range:
                stalled.append(f"{where}: stored offset {p.next_offset} is outside the log")
            elif p.lag and now - p.updated_at > stall_after:
                idle = (now - p.updated_at).total_seconds()
                stalled.append(f"{where}: {p.lag} behind and nothing committed for {idle:.0f}s")
        lags = [p.lag for p in mine]
        groups.append(
            GroupStatus(
                group=group,
                lag=None if None in lags else sum(lag or 0 for lag in lags),
                partitions=len(mine),
                stalled=tuple(stalled),
            )
        )
    return groups


def _idle(
    positions: list[Position], groups: list[GroupStatus], idle_after: timedelta
) -> list[GroupStatus]:
    """The groups whose last commit, on any partition, is older than `idle_after`, marked."""
    now = datetime.now(UTC)
    marked = []
    for group in groups:
        last = max(p.updated_at for p in positions if p.group == group.group)
        idle = now - last
        marked.append(replace(group, idle_s=idle.total_seconds()) if idle > idle_after else group)
    return marked


def _incomplete_epochs(
    conn: psycopg.Connection[Any],
    schema: str,
    groups: list[GroupStatus],
    stall_after: timedelta,
    whole_topic: Callable[[str], bool],
) -> list[GroupStatus]:
    """Each group's epochs open for longer than `stall_after`, added to its stalled lines."""
    found = []
    for group in groups:
        try:
            states = open_epochs(conn, LedgerNames(schema), group.group)
        except psycopg.errors.UndefinedTable:  # a state schema of a release before the ledger
            return groups
        now = database_now(conn)
        late = [
            s.held_too_long(whole_topic, age_s(s, now))
            for s in states
            if age_s(s, now) > stall_after.total_seconds()
        ]
        found.append(replace(group, stalled=(*group.stalled, *late)))
    return found


def _prefixes(admin: KafkaAdmin) -> list[str]:
    """Every producer that has committed an epoch: the prefixes of the marker groups."""
    groups = admin.group_ids("")
    return sorted({g[: g.rindex(MARKER_GROUP_INFIX)] for g in groups if MARKER_GROUP_INFIX in g})
