"""The partitions Kafka gives this member, kept in step with the offsets table.

Kafka decides which member should hold a partition; the offsets table decides which member
may write it (the owner epoch). This module claims partitions on assignment and releases them
on revocation (the rebalance callbacks, run inside `consume`), compares the leases with the
table once a second (`reconcile`), and pauses a partition Kafka will not fetch from its stored
offset. Each of these first settles the batch in flight (`consumers.lifecycle`), so that no
lease moves under it, then moves the partitions' states (`consumers.partitions`) and the
consumer's positions: assigned, paused, resumed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition

from bridge.settings import ConsumerSettings
from consumers.db_session import DatabaseSession, is_lost, refusal_of
from consumers.lifecycle import BatchLifecycle
from consumers.offsets import Lease, OffsetStore, PartitionKey, StoredRow
from consumers.partitions import PartitionState, PartitionTable, out_of_range_reason

log = logging.getLogger("bridge.consumer")


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
    ) -> None:
        self._table = table
        self._store = store
        self._db = db
        self._config = config
        self._consumer = consumer
        self._batches = batches  # the batch in flight settles before a lease moves
        self._forget_metrics = forget

    # -- rebalance callbacks (run inside consume) -----------------------------------------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._batches.settle()
        keys = [(tp.topic, tp.partition) for tp in partitions]
        leases, ranges = self._claim_at_watermarks(consumer, keys)
        consumer.incremental_assign(
            [TopicPartition(lease.topic, lease.partition, lease.next_offset) for lease in leases]
        )
        self._take(consumer, leases, ranges)
        log.info("assigned %s", [(x.topic, x.partition, x.next_offset) for x in leases])

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._batches.settle()  # the batch in flight holds records of these partitions
        keys = [(tp.topic, tp.partition) for tp in partitions]
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

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._batches.settle()
        self._forget([(tp.topic, tp.partition) for tp in partitions])
        consumer.incremental_unassign(partitions)

    # -- against the offsets table ------------------------------------------------------------

    def reconcile(self) -> None:
        """Follow what the offsets table says about the partitions Kafka gave this member.

        A lease whose owner epoch moved on was taken by someone else; an idle member would only
        notice at its next batch, so it is checked here. A partition whose row has no owner
        (an operator's `offsets reset` clears it, as does a clean release by a member that had
        taken it over) is claimed again and consumed from its stored offset: that is how a
        `fenced` or `out_of_range` partition comes back without a rebalance."""
        self._batches.settle()
        consumer = self._consumer
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
        leases, ranges = self._claim_at_watermarks(consumer, released)
        # Assigned afresh rather than sought: a partition whose fetch failed (offset out of range
        # with auto.offset.reset=error) refuses a seek, and a new assignment also drops anything
        # fetched from the old position.
        consumer.incremental_unassign([TopicPartition(*key) for key in released])
        consumer.incremental_assign(
            [TopicPartition(lease.topic, lease.partition, lease.next_offset) for lease in leases]
        )
        self._take(consumer, leases, ranges)
        log.info("claimed again %s", [(x.topic, x.partition, x.next_offset) for x in leases])

    def fell_out_of_range(self, key: PartitionKey) -> None:
        """Kafka refused to fetch a partition from its stored offset (auto.offset.reset=error):
        the topic was recreated under the same name, or the log was truncated. Never a silent
        jump: the partition is paused and reported until an operator resets its offset."""
        self._batches.settle()
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

    def _claim_at_watermarks(
        self, consumer: Consumer, keys: list[PartitionKey]
    ) -> tuple[list[Lease], dict[PartitionKey, tuple[int, int]]]:
        watermarks = {
            key: consumer.get_watermark_offsets(TopicPartition(*key), timeout=10, cached=False)
            for key in keys
        }
        leases = self._db.run(lambda conn: self._claim(conn, watermarks))
        return leases, watermarks

    def _claim(
        self, conn: psycopg.Connection[Any], watermarks: dict[PartitionKey, tuple[int, int]]
    ) -> list[Lease]:
        # Where a partition never seen starts; a stored offset wins inside the claim itself.
        earliest = self._config.start_policy == "earliest"
        starts = {key: low if earliest else high for key, (low, high) in watermarks.items()}
        return self._store.claim(conn, starts, lock_wait_ms=self._config.db_session_timeout_ms // 2)

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
    no owner, or none at all, and the lease is no longer this member's or was fenced), and
    those another owner epoch took (not yet fenced here)."""
    released, taken = [], []
    held = table.keys()
    for key in held:
        partition = table.get(key)
        assert partition is not None  # noqa: S101 - listed just above
        row = rows.get(key)
        ours = row is not None and row.owner_epoch == partition.lease.epoch
        if partition.state is PartitionState.FENCED or not ours:
            if row is None or row.owner is None:
                released.append(key)
            elif partition.state is not PartitionState.FENCED:
                taken.append((key, row))
    return released, taken
