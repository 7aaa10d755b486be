"""The partitions Kafka gives this member, kept in step with the offsets table.

Kafka decides which member should hold a partition; the offsets table decides which member
may write it (the owner epoch). This module claims partitions on assignment and releases them
on revocation (the rebalance callbacks, run inside `consume`), compares the leases with the
table once a second (`reconcile`), and pauses a partition Kafka will not fetch from its stored
offset. Each of these reaches the batch in flight through one entry point, `_batch_settled_first`,
then moves the partitions' states (`consumers.partitions`) and the consumer's positions:
assigned, paused, resumed.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition

from bridge.settings import ConsumerSettings
from consumers.batch.lifecycle import BatchLifecycle
from consumers.database.db_session import DatabaseSession, is_lost, refusal_of
from consumers.database.offsets import Lease, OffsetStore, PartitionKey, StoredRow
from consumers.partitions import PartitionState, PartitionTable, out_of_range_reason

log = logging.getLogger("bridge.consumer")

# How long a partition's log range (the watermarks) is asked for: on assignment, inside the
# rebalance callback; then again from each reconcile, inside the poll loop.
_RANGE_BUDGET_S = 10.0
_RANGE_BUDGET_AGAIN_S = 2.0
_RANGE_FIRST_PAUSE_S = 0.1
_RANGE_LONGEST_PAUSE_S = 1.0
_RANGE_SHORTEST_WAIT_S = 0.2


class ManifestFirstRead(Protocol):
    """Where a manifest partition the group never read starts
    (`consumers.membership.manifest_start.ManifestStart`)."""

    @property
    def topic(self) -> str: ...

    def offset(self, consumer: Consumer, key: PartitionKey, log_range: tuple[int, int]) -> int: ...


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _batch_settled_first(
    move: Callable[Concatenate[LeaseKeeper, _P], _R],
) -> Callable[Concatenate[LeaseKeeper, _P], _R]:
    """The one way a lease move reaches the batch: its outcome is read and applied first.

    The batch in flight was sent under the leases as they were (its fenced advance starts at
    each lease's offset), and holds records of partitions a move may revoke, claim again, fence
    or pause. Settled first, its outcome lands on the leases it was written under, and the move
    then starts from what is committed. The rebalance callbacks run inside `consume`, with the
    batch in flight, so this is also what makes a revocation wait for the commit."""

    @functools.wraps(move)
    def settled_first(keeper: LeaseKeeper, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        keeper._batches.settle()
        return move(keeper, *args, **kwargs)

    return settled_first


class LeaseKeeper:
    def __init__(
        self,
        *,
        table: PartitionTable,
        store: OffsetStore,
        db: DatabaseSession,
        config: ConsumerSettings,
        consumer: Consumer,
        batches: BatchLifecycle,
        forget: Callable[[list[PartitionKey]], None],
        dead_letters_ends: Callable[
            [psycopg.Connection[Any], list[PartitionKey]], dict[PartitionKey, int]
        ],
        manifest_start: ManifestFirstRead | None = None,
    ) -> None:
        self._table = table
        self._store = store
        self._db = db
        self._config = config
        self._consumer = consumer
        self._batches = batches  # only through `_batch_settled_first`
        self._forget_metrics = forget
        self._dead_letters_ends = dead_letters_ends
        self._manifest_start = manifest_start  # with whole epochs: the manifest's first read
        # Assigned by Kafka, not claimed yet: since when, and why.
        self._unclaimed: dict[PartitionKey, tuple[float, str]] = {}
        self._range_failures: dict[PartitionKey, str] = {}  # the last error of each range query

    # -- rebalance callbacks (run inside consume) -----------------------------------------------

    @_batch_settled_first
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._claim_assigned(consumer, keys, budget_s=_RANGE_BUDGET_S, done="assigned")

    @_batch_settled_first
    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        partitions = self._drop_unclaimed(partitions)
        keys = [(tp.topic, tp.partition) for tp in partitions]
        if keys:
            log.info("revoked %s", keys)
        held = {lease.key: lease for lease in self._table.leases()}
        leases = [held[key] for key in keys if key in held]
        self._forget(keys)
        # Releasing only clears `owner` for the operator tools; the owner epoch fences us either
        # way. So it is not worth a reconnect here (which, while stopping, would abort close()).
        conn = self._db.open_connection()
        if conn is not None and leases:
            try:
                self._store.release(conn, leases)
            except psycopg.Error as exc:
                # Lost, or refused (read-only, a statement timeout): nothing to undo either way.
                if not (is_lost(exc) or refusal_of(exc) is not None):
                    raise
                log.warning("could not mark revoked partitions unowned: %s", exc)
        consumer.incremental_unassign(partitions)

    @_batch_settled_first
    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        partitions = self._drop_unclaimed(partitions)
        keys = [(tp.topic, tp.partition) for tp in partitions]
        if keys:
            log.warning("lost %s: the group moved them on (this member's session expired)", keys)
        self._forget(keys)
        consumer.incremental_unassign(partitions)

    # -- against the offsets table ------------------------------------------------------------

    @_batch_settled_first
    def reconcile(self) -> None:
        """Follow what the offsets table says about the partitions Kafka gave this member.

        A lease whose owner epoch moved on was taken by someone else; an idle member would only
        notice at its next batch, so it is checked here. A partition whose row has no owner
        (an operator's `offsets reset` clears it, as does a clean release by a member that had
        taken it over) is claimed again and consumed from its stored offset: that is how a
        `fenced` or `out_of_range` partition comes back without a rebalance."""
        consumer = self._consumer
        if self._unclaimed:
            self._claim_assigned(
                consumer, list(self._unclaimed), budget_s=_RANGE_BUDGET_AGAIN_S, done="claimed late"
            )
        keys = self._table.keys()
        if not keys:
            return
        rows = self._db.run(lambda conn: self._store.rows(conn, keys))
        released, taken = compare_with_rows(self._table, rows)
        for key, row in taken:
            self._table.taken(key, row)
        if taken:
            log.warning(
                "partitions taken by another owner, pausing them: %s", [k for k, _ in taken]
            )
            consumer.pause([TopicPartition(*key) for key, _ in taken])
        if not released:
            return
        ranges = self._log_ranges(consumer, released, _RANGE_BUDGET_AGAIN_S)
        if not ranges:
            return  # tried again at the next reconcile; `_log_ranges` logged why
        starts = self._starts(consumer, ranges)
        leases = self._db.run(lambda conn: self._claim(conn, starts))
        released = list(ranges)
        # Assigned afresh rather than sought: a partition whose fetch failed (offset out of range
        # with auto.offset.reset=error) refuses a seek, and a new assignment also drops anything
        # fetched from the old position.
        consumer.incremental_unassign([TopicPartition(*key) for key in released])
        consumer.incremental_assign(
            [TopicPartition(lease.topic, lease.partition, lease.next_offset) for lease in leases]
        )
        self._take(consumer, leases, ranges)
        log.info("claimed again %s", [(x.topic, x.partition, x.next_offset) for x in leases])

    @_batch_settled_first
    def fell_out_of_range(self, key: PartitionKey) -> None:
        """Kafka refused to fetch a partition from its stored offset (auto.offset.reset=error):
        the topic was recreated under the same name, or the log was truncated. Never a silent
        jump: the partition is paused and reported until an operator resets its offset."""
        lease = self._table.lease(key)
        if lease is None:
            return  # not consuming: a claim will look at its range again
        reason = f"Kafka refused to fetch from the stored offset {lease.next_offset}"
        try:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(*key), timeout=10)
            reason = (
                out_of_range_reason(lease.next_offset, low, high) or f"{reason} (log {low}-{high})"
            )
        except KafkaException as exc:  # the range is for the report only
            reason = f"{reason} (log range unknown: {exc})"
        self._table.fell_out_of_range(key, reason)
        self._consumer.pause([TopicPartition(*key)])
        log.error("%s[%d] paused: %s", key[0], key[1], reason)

    # -- claiming -----------------------------------------------------------------------------

    def reasons(self) -> list[str]:
        """For /readyz: the partitions Kafka assigned that cannot be claimed yet, and why."""
        now = time.monotonic()
        return [
            f"{topic}[{partition}] assigned but not claimed for {now - since:.0f}s: {why}"
            for (topic, partition), (since, why) in sorted(self._unclaimed.items())
        ]

    def _claim_assigned(
        self, consumer: Consumer, keys: list[PartitionKey], *, budget_s: float, done: str
    ) -> None:
        """Claim and start consuming partitions Kafka assigned. Those whose log range cannot be
        read (a leader unreachable, metadata not yet known) stay unassigned in the client and
        are tried again at each reconcile, reported meanwhile: never an exit for a fault the
        cluster heals on its own."""
        ranges = self._log_ranges(consumer, keys, budget_s)
        for key in keys:
            if key not in ranges:
                since = self._unclaimed.get(key, (time.monotonic(), ""))[0]
                self._unclaimed[key] = (since, self._range_failures.pop(key, "no log range"))
        starts = self._starts(consumer, ranges)
        leases = self._db.run(lambda conn: self._claim(conn, starts)) if ranges else []
        for key in ranges:
            self._unclaimed.pop(key, None)
        # Called even with nothing to assign: a rebalance callback that assigns nothing has the
        # client assign every partition itself, from Kafka's committed offsets.
        consumer.incremental_assign(
            [TopicPartition(lease.topic, lease.partition, lease.next_offset) for lease in leases]
        )
        if leases:
            self._take(consumer, leases, ranges)
            log.info("%s %s", done, [(x.topic, x.partition, x.next_offset) for x in leases])

    def _log_ranges(
        self, consumer: Consumer, keys: list[PartitionKey], budget_s: float
    ) -> dict[PartitionKey, tuple[int, int]]:
        """Each partition's log start and end, asked of its leader for at most `budget_s` in
        all: in rounds that ask every partition still unknown once, each query given its share
        of the time left, with growing pauses between rounds, so that one unreachable leader
        does not starve the others. A partition not read by then is left out, its last error in
        `_range_failures`. Bounded because it runs inside Kafka's rebalance callback and the
        poll loop."""
        deadline = time.monotonic() + budget_s
        ranges: dict[PartitionKey, tuple[int, int]] = {}
        pending, pause = list(keys), _RANGE_FIRST_PAUSE_S
        while pending:
            for key in pending:
                share = (deadline - time.monotonic()) / len(pending)
                try:
                    ranges[key] = consumer.get_watermark_offsets(
                        TopicPartition(*key),
                        timeout=max(_RANGE_SHORTEST_WAIT_S, share),
                        cached=False,
                    )
                    self._range_failures.pop(key, None)
                except KafkaException as exc:
                    self._range_failures[key] = f"its log range cannot be read ({exc.args[0]})"
                    log.warning("%s[%d]: the log range query failed: %s", *key, exc.args[0])
            pending = [key for key in pending if key not in ranges]
            left = deadline - time.monotonic()
            if not pending or left <= pause:
                break
            time.sleep(pause)
            pause = min(2 * pause, _RANGE_LONGEST_PAUSE_S)
        for key in pending:
            log.error(
                "%s[%d] cannot be claimed yet: %s; trying again every second",
                *key,
                self._range_failures.get(key, ""),
            )
        return ranges

    def _drop_unclaimed(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """`partitions` less those assigned but never claimed, which the client does not hold
        (unassigning them would be refused)."""
        dropped = {(tp.topic, tp.partition) for tp in partitions} & set(self._unclaimed)
        for key in dropped:
            del self._unclaimed[key]
            self._range_failures.pop(key, None)
        return [tp for tp in partitions if (tp.topic, tp.partition) not in dropped]

    def _starts(
        self, consumer: Consumer, ranges: dict[PartitionKey, tuple[int, int]]
    ) -> dict[PartitionKey, int]:
        """Where each partition starts if the group never read it (a stored offset wins inside
        the claim itself): its log start or end by the start policy; the epoch manifest's
        where `consumers.membership.manifest_start` says, asked only when it has no row."""
        earliest = self._config.start_policy == "earliest"
        starts = {key: low if earliest else high for key, (low, high) in ranges.items()}
        found = self._manifest_start
        manifest = [key for key in ranges if found is not None and key[0] == found.topic]
        if found is None or not manifest:
            return starts
        stored = self._db.run(lambda conn: self._store.rows(conn, manifest))
        for key in manifest:
            if key not in stored:
                starts[key] = found.offset(consumer, key, ranges[key])
        return starts

    def _claim(self, conn: psycopg.Connection[Any], starts: dict[PartitionKey, int]) -> list[Lease]:
        leases = self._store.claim(
            conn, starts, lock_wait_ms=self._config.db_session_timeout_ms // 2
        )
        # Read after the claim: from here on only this member writes the partitions' dead letters.
        ends = self._dead_letters_ends(conn, [lease.key for lease in leases])
        return [replace(lease, dead_letters_end=ends.get(lease.key, 0)) for lease in leases]

    def _take(
        self, consumer: Consumer, leases: list[Lease], ranges: dict[PartitionKey, tuple[int, int]]
    ) -> None:
        """Start consuming freshly claimed partitions, unless their stored offset is gone."""
        states = {
            lease.key: self._table.claimed(
                lease, log_start=ranges[lease.key][0], log_end=ranges[lease.key][1]
            )
            for lease in leases
        }
        # A partition this member paused after being fenced (a zombie that woke up) keeps its
        # pause flag in librdkafka across unassign/assign: a fresh claim must flow again.
        consumer.resume([TopicPartition(lease.topic, lease.partition) for lease in leases])
        for lease in leases:
            if states[lease.key] is PartitionState.OUT_OF_RANGE:
                # Never a silent jump: the partition stays paused until an operator resets it.
                consumer.pause([TopicPartition(lease.topic, lease.partition)])
                partition = self._table.get(lease.key)
                reason = partition.reason if partition else ""
                log.error("%s[%d] paused: %s", lease.topic, lease.partition, reason)

    def _forget(self, keys: list[PartitionKey]) -> None:
        self._table.forget(keys)
        self._forget_metrics(keys)


def compare_with_rows(
    table: PartitionTable, rows: dict[PartitionKey, StoredRow]
) -> tuple[list[PartitionKey], list[tuple[PartitionKey, StoredRow]]]:
    """What the offsets table says of the partitions held: those to claim again (their row has
    no owner, or none at all, or an owner epoch older than the lease's, and the lease is no
    longer this member's or was fenced), and those another owner epoch took (not yet fenced
    here)."""
    released, taken = [], []
    held = table.keys()
    for key in held:
        partition = table.get(key)
        assert partition is not None  # noqa: S101 - listed just above
        row = rows.get(key)
        ours = row is not None and row.owner_epoch == partition.lease.epoch
        if partition.state is PartitionState.FENCED or not ours:
            # An owner epoch below our own lease's: the database lost our claim (a failover
            # to a standby that lacked it). Nobody else holds it; claiming again fences all.
            behind = row is not None and row.owner_epoch < partition.lease.epoch
            if row is None or row.owner is None or behind:
                released.append(key)
            elif partition.state is not PartitionState.FENCED:
                taken.append((key, row))
    return released, taken
