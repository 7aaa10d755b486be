"""One owner for a batch's life: poll, plan, send, settle, done.

`submit` takes the records a poll returned and

1. keeps those of partitions this member applies and has not applied yet (`partitions`), and
   plans them in one call (`consumers.batch.planner`: routes, followed tables, decoding, each
   topic's statements and COPY text), while the batch before is still in flight, so that its
   commit costs no waiting;
2. settles the batch before: reads its outcome and applies it at once (partition states, the
   followed tables' changes, the backoffs, the Kafka mirror, the metrics; an unknown outcome
   read back from the offsets table);
3. sends the planned batch (`consumers.batch.committer`), unless an outcome moved the positions
   back since the poll began: then the records are stale, dropped, and fetched again.

What is in flight is held here and only here: the `InFlight` the committer returned, present
exactly in stage `in_flight`, which `_move` sets and clears with the stage. The partitions of
the batch in flight are its partitions; the committer keeps nothing between sending and reading
the outcome. The stage of the pipeline is a table of (stage, event) -> stage:

| stage       | meaning                                                    |
|-------------|------------------------------------------------------------|
| `idle`      | nothing in flight; what the last poll returned may be sent |
| `in_flight` | a batch sent as one message, its outcome not read yet      |
| `rewound`   | positions went back to the stored offsets after the poll   |
|             | began: what it returned may predate them                   |

Nothing but an outcome moves a lease here. Whatever else moves one (a rebalance callback,
reconcile, a fetch out of range: `consumers.membership.leases`) first calls `settle`, so that no
lease moves under a batch in flight.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from enum import StrEnum
from itertools import chain, groupby
from typing import cast

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from tenacity import wait_exponential

from bridge.errors import BridgeError
from consumers.backoff import HoldBackoff
from consumers.batch.committer import Batch, CommitResult, Committer, InFlight
from consumers.batch.partition_holds import PartitionHolds
from consumers.batch.planner import Planned, Planner
from consumers.batch.replays import ReplayFilter
from consumers.batch.work_log import WorkLog
from consumers.database.db_session import DatabaseSession, refusal_backoff
from consumers.database.offsets import OffsetStore, PartitionKey, StoredRow
from consumers.decoding.records import Record, RecordStopped, offset_of
from consumers.decoding.registry_schemas import RegistryUnavailable, registry_backoff
from consumers.epochs.assembly import Assembled, EpochAssembly, LedgerLook
from consumers.epochs.ledger import EpochKey
from consumers.metrics import ConsumerMetrics
from consumers.partitions import PartitionState, PartitionTable
from consumers.tables.routing import RouteUnresolved
from consumers.tables.table_follower import TableMismatch

log = logging.getLogger("bridge.consumer")


class Stage(StrEnum):
    IDLE = "idle"
    IN_FLIGHT = "in_flight"
    REWOUND = "rewound"


class StageEvent(StrEnum):
    POLLING = "polling"  # a poll begins: it fetches from the positions as they are now
    SENT = "sent"  # a batch went to the database
    SETTLED = "settled"  # its outcome was read and applied
    REWOUND = "rewound"  # the positions went back to the stored offsets


# (stage, event) -> the stage it moves to; a pair not listed is a bug. A rewind comes only from
# an outcome or from dropping stale records, never while a batch is in flight.
STAGES: dict[tuple[Stage, StageEvent], Stage] = {
    (Stage.IDLE, StageEvent.POLLING): Stage.IDLE,
    (Stage.IDLE, StageEvent.SENT): Stage.IN_FLIGHT,
    (Stage.IDLE, StageEvent.REWOUND): Stage.REWOUND,
    (Stage.IN_FLIGHT, StageEvent.POLLING): Stage.IN_FLIGHT,
    (Stage.IN_FLIGHT, StageEvent.SETTLED): Stage.IDLE,
    (Stage.REWOUND, StageEvent.POLLING): Stage.IDLE,
    (Stage.REWOUND, StageEvent.REWOUND): Stage.REWOUND,
}


class IllegalStage(BridgeError):
    """A move of the batch pipeline that its table does not allow: a bug."""

    def __init__(self, stage: Stage, event: StageEvent) -> None:
        self.stage, self.event = stage, event
        super().__init__(f"batch pipeline: '{event}' is not allowed in stage {stage}")


class BatchLifecycle:
    def __init__(
        self,
        *,
        planner: Planner,
        committer: Committer,
        table: PartitionTable,
        store: OffsetStore,
        db: DatabaseSession,
        consumer: Consumer,
        metrics: ConsumerMetrics,
        work_log: WorkLog,
        mirror_offsets: bool,
        assembly: EpochAssembly | None = None,
        whole_topic: Callable[[str], bool] = lambda topic: False,
    ) -> None:
        self._planner = planner
        # Routes applied per partition: records of a task written again are left out.
        self._replays = ReplayFilter(applies_whole=whole_topic)
        # Whole epochs: which records a batch publishes, stages or holds back for the next.
        self._assembly = assembly
        self._committer = committer
        self._table = table
        self._store = store
        self._db = db
        self._consumer = consumer
        self._metrics = metrics
        self._work_log = work_log
        # What holds the member's batches back, each with its growing wait and its `/readyz`
        # reason: the database refusing writes (a read-only standby, a full disk);
        self.refusals = refusal_backoff()
        # the registry unable to give a writer schema.
        self.registry = registry_backoff()
        # What holds only the partitions of its records (`consumers.batch.partition_holds`): a
        # writer schema a followed table cannot take, a topic a pattern matched whose table
        # cannot take its records yet, a record of an `on_record_error: stop` route.
        self.partition_holds = PartitionHolds(consumer)
        self._mirror_offsets = mirror_offsets
        self._stage = Stage.IDLE
        self._in_flight: InFlight | None = None  # set exactly in stage `in_flight`
        self.applied_total = 0
        # The batch settled last, kept until the next one is on the wire (see `settle`).
        self._settled: CommitResult | None = None
        # The ledger holds records of an epoch staged before records of this member's: the
        # group has epochs, though no batch of this member brought one (another member staged
        # them before the partition came here).
        self._staged_seen = False

    @property
    def stage(self) -> Stage:
        return self._stage

    def _move(self, event: StageEvent, in_flight: InFlight | None = None) -> None:
        """The stage moves as `STAGES` says, and the batch in flight with it: `in_flight` is
        what `sent` puts on the wire; every other event leaves the stage it moves to without
        one, or keeps the one there is (a poll during a batch in flight)."""
        try:
            stage = STAGES[self._stage, event]
        except KeyError:
            raise IllegalStage(self._stage, event) from None
        if event is not StageEvent.SENT:
            in_flight = self._in_flight if stage is Stage.IN_FLIGHT else None
        if (stage is Stage.IN_FLIGHT) != (in_flight is not None):
            raise IllegalStage(self._stage, event)  # sent without a batch
        self._stage, self._in_flight = stage, in_flight

    def partition_states(self) -> dict[str, int]:
        """How many partitions this member holds in each state; those of the batch in flight
        as `in_flight`, though their state is `consuming` until its outcome."""
        counts = {str(state): count for state, count in self._table.counts().items()}
        in_flight = self._in_flight
        held = len(in_flight.batch.records) if in_flight is not None else 0
        counts[str(PartitionState.CONSUMING)] -= held
        counts["in_flight"] = held
        return counts

    # -- the loop's calls ---------------------------------------------------------------------

    def polling(self) -> None:
        """Before each poll: a rewind before it is where the poll fetches from; held partitions
        whose wait is over resume from their stored offsets."""
        self._move(StageEvent.POLLING)
        due = self.partition_holds.due()
        if due and self.stage is Stage.IN_FLIGHT:
            # A partition held behind a staged epoch when its batch was assembled: that batch
            # settles first, so that it resumes from where the batch left its lease.
            self.settle()
        self._resume(due)

    def submit(self, records: list[Record]) -> None:
        """Steps 1 to 3 for the records one poll returned."""
        # Step 1: the batch before is still in flight.
        ours = self._ours(records)
        assembled = None
        if self._assembly is not None:
            assembled = self._assembly.assemble(ours, stored=self._stored)
            self._metrics.epoch_records_held.set(self._assembly.holding())
            ours = assembled.records
            if assembled.behind:  # paused now: no later record of them comes meanwhile
                self._behind(assembled.behind)
            if not ours and self.stage is Stage.IN_FLIGHT:
                # All held back for their epochs: nothing to send, so the batch in flight is
                # not waited for, and PostgreSQL writes it while the next poll is read.
                return
        # Chained on the batch in flight: a batch that fails rewinds, and the runs with it.
        replays = self._replays.split(ours, self._table.lease)
        try:
            planned = self._plan(replays.kept, assembled)
        except RegistryUnavailable as exc:
            # An infrastructure fault, never a record's: these records are fetched again once
            # the wait is over, and nothing of them is written or dead-lettered meanwhile.
            self.settle()
            self._metrics.registry_unavailable.inc()
            self.registry.failed(str(exc), _starts(ours))
            self._seek_to_leases()
            return
        except TableMismatch as exc:
            # Not the records' fault either: their partitions wait until the table is mended,
            # nothing of them dead-lettered; the member's other partitions go on.
            self.settle()
            self._metrics.table_mismatch.inc()
            self._hold_topic("mismatch", mismatch_backoff, exc, exc.topic, ours, exc.partitions)
            return
        except RouteUnresolved as exc:  # nor theirs: they wait for a table that takes them
            self.settle()
            self._hold_topic("unrouted", unrouted_backoff, exc, exc.topic, ours)
            return
        self.registry.cleared()
        # Step 2
        self.settle()
        leases = {key: lease for key in ours if (lease := self._table.lease(key))}
        if self.stage is Stage.REWOUND or len(leases) < len(ours):
            # The positions went back to the stored offsets, here or in a rebalance callback
            # inside the poll: some of these records may come from before that. Drop them all,
            # and go back once more, so that none fetched since is skipped either. (A lease lost
            # without a rewind cannot happen: only an outcome moves a lease between the poll and
            # here, and every outcome that is not whole rewinds.)
            self._seek_to_leases()
            return
        if not ours:
            return
        # Step 3, with the leases as the batch before left them: this advance starts where
        # that one ended.
        sent = self._committer.send(self._db.connection(), Batch(ours, leases, planned, replays))
        if isinstance(sent, InFlight):
            self._move(StageEvent.SENT, sent)
            self._settled = None  # PostgreSQL is busy with this batch while the last one is freed
        else:  # written statement by statement: its outcome is known now
            self._done(sent)

    def settle(self) -> None:
        """Read the outcome of the batch in flight, if any, and apply it."""
        in_flight = self._in_flight
        if in_flight is None:
            return
        result = self._committer.outcome(in_flight)
        self._move(StageEvent.SETTLED)
        self._done(result)
        # Freeing a batch (thousands of records, rows and their COPY text) takes longer than
        # anything else between one batch's outcome and the next one's sending, all of it time
        # PostgreSQL would sit idle: it is freed once the next batch is sent instead.
        self._settled = result

    # -- what a batch is made of --------------------------------------------------------------

    def _stored(self, key: PartitionKey) -> int | None:
        lease = self._table.lease(key)
        return None if lease is None else lease.next_offset

    def holding_due(self) -> bool:
        """Records held back for an epoch that waited its time: a batch must stage them, even
        with no new record to go with them."""
        return self._assembly is not None and self._assembly.due()

    @property
    def retry_at(self) -> float:
        """When the next batch may be polled (monotonic): after the member's holds' waits."""
        return max(h.retry_at for h in self._holds)

    def reasons(self) -> list[str]:
        """For `/readyz`: what holds batches or partitions back, one line a reason."""
        held = self.partition_holds.reasons()
        return [reason for hold in self._holds for reason in hold.reasons()] + held

    @property
    def _holds(self) -> tuple[HoldBackoff, ...]:
        """What holds the member (each partition's holds are `partition_holds`)."""
        return (self.refusals, self.registry)

    def epochs_seen(self) -> bool:
        """Whether a batch brought records of an epoch or a part naming a whole topic, or found
        records of an epoch staged before its own."""
        return self._assembly is not None and (self._assembly.saw_epochs or self._staged_seen)

    def epochs_asking(self) -> list[EpochKey]:
        """The epochs whose manifest the assembly asks the ledger about, between batches."""
        return self._assembly.asking() if self._assembly is not None else []

    def epochs_looked(self, look: LedgerLook) -> None:
        """What the publisher's look at the ledger found: a staged epoch it published lets
        later ones of its query go in a batch, and so does one the ledger no longer holds."""
        if self._assembly is not None:
            self._assembly.looked(look)
        if look.published:  # records of no epoch behind them may go now (else: their wait)
            self.partition_holds.wake(_BEHIND)

    def _plan(self, ours: dict[PartitionKey, list[Record]], assembled: Assembled | None) -> Planned:
        in_flight = self._in_flight
        return self._planner.plan(
            ours,
            self._db.open_connection(),
            in_flight=in_flight.batch.changes if in_flight is not None else [],
            assembled=assembled,
        )

    def _ours(self, records: list[Record]) -> dict[PartitionKey, list[Record]]:
        """The records of partitions this member applies, not yet applied, by partition."""
        by_partition: dict[PartitionKey, list[Record]] = defaultdict(list)
        # A partition's records come in runs, in offset order: the bookkeeping is per run, and
        # the runs are found by C loops over the records.
        for topic, of_topic in groupby(records, Message.topic):
            for partition, grouped in groupby(of_topic, Message.partition):
                key = cast(PartitionKey, (topic, partition))  # consumed: neither is None
                run = list(grouped)
                if self.partition_holds.held(key):
                    # Fetched before its pause, or resumed by a rebalance: fetched again from
                    # its stored offset when its wait is over.
                    self.partition_holds.repause(key)
                    continue
                self._table.delivered(key, offset_of(run[-1]) + 1)
                # A partition whose batch is in flight counts: that batch commits first.
                lease = self._table.lease(key)
                if lease is None:
                    continue  # fenced, out of range, unresolved: not ours to apply
                if offset_of(run[0]) < lease.next_offset:  # below what is already committed
                    run = [record for record in run if offset_of(record) >= lease.next_offset]
                if run:
                    by_partition[key].extend(run)
        return dict(by_partition)

    # -- done: an outcome applied -------------------------------------------------------------

    def _done(self, result: CommitResult) -> None:
        """The partitions' states, the followed tables, the backoff, the mirror and the
        metrics move."""
        if result.committed:
            self._planner.made(result.batch.changes)
            self._settle_epochs(result)
            self._went_ahead(result)
            self._replayed(result)
            self._table.committed(result.committed, result.batch.replays.runs)
            self.partition_holds.committed(result.committed)
            self._metrics.advanced(result.committed, self._table.caught_up(result.committed))
            self.refusals.cleared()
            self._mirror(result.committed)
            self._count(result, [result.batch.records[key] for key in result.committed])
        if result.drifted:
            self._planner.drifted()
        if result.refusal is not None:  # answered and refused: nothing was written
            self._metrics.refusals(result.refusal.sqlstate).inc()
            self.refusals.failed(f"{result.refusal.sqlstate}: {result.refusal.message}")
            self._seek_to_leases()
        if result.stopped is not None:
            self._stopped(result.stopped)
        if result.behind:
            if self._assembly is not None:
                self._assembly.staged_before(result.staged_before)
            self._behind(result.behind)
            self._seek_to_leases()
        if (result.refused or result.unknown) and self._resolve(result):
            self._count(result, list(result.batch.records.values()))  # its reply was lost

    def _settle_epochs(self, result: CommitResult) -> None:
        """The batch committed: what it held pending of whole epochs is settled with it."""
        pending = result.batch.planned.pending
        if pending is None or self._assembly is None:
            return
        self._assembly.settled(pending, published=bool(result.published))
        if result.published and pending.publishing:
            self._metrics.epochs_published(path="in_batch").inc(len(pending.publishing))
            for query, epoch in pending.publishing:
                log.info("epoch published", extra={"query": query, "epoch": epoch, "batch": True})

    def _replayed(self, result: CommitResult) -> None:
        """Records of a task attempt after an earlier attempt of the same epoch, or of an
        epoch before the last, left out of the tables: said every time, with where they are."""
        for replay in result.batch.replays.replayed:
            if replay.last_offset >= result.committed.get((replay.topic, replay.partition), 0):
                continue  # not committed: fetched again, and counted then
            self._metrics.replayed_epoch_records(replay.query).inc(replay.records)
            log.warning(
                "records of epoch %s of query %s (Spark partition %s) came again after its "
                "first write was applied (a driver replayed an epoch its markers no longer "
                "said was committed): %s[%s] offsets %s to %s, %d records, skipped",
                replay.epoch, replay.query, replay.spark_partition, replay.topic,
                replay.partition, replay.first_offset, replay.last_offset, replay.records,
                extra={"query": replay.query, "epoch": replay.epoch, "topic": replay.topic,
                       "partition": replay.partition, "records": replay.records},
            )  # fmt: skip

    def _went_ahead(self, result: CommitResult) -> None:
        """Records of no epoch went ahead of an epoch whose records lie on both sides of them:
        their order against it is not Kafka's, and a key of both is the epoch's once it is
        published. Said every time, since an operator may want to know which records."""
        for (topic, partition), ahead in sorted(result.ahead.items()):
            self._metrics.records_ahead_of_epochs(topic).inc(ahead.records)
            epochs = ", ".join(f"query {q} epoch {e}" for q, e in sorted(ahead.epochs))
            log.warning(
                "records of no epoch written ahead of an epoch whose records lie before and "
                "after them in their partition: %s[%s] offsets %s to %s, ahead of %s",
                topic, partition, ahead.first, ahead.last, epochs,
                extra={"topic": topic, "partition": partition, "first_offset": ahead.first,
                       "last_offset": ahead.last, "records": ahead.records},
            )  # fmt: skip

    def _stopped(self, stop: RecordStopped) -> None:
        """Its partition holds at the record; the member's other partitions go on."""
        self._metrics.records_stopped(stop.topic).inc()
        self.partition_holds.hold(
            "on_record_error: stop", stop_backoff, str(stop),
            {(stop.topic, stop.partition): stop.offset},
        )  # fmt: skip
        self._seek_to_leases()

    def _behind(self, at: dict[PartitionKey, int]) -> None:
        """Records of no epoch wait, in their partitions, for the epochs staged before them."""
        self._staged_seen = True  # someone must publish them: this member's looks too
        where = ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(at.items()))
        self.partition_holds.hold(
            _BEHIND, behind_backoff, f"behind records of an epoch staged before them: {where}", at
        )

    def _hold_topic(
        self,
        kind: str,
        make: Callable[[], HoldBackoff],
        exc: BridgeError,
        topic: str | None,
        ours: dict[PartitionKey, list[Record]],
        partitions: frozenset[int] | None = None,
    ) -> None:
        """Hold the batch's partitions of `topic` (of those `partitions` when the fault says;
        all of the batch's when it does not say which topic) at their first records; the
        others are fetched again."""
        held = {
            key: of_key
            for key, of_key in ours.items()
            if topic is None or (key[0] == topic and (partitions is None or key[1] in partitions))
        }
        # A fault whose records the batch does not hold cannot happen; were it to, holding
        # every partition of the batch waits between tries where holding none would spin.
        self.partition_holds.hold(kind, make, str(exc), _starts(held or ours))
        self._seek_to_leases()

    def _resume(self, keys: list[PartitionKey]) -> None:
        """Fetch held partitions again from their stored offsets, where they were held."""
        for key in keys:
            lease = self._table.lease(key)
            if lease is None:
                continue  # no longer ours: its next owner starts it
            partition = TopicPartition(lease.topic, lease.partition, lease.next_offset)
            try:
                self._consumer.resume([partition])
                self._consumer.seek(partition)
            except KafkaException as exc:  # revoked meanwhile
                log.info("held partition %s[%s] not resumed: %s", *key, exc)
                continue
            # The hold's own line says when it starts and, at a growing interval, that it goes on.
            log.debug("held partition %s[%s] tried again from offset %s", *key, lease.next_offset)

    def _release_moved_past(self) -> None:
        """Clear each hold whose records are no longer this member's to apply: every partition
        it held has moved past them (an operator's reset or skip) or left this member. A batch
        would clear it too, but on an idle topic none comes, and `/readyz` would keep a reason
        whose cause is gone."""

        def moved_past(key: PartitionKey, offset: int) -> bool:
            lease = self._table.lease(key)
            return lease is None or lease.next_offset > offset

        for hold in self._holds:
            if hold.current is None or not hold.at:
                continue
            if all(moved_past(key, offset) for key, offset in hold.at.items()):
                log.info("what held the batches is behind every partition it held: %s",
                         hold.current)  # fmt: skip
                hold.cleared()
        self._resume(self.partition_holds.release(moved_past))

    def _resolve(self, result: CommitResult) -> bool:
        """After a batch whose advance was refused or whose connection was lost: read where
        its partitions stand in the offsets table, move them there, and fetch again from the
        stored offsets. Returns whether the batch turned out to be committed (its reply lost)."""
        keys = result.refused + result.unknown
        self._table.lost(keys, result.lost or "offset lease refused")
        if result.lost is not None:
            log.error(
                "database connection lost during a batch (%s); reading its outcome from the "
                "offsets table",
                result.lost,
            )
            self._db.reconnect()
        rows: dict[PartitionKey, StoredRow] = self._db.run(
            lambda conn: self._store.rows(conn, keys)
        )
        expected = result.batch.next_offsets()
        committed = False
        fenced = []
        for key in keys:
            row = rows.get(key)
            if key not in self._table:
                continue  # revoked meanwhile
            if self._table.resolved(key, row) is PartitionState.FENCED:
                fenced.append(key)
            elif row is not None and key in result.unknown:
                committed = committed or row.next_offset == expected.get(key)
        if fenced:
            log.warning("partitions taken by another owner, pausing them: %s", fenced)
            self._consumer.pause([TopicPartition(*key) for key in fenced])
        log.info(
            "positions read from the offsets table",
            extra={"partitions": {f"{t}[{p}]": rows[(t, p)].next_offset for t, p in rows}},
        )
        self._seek_to_leases()
        return committed

    def _seek_to_leases(self) -> None:
        """Fetch again from what the offsets table says is committed."""
        self._move(StageEvent.REWOUND)
        self._replays.rewound()
        if self._assembly is not None:
            self._assembly.drop()  # held back: fetched again too
            self._metrics.epoch_records_held.set(0)
        for key in self._table.in_state(PartitionState.CONSUMING):
            lease = self._table.lease(key)
            assert lease is not None  # noqa: S101 - a consuming partition has one
            self._consumer.seek(TopicPartition(lease.topic, lease.partition, lease.next_offset))

    def _count(self, result: CommitResult, records: list[list[Record]]) -> None:
        for of_key in records:  # one partition's records each
            if of_key:
                self._metrics.records_read(of_key[0].topic()).inc(len(of_key))
        applied = 0
        for topic, (rows, dead, skipped) in result.applied.items():
            applied += rows
            self._metrics.records_applied(topic).inc(rows)
            self._metrics.dead_letters(topic).inc(dead)
            self._metrics.records_skipped(topic).inc(skipped)
        for topic, staged in result.staged.items():
            self._metrics.records_staged(topic).inc(staged)
        self.applied_total += applied
        staging = result.batch.planned.staging  # visible only once their epoch is published
        visible = [of_key for of_key in records if of_key and of_key[0].topic() not in staging]
        if result.published:  # its epochs' records, and those of no epoch
            visible.append(result.batch.planned.published_records)
        else:  # those of no epoch it committed (a batch written again may end before some)
            visible.append([
                r for r in self._metrics.sample(result.batch.planned.bare_records)
                if offset_of(r) < result.committed.get((r.topic(), r.partition()), -1)  # type: ignore[arg-type]
            ])  # fmt: skip
        self._metrics.committed(list(chain.from_iterable(visible)), result.seconds)
        self._work_log.committed(
            applied,
            result.dead_letters,
            lag=self._metrics.total_lag(),
            partitions=len(self._table.keys()),
        )
        self._planner.report_left_out()

    def report(self) -> None:
        """What is due now that no batch brought: holds whose records were moved past, the
        log's progress and dead letters' count."""
        self._release_moved_past()
        self._work_log.tick(lag=self._metrics.total_lag(), partitions=len(self._table.keys()))
        self._planner.report_left_out()  # what waited for its line

    def _mirror(self, advanced: dict[PartitionKey, int]) -> None:
        if not self._mirror_offsets:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, offset) for (t, p), offset in advanced.items()],
                asynchronous=True,
            )
        except KafkaException as exc:
            log.warning("mirroring offsets to the Kafka group failed: %s", exc)


_BEHIND = "records of no epoch"


def behind_backoff() -> HoldBackoff:
    return HoldBackoff(
        what="records of no epoch wait for an epoch staged before them in their partition",
        consequence="their partition holds at them until the epoch is published (or "
        "discarded), and goes on then; the member's other partitions go on",
        wait=wait_exponential(multiplier=0.25, max=5),
        level=logging.INFO,
        reason_after_s=60.0,
    )


def unrouted_backoff() -> HoldBackoff:
    return HoldBackoff(
        what="a topic its route's pattern matched has no table that takes its records",
        consequence="its partitions wait until the table is there and fits, nothing is "
        "dead-lettered; the member's other topics go on",
    )


def stop_backoff() -> HoldBackoff:
    return HoldBackoff(
        what="a record its route may not dead-letter stops its partition",
        consequence="the partition holds at it (on_record_error: stop) until the table or "
        "the route is fixed, or `bridge offsets reset` moves it past the record; nothing is "
        "dead-lettered; the member's other partitions go on",
    )


def mismatch_backoff() -> HoldBackoff:
    return HoldBackoff(
        what="table does not fit its records' schema",
        consequence="its partitions wait until the table is mended, nothing is dead-lettered; "
        "the member's other partitions go on",
    )


def _starts(records: dict[PartitionKey, list[Record]]) -> dict[PartitionKey, int]:
    """Where each partition's records of a held batch start."""
    return {key: offset_of(of_key[0]) for key, of_key in records.items() if of_key}
