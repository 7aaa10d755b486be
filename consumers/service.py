"""The long-running consumer: read_committed records -> one PostgreSQL transaction per batch
holding the fenced offset advance and the rows together."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import chain, groupby
from typing import Any, TypeVar, cast

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from sqlalchemy import Engine, create_engine

from bridge.settings import BridgeSettings, ConsumerSettings, LibrdkafkaValue
from consumers.applier import Applier, Step
from consumers.flight import Flight
from consumers.metrics import ConsumerMetrics, HealthServer
from consumers.offsets import Lease, OffsetStore, PartitionKey, application_name
from consumers.records import Record, offset_of
from consumers.state import ensure_state_tables, state_tables
from consumers.targets import Target, reflect_target

log = logging.getLogger("bridge.consumer")

_RECONNECT_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)
_RECONNECT_ATTEMPTS = 60  # about five minutes at the longest delay, then give up loudly
# Fetch tuning the user may override in kafka.properties. librdkafka stops fetching a partition
# once queued.min.messages (100,000) are queued locally, then waits fetch.queue.backoff.ms, 1 s by
# default, before it fetches again, although the loop drains that queue in a fraction of it:
# catching up after downtime crawled at about 170k records/s with the process mostly idle.
CONSUMER_FETCH_DEFAULTS: dict[str, LibrdkafkaValue] = {"fetch.queue.backoff.ms": 10}
_STATISTICS_INTERVAL_MS = 5_000  # how often librdkafka reports the last stable offsets (lag)
_RECONCILE_INTERVAL_S = 1.0  # how often leases are compared with the offsets table
_STALLED_AFTER_S = 60.0  # /healthz fails when the poll loop has not turned for this long
T = TypeVar("T")


class PartitionFenced(Exception):
    """The fenced offset update matched no row: another owner holds the partitions now."""

    def __init__(self, keys: list[PartitionKey]) -> None:
        self.keys = keys
        super().__init__(", ".join(f"{t}[{p}]" for t, p in keys) + " no longer ours")


@dataclass(frozen=True)
class _Sent:
    """A batch whose transaction is on its way (see `consumers.flight`)."""

    flight: Flight
    by_partition: dict[PartitionKey, list[Record]]
    advanced: dict[PartitionKey, int]
    applied: dict[str, tuple[int, int]]  # per topic: rows written, dead letters
    started: float


def _next_offsets(by_partition: dict[PartitionKey, list[Record]]) -> dict[PartitionKey, int]:
    """Where each partition goes once the batch commits: after its last record."""
    return {key: offset_of(records[-1]) + 1 for key, records in by_partition.items()}


def sqlalchemy_engine(dsn: str) -> Engine:
    """An engine over psycopg for DDL and reflection; takes URL and key=value DSNs alike."""
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))


class ConsumerService:
    def __init__(self, settings: BridgeSettings, *, owner: str | None = None) -> None:
        self._settings = settings
        self._config: ConsumerSettings = settings.require_consumer()
        self._dsn = settings.postgres.dsn.get_secret_value()
        self._owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._tables = state_tables(self._config.state_schema)
        self._store = OffsetStore(
            tables=self._tables, group_id=self._config.group_id, owner=self._owner
        )
        self._applier = Applier(tables=self._tables, group_id=self._config.group_id)
        self._leases: dict[PartitionKey, Lease] = {}
        self._out_of_range: set[PartitionKey] = set()
        # Assigned to this member by Kafka but paused: fenced by another owner, or out of range.
        self._held_idle: set[PartitionKey] = set()
        self._next_reconcile = 0.0
        self._delivered: dict[PartitionKey, int] = {}  # last offset Kafka handed us, + 1
        self._targets: dict[str, Target] = {}
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._sent: _Sent | None = None
        self._behind = False  # the last poll filled a batch: more records are waiting
        self._rewinds = 0  # how many times the positions went back to the stored offsets
        self._consumer: Consumer | None = None
        self.applied_total = 0
        self.metrics = ConsumerMetrics(self._config.group_id)
        self._http: HealthServer | None = None
        self._last_turn = time.monotonic()

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Create the state tables, check every route's table, join the group. Refuses a bad
        configuration (missing table or column) before consuming anything."""
        engine = sqlalchemy_engine(self._dsn)
        try:
            with engine.connect() as conn:
                ensure_state_tables(conn, self._tables)
            self._targets = {
                route.topic: reflect_target(engine, route, index)
                for index, route in enumerate(self._config.routes)
            }
        finally:
            engine.dispose()
        self._conn = self._connect()
        # Positions come from the database only: nothing is committed to Kafka, and a fetch
        # outside the log is an error rather than a jump.
        overrides: dict[str, LibrdkafkaValue] = {
            "group.id": self._config.group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": "cooperative-sticky",
            "auto.offset.reset": "error",
            "statistics.interval.ms": _STATISTICS_INTERVAL_MS,
        }
        config: dict[str, Any] = self._settings.kafka.client_config(
            defaults=CONSUMER_FETCH_DEFAULTS, **overrides
        )
        config["stats_cb"] = self._on_statistics
        config["on_commit"] = self._on_mirror_commit
        self._consumer = Consumer(config)
        self._consumer.subscribe(
            list(self._targets),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        if self._config.http_port is not None:
            self._http = HealthServer(
                self.metrics,
                host=self._config.http_host,
                port=self._config.http_port,
                healthy=self.healthy,
                ready=lambda: self.ready,
            )
            self._http.start()
        log.info(
            "consumer started",
            extra={
                "owner": self._owner,
                "topics": list(self._targets),
                "http_port": self.http_port,
            },
        )

    def stop(self) -> None:
        """Ask the loop to stop after the batch in hand (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> None:
        """Consume until `stop`; then leave the group and close."""
        assert self._consumer is not None, "start() first"  # noqa: S101
        try:
            while not self._stop.is_set():
                self._last_turn = time.monotonic()
                if self._last_turn >= self._next_reconcile:
                    self._next_reconcile = self._last_turn + _RECONCILE_INTERVAL_S
                    self._reconcile()
                if not self._behind:
                    self._settle()  # caught up: nothing to overlap the commit with
                rewinds = self._rewinds
                messages = self._consumer.consume(
                    self._config.batch_max_records, self._config.batch_max_wait_ms / 1000
                )
                self._behind = len(messages) >= self._config.batch_max_records
                if any(map(Message.error, messages)):  # one C loop; errors are rare
                    for message in messages:
                        if message.error() is not None:
                            self._kafka_error(message.error())
                    messages = [m for m in messages if m.error() is None]
                if messages:
                    self._apply(messages, rewinds)
                else:
                    self._settle()
        finally:
            self.close()

    @staticmethod
    def _kafka_error(error: KafkaError | None) -> None:
        if error is not None and error.fatal():
            raise KafkaException(error)
        log.warning("kafka error: %s", error.str() if error is not None else None)

    def close(self) -> None:
        try:
            self._settle()  # the batch in flight commits or is rolled back before we leave
        finally:
            if self._http is not None:
                self._http.stop()
                self._http = None
            if self._consumer is not None:
                self._consumer.close()  # leaves the group: partitions are revoked and released
                self._consumer = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def ready(self) -> bool:
        return self._consumer is not None and not self._out_of_range

    def healthy(self) -> bool:
        """The poll loop turns (a database outage past the reconnect budget stops it)."""
        return time.monotonic() - self._last_turn < max(
            _STALLED_AFTER_S, 3 * self._config.batch_max_wait_ms / 1000
        )

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http is not None else None

    # -- one batch ----------------------------------------------------------------------------

    def _apply(self, records: list[Record], rewinds: int) -> None:
        """Write a polled batch. `rewinds`: the count before the poll that returned it."""
        by_partition = self._ours(records)
        # Decoded while the batch before is still in flight: its commit costs no waiting.
        plans = self._plans(by_partition)
        settled = self._settle()
        if self._rewinds != rewinds:
            # The positions went back to the stored offsets, here or in a rebalance callback
            # inside the poll: some of these records may come from before that. Drop them all,
            # and go back once more, so that none fetched since is skipped either.
            self._seek_to_leases()
            return
        if not settled:
            by_partition = self._ours(records)  # leases moved: look again
            plans = self._plans(by_partition)
        self._write(by_partition, plans)

    def _ours(self, records: list[Record]) -> dict[PartitionKey, list[Record]]:
        """The records of partitions this member holds, not yet applied, by partition."""
        by_partition: dict[PartitionKey, list[Record]] = defaultdict(list)
        # A partition's records come in runs, in offset order: the bookkeeping is per run, and
        # the runs are found by C loops over the records.
        for topic, of_topic in groupby(records, Message.topic):
            for partition, grouped in groupby(of_topic, Message.partition):
                key = cast(PartitionKey, (topic, partition))  # consumed: neither is None
                run = list(grouped)
                self._delivered[key] = offset_of(run[-1]) + 1
                lease = self._leases.get(key)
                if lease is None:
                    continue  # a partition we let go of: its records are not ours
                if offset_of(run[0]) < lease.next_offset:  # below what is already committed
                    run = [record for record in run if offset_of(record) >= lease.next_offset]
                by_partition[key].extend(run)
        return by_partition

    def _plans(
        self, by_partition: dict[PartitionKey, list[Record]]
    ) -> dict[str, list[Step]] | None:
        """Each topic's statements, when every record is a row; else None."""
        plans = {}
        for topic, records in self._by_topic(by_partition).items():
            plan = self._applier.plan(self._targets[topic], records)
            if plan is None:
                return None
            plans[topic] = plan
        return plans

    @staticmethod
    def _by_topic(by_partition: dict[PartitionKey, list[Record]]) -> dict[str, list[Record]]:
        by_topic: dict[str, list[Record]] = defaultdict(list)
        for key, records in by_partition.items():
            by_topic[key[0]].extend(records)
        return by_topic

    def _write(
        self,
        by_partition: dict[PartitionKey, list[Record]],
        plans: dict[str, list[Step]] | None,
    ) -> None:
        """Send the batch as one message when it is all rows; else, or when that is refused,
        write it statement by statement, which tells which partition or record was refused."""
        while by_partition:
            try:
                if plans is not None:
                    self._send(by_partition, plans)
                else:
                    self._commit_batch(by_partition)
                return
            except PartitionFenced as fenced:
                log.warning("partitions fenced, letting them go", extra={"partitions": fenced.keys})
                for key in fenced.keys:
                    by_partition.pop(key, None)
                self._let_go(fenced.keys)
            except psycopg.OperationalError as exc:
                self._connection_lost(exc)
                return

    def _send(
        self, by_partition: dict[PartitionKey, list[Record]], plans: dict[str, list[Step]]
    ) -> None:
        """The batch's transaction as one message (see `consumers.flight`); `_settle` reads
        its outcome."""
        conn = self._connection()
        advanced = _next_offsets(by_partition)
        advance = self._store.advance_statement(
            [(self._leases[key], offset) for key, offset in advanced.items()], strict=True
        )
        steps = list(chain.from_iterable(plans.values()))
        applied = {
            topic: (sum(len(step.rows) for step in plan if step.rows is not None), 0)
            for topic, plan in plans.items()
        }
        started = time.perf_counter()
        # The server ends a statement after db_session_timeout_ms; silence for longer than
        # twice that is a dead connection.
        timeout_s = 2 * self._config.db_session_timeout_ms / 1000
        flight = Flight(conn, steps, advance=advance, timeout_s=timeout_s)
        self._sent = _Sent(flight, by_partition, advanced, applied, started)

    def _settle(self) -> bool:
        """Wait for the batch in flight, if any. True when the leases are as its sending
        expected: it committed, or there was none. False when it was written again statement
        by statement, or when its connection was lost (the positions then went back to the
        stored offsets)."""
        sent, self._sent = self._sent, None
        if sent is None:
            return True
        try:
            refusal = sent.flight.finish()
            if refusal is None:
                self._committed(sent.by_partition, sent.advanced, sent.applied, sent.started)
                return True
            log.info("batch refused as a whole, writing it statement by statement: %s", refusal)
            assert self._conn is not None  # noqa: S101 - the flight went over it
            self._conn.execute("ROLLBACK")
        except psycopg.OperationalError as exc:
            self._connection_lost(exc)
            return False
        self._write(sent.by_partition, None)
        return False

    def _commit_batch(self, by_partition: dict[PartitionKey, list[Record]]) -> None:
        """One database transaction for the whole batch, statement by statement.

        Step 1: per partition, the fenced offset advance (owner epoch and expected offset).
        Step 2: per route, the rows, and the dead letters of records that cannot be rows.
        Step 3: the commit; only then do the in-memory leases move.
        """
        conn = self._connection()
        started = time.perf_counter()
        advanced = _next_offsets(by_partition)
        applied: dict[str, tuple[int, int]] = {}
        with conn.transaction():
            # Step 1
            fenced = self._store.advance(
                conn, [(self._leases[key], offset) for key, offset in advanced.items()]
            )
            if fenced:
                raise PartitionFenced(fenced)
            # Step 2
            for topic, records in self._by_topic(by_partition).items():
                counts = self._applier.apply(conn, self._targets[topic], records)
                applied[topic] = (counts.applied + counts.deleted, counts.dead)
        # Step 3
        self._committed(by_partition, advanced, applied, started)

    def _committed(
        self,
        by_partition: dict[PartitionKey, list[Record]],
        advanced: dict[PartitionKey, int],
        applied: dict[str, tuple[int, int]],
        started: float,
    ) -> None:
        """After a batch's commit: the leases move, the mirror and the metrics follow."""
        for key, next_offset in advanced.items():
            self._leases[key] = replace(self._leases[key], next_offset=next_offset)
        if self._config.mirror_offsets_to_kafka and self._consumer is not None:
            try:
                self._consumer.commit(
                    offsets=[TopicPartition(t, p, offset) for (t, p), offset in advanced.items()],
                    asynchronous=True,
                )
            except KafkaException as exc:
                log.warning("mirroring offsets to the Kafka group failed: %s", exc)
        for topic, (rows, dead) in applied.items():
            self.applied_total += rows
            self.metrics.records_applied(topic).inc(rows)
            self.metrics.dead_letters(topic).inc(dead)
        self.metrics.committed(
            list(chain.from_iterable(by_partition.values())), time.perf_counter() - started
        )

    # -- rebalance callbacks (run inside consume) -----------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._settle()
        keys = [(tp.topic, tp.partition) for tp in partitions]
        leases, low = self._claim_at_watermarks(consumer, keys)
        consumer.incremental_assign(
            [TopicPartition(lease.topic, lease.partition, lease.next_offset) for lease in leases]
        )
        self._take(consumer, leases, low)
        log.info("assigned %s", [(x.topic, x.partition, x.next_offset) for x in leases])

    def _claim_at_watermarks(
        self, consumer: Consumer, keys: list[PartitionKey]
    ) -> tuple[list[Lease], dict[PartitionKey, int]]:
        watermarks = {
            key: consumer.get_watermark_offsets(TopicPartition(*key), timeout=10, cached=False)
            for key in keys
        }
        leases = self._with_database(lambda conn: self._claim(conn, keys, watermarks))
        return leases, {key: low for key, (low, _) in watermarks.items()}

    def _take(self, consumer: Consumer, leases: list[Lease], low: dict[PartitionKey, int]) -> None:
        """Start consuming freshly claimed partitions, unless their stored offset is gone."""
        for lease in leases:
            self._leases[lease.key] = lease
            self._held_idle.discard(lease.key)
            self._out_of_range.discard(lease.key)
        # A partition this member paused after being fenced (a zombie that woke up) keeps its
        # pause flag in librdkafka across unassign/assign: a fresh claim must flow again.
        consumer.resume([TopicPartition(lease.topic, lease.partition) for lease in leases])
        for lease in leases:
            if lease.next_offset < low[lease.key]:
                # Never a silent jump: the partition stays paused until an operator resets it.
                self._out_of_range.add(lease.key)
                self._held_idle.add(lease.key)
                consumer.pause([TopicPartition(lease.topic, lease.partition)])
                log.error(
                    "stored offset %d of %s[%d] is below the log start %d: records were lost "
                    "before they were applied; partition paused (see `bridge offsets reset`)",
                    lease.next_offset, lease.topic, lease.partition, low[lease.key],
                )  # fmt: skip

    def _reconcile(self) -> None:
        """Follow what the database says about the partitions Kafka gave this member.

        A lease whose owner epoch moved on was taken by someone else; an idle member would only
        notice at its next batch, so it is checked here. A partition whose row has no owner
        (an operator's `offsets reset` clears it, as does a clean release by a member that had
        taken it over) is claimed again and consumed from its stored offset; that includes the
        partitions this member paused after a fence or because their offset was out of range."""
        self._settle()
        consumer = self._consumer
        keys = sorted(set(self._leases) | self._held_idle)
        if consumer is None or not keys:
            return
        rows = self._with_database(lambda conn: self._store.owners(conn, keys))
        released, taken = [], []
        for key in keys:
            epoch, owner = rows.get(key, (None, None))
            lease = self._leases.get(key)
            if owner is None and (lease is None or epoch != lease.epoch):
                released.append(key)
            elif lease is not None and epoch != lease.epoch:
                taken.append(key)
        if taken:
            log.warning("partitions taken by another owner, letting them go: %s", taken)
            self._let_go(taken)
        if not released:
            return
        leases, low = self._claim_at_watermarks(consumer, released)
        # Assigned afresh rather than sought: a partition whose fetch failed (offset out of range
        # with auto.offset.reset=error) refuses a seek, and a new assignment also drops anything
        # fetched from the old position.
        consumer.incremental_unassign([TopicPartition(*key) for key in released])
        consumer.incremental_assign(
            [TopicPartition(lease.topic, lease.partition, lease.next_offset) for lease in leases]
        )
        self._take(consumer, leases, low)
        log.info("claimed again %s", [(x.topic, x.partition, x.next_offset) for x in leases])

    def _claim(
        self,
        conn: psycopg.Connection[Any],
        keys: list[PartitionKey],
        watermarks: dict[PartitionKey, tuple[int, int]],
    ) -> list[Lease]:
        stored = self._store.stored(conn, keys)
        starts = {}
        for key in keys:
            low, high = watermarks[key]
            policy_start = low if self._config.start_policy == "earliest" else high
            starts[key] = stored.get(key, policy_start)
        return self._store.claim(conn, starts, lock_wait_ms=self._config.db_session_timeout_ms // 2)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._settle()  # the batch in flight holds records of these partitions
        keys = [(tp.topic, tp.partition) for tp in partitions]
        leases = [self._leases[k] for k in keys if k in self._leases]
        self._forget(keys)
        # Releasing only clears `owner` for the operator tools; the owner epoch fences us either
        # way. So it is not worth a reconnect here (which, while stopping, would abort close()).
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                self._store.release(conn, leases)
            except psycopg.OperationalError as exc:
                log.warning("could not mark revoked partitions unowned: %s", exc)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._settle()
        self._forget([(tp.topic, tp.partition) for tp in partitions])
        consumer.incremental_unassign(partitions)

    def _forget(self, keys: list[PartitionKey]) -> None:
        for key in keys:
            self._leases.pop(key, None)
            self._delivered.pop(key, None)
            self._out_of_range.discard(key)
            self._held_idle.discard(key)
        self.metrics.forget(keys)

    def _on_mirror_commit(self, error: Any, partitions: list[TopicPartition]) -> None:
        # The mirror is for outside tools only; a failed or refused commit (a partition that
        # just moved to another member) changes nothing here.
        if error is not None:
            log.warning("mirroring offsets to the Kafka group failed: %s", error)

    def _on_statistics(self, report: str) -> None:
        next_offsets = {key: lease.next_offset for key, lease in self._leases.items()}
        caught_up = {
            key for key, offset in next_offsets.items() if self._delivered.get(key, 0) <= offset
        }
        self.metrics.statistics(report, next_offsets, caught_up)

    def _let_go(self, keys: list[PartitionKey]) -> None:
        self._forget(keys)
        self._held_idle.update(keys)
        if self._consumer is not None:
            self._consumer.pause([TopicPartition(*key) for key in keys])

    # -- database connection ------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        # A member paused in the middle of a batch (GC, SIGSTOP, a frozen VM) holds the row locks
        # of its offsets; the member that takes its partitions over would wait on them forever.
        # PostgreSQL ends such a session after the timeout, which frees the locks; the paused
        # member finds its connection gone when it wakes and its batch rolled back.
        timeout = self._config.db_session_timeout_ms
        return psycopg.connect(
            self._dsn,
            autocommit=True,
            application_name=application_name(self._config.group_id),
            options=f"-c idle_in_transaction_session_timeout={timeout}"
            f" -c statement_timeout={timeout}",
        )

    def _connection(self) -> psycopg.Connection[Any]:
        """The connection, with no batch in flight on it."""
        self._settle()
        if self._conn is None or self._conn.closed:
            self._reconnect()
        assert self._conn is not None  # noqa: S101
        return self._conn

    def _reconnect(self) -> None:
        """Reconnect with bounded backoff; give up (and so exit non-zero) when it stays down."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        for attempt in range(_RECONNECT_ATTEMPTS):
            if self._stop.is_set():
                raise RuntimeError("stopping while the database is unreachable")
            try:
                self._conn = self._connect()
                log.info("database reconnected after %d attempt(s)", attempt + 1)
                return
            except psycopg.OperationalError as exc:
                delay = _RECONNECT_DELAYS[min(attempt, len(_RECONNECT_DELAYS) - 1)]
                log.warning("database unreachable (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
        raise RuntimeError(f"database unreachable after {_RECONNECT_ATTEMPTS} attempts")

    def _with_database(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run `work`; if the connection drops, reconnect (itself bounded) and run it once more.
        A second failure propagates: the service exits and its supervisor restarts it."""
        try:
            return work(self._connection())
        except psycopg.OperationalError as exc:
            log.error("database connection lost: %s", exc)
            self._reconnect()
            return work(self._connection())

    def _connection_lost(self, exc: psycopg.OperationalError) -> None:
        """The open batch rolled back with the connection: reconnect, fetch it again."""
        log.error("database connection lost: %s", exc)
        self._reconnect()
        self._seek_to_leases()

    def _seek_to_leases(self) -> None:
        """After a rollback, fetch again from what the database says is committed."""
        self._rewinds += 1
        if self._consumer is None:
            return
        for lease in self._leases.values():
            self._consumer.seek(TopicPartition(lease.topic, lease.partition, lease.next_offset))
