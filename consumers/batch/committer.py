"""The commit protocol of one batch: its rows and its offsets in one PostgreSQL transaction.

1. The fenced offset advance, first in the transaction: each partition moves from the offset
   its lease expects to the offset after its last record, only while the lease's owner epoch
   is the current one.
2. The dead letters of a range applied again cleared (an offset reset, a restart after one),
   then the rows of every route (COPY, or COPY into a staging table and `INSERT ... ON CONFLICT`),
   and the dead letters of the records that cannot be rows.
3. COMMIT. Nothing else moves before its outcome is known: the batch's owner
   (`consumers.batch.lifecycle`) moves the partitions' states, the metrics and the Kafka mirror
   from the `CommitResult`.

Two paths take these steps. A batch whose records are all rows goes as one message
(`consumers.batch.pipelined`): `send` returns an `InFlight` at once and `outcome` reads its answer
later, while the next batch is consumed. The committer keeps nothing between the two: the owner
holds the `InFlight`. Any other batch, and one the one-message path was refused for, goes
statement by statement (`write`), which finds the record to dead-letter or the partition whose
advance was refused. A connection lost on either path leaves the outcome unknown; the result says
so, and the offsets table, not memory, decides afterwards. A refusal the database answers with
(read-only, out of resources, a statement timeout) is known to have written nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any

import psycopg

from bridge.errors import BridgeError
from consumers.batch.pipelined import PipelinedTransaction
from consumers.batch.planner import Planned, by_topic
from consumers.batch.replays import Split
from consumers.database.db_session import Refusal, is_lost, refusal_of
from consumers.database.offsets import Lease, OffsetStore, PartitionKey
from consumers.decoding.records import Record, RecordStopped, offset_of
from consumers.epochs.ledger import Ahead, EpochKey
from consumers.epochs.staging import EpochStager
from consumers.tables.applier import Applier, ApplyCounts, DeadLetterNote, Step, run_steps
from consumers.tables.table_follower import DRIFT

log = logging.getLogger("bridge.consumer")


@dataclass(frozen=True)
class Batch:
    """Records of the partitions this member holds, with the leases they are written under."""

    records: dict[PartitionKey, list[Record]]
    leases: dict[PartitionKey, Lease]
    planned: Planned  # its tables, statements and table changes (consumers.batch.planner)
    # Records of task attempts written before, left out of its rows but not of its offsets,
    # and the runs it stores (consumers.batch.replays); planned without them.
    replays: Split = field(default_factory=lambda: Split({}))

    @property
    def plans(self) -> dict[str, list[Step]] | None:
        return self.planned.plans

    @property
    def changes(self) -> list[Step]:
        return self.planned.changes

    def next_offsets(self) -> dict[PartitionKey, int]:
        """Where each partition goes once the batch commits: after its last record."""
        return {key: offset_of(records[-1]) + 1 for key, records in self.records.items()}

    def before(self, key: PartitionKey, offset: int) -> Batch:
        """The batch with `key`'s records from `offset` on taken out (the partition too, when
        none is left)."""
        kept = [r for r in self.records[key] if offset_of(r) < offset]
        if not kept:
            return self.without([key])
        return Batch(
            {**self.records, key: kept},
            self.leases,
            replace(self.planned, plans=None),
            self.replays.up_to(key, offset),
        )

    def without(self, keys: list[PartitionKey]) -> Batch:
        return Batch(
            {k: v for k, v in self.records.items() if k not in keys},
            {k: v for k, v in self.leases.items() if k not in keys},
            replace(self.planned, plans=None),
            self.replays.without(keys),
        )

    def applied_records(self) -> dict[PartitionKey, list[Record]]:
        """Its records without the replays', which its offsets pass but its tables never get."""
        skipped = self.replays.skipped
        if not skipped:
            return self.records
        return {
            key: [r for r in of_key if (key[0], key[1], offset_of(r)) not in skipped]
            for key, of_key in self.records.items()
        }


@dataclass(frozen=True, kw_only=True)
class CommitResult:
    """What one batch's transaction came to."""

    batch: Batch
    committed: dict[PartitionKey, int] = field(default_factory=dict)  # new next offsets
    # Per topic: rows written, dead letters, records skipped by their mode.
    applied: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    seconds: float = 0.0
    # The advance was refused for these: another owner, or an offset not where the lease said.
    refused: list[PartitionKey] = field(default_factory=list)
    # The connection dropped: the outcome of these partitions' batch is unknown.
    unknown: list[PartitionKey] = field(default_factory=list)
    lost: str | None = None
    # The database answered and refused to write (read-only, out of resources, a timeout):
    # nothing of these partitions' batch was written.
    declined: list[PartitionKey] = field(default_factory=list)
    refusal: Refusal | None = None
    # A record of an `on_record_error: stop` route that cannot be written: its partition's
    # records before it are committed (or, with none, the partition is declined), none after.
    stopped: RecordStopped | None = None
    # The refusal came from a followed table changed other than its follower knew.
    drifted: bool = False
    # The dead letters written, for the log once committed.
    dead_letters: list[DeadLetterNote] = field(default_factory=list)
    # Per topic: records staged until their epoch is whole (consumers.epochs.staging).
    staged: dict[str, int] = field(default_factory=dict)
    # Epochs the batch published itself (consumers.epochs.assembly): only when it went as
    # one message; written statement by statement, a batch stages their records instead.
    published: tuple[EpochKey, ...] = ()
    # Partitions whose records of no epoch (another producer's) came after records staged of
    # an epoch: committed up to them (or declined), they wait for its publication from there.
    behind: dict[PartitionKey, int] = field(default_factory=dict)
    # And the epochs staged before them there, which the assembly may not know of (staged
    # before this member started): it holds their later records back no more.
    staged_before: dict[PartitionKey, frozenset[EpochKey]] = field(default_factory=dict)
    # Partitions whose records of no epoch it wrote ahead of epochs staged before them, whose
    # records lie after them too (`consumers.epochs.ledger.Ahead`), for the log once committed.
    ahead: dict[PartitionKey, Ahead] = field(default_factory=dict)

    @property
    def whole(self) -> bool:
        """Every partition of the batch committed."""
        return (
            not self.refused
            and not self.unknown
            and not self.declined
            and not self.stopped
            and not self.behind
        )


class _BehindStaged(BridgeError):
    def __init__(
        self, at: dict[PartitionKey, int], epochs: dict[PartitionKey, frozenset[EpochKey]]
    ) -> None:
        self.at = at
        self.epochs = epochs
        where = ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(at.items()))
        super().__init__(f"{where}: records of no epoch after records of an epoch staged")


class _LeaseRefused(BridgeError):
    def __init__(self, keys: list[PartitionKey]) -> None:
        self.keys = keys
        super().__init__(", ".join(f"{t}[{p}]" for t, p in keys) + ": offset lease refused")


@dataclass(frozen=True)
class InFlight:
    """A batch sent as one message, its answer not read yet."""

    batch: Batch
    transaction: PipelinedTransaction
    conn: psycopg.Connection[Any]
    started: float


class Committer:
    def __init__(
        self,
        *,
        store: OffsetStore,
        applier: Applier,
        timeout_s: float,
        stager: EpochStager | None = None,
    ) -> None:
        self._store = store
        self._applier = applier
        self._stager = stager
        self._timeout_s = timeout_s

    def send(self, conn: psycopg.Connection[Any], batch: Batch) -> InFlight | CommitResult:
        """Commit `batch`: sent as one message when it is all rows (its answer read by
        `outcome`), else written statement by statement (the result now)."""
        if batch.plans is None:
            return self.write(conn, batch)
        started = time.perf_counter()
        # Step 1, 2 and 3 go in one message, in this order.
        advance = self._store.advance_statement(self._advances(batch), strict=True)
        steps = [
            *self._runs(batch),
            *batch.changes,
            *self._replays(batch),
            *chain.from_iterable(batch.plans.values()),
            *batch.planned.guards,  # after the manifest's records, which they may need
        ]
        try:
            transaction = PipelinedTransaction(
                conn, steps, advance=advance, timeout_s=self._timeout_s
            )
        except psycopg.OperationalError as exc:
            return CommitResult(batch=batch, unknown=list(batch.records), lost=str(exc))
        return InFlight(batch, transaction, conn, started)

    def outcome(self, sent: InFlight) -> CommitResult:
        """The outcome of a batch sent as one message; a refused one is written again
        statement by statement, which tells which partition or record was refused."""
        batch = sent.batch
        assert batch.plans is not None  # noqa: S101 - only such batches are sent
        rows = {
            topic: sum(len(step.rows) for step in plan if step.rows is not None)
            for topic, plan in batch.plans.items()
        }
        staging = batch.planned.staging
        applied = {topic: (n, 0, 0) for topic, n in rows.items() if topic not in staging}
        applied.update({topic: (n, 0, 0) for topic, n in batch.planned.published_rows.items()})
        staged = batch.planned.staged_records
        try:
            refusal = sent.transaction.finish()
            if refusal is None:
                return CommitResult(
                    batch=batch,
                    committed=batch.next_offsets(),
                    applied=applied,
                    staged=staged,
                    seconds=time.perf_counter() - sent.started,
                    published=batch.planned.epochs,
                    ahead=batch.planned.ahead,
                )
            log.info("batch refused as a whole, writing it statement by statement: %s", refusal)
            sent.conn.execute("ROLLBACK")
        except psycopg.OperationalError as exc:
            return CommitResult(
                batch=batch,
                applied=applied,
                staged=staged,
                unknown=list(batch.records),
                lost=str(exc),
            )
        return self.write(sent.conn, batch)

    def write(self, conn: psycopg.Connection[Any], batch: Batch) -> CommitResult:
        """Steps 1 to 3 statement by statement; partitions whose advance is refused are taken
        out of the batch and the rest is written again."""
        refused: list[PartitionKey] = []
        stopped: RecordStopped | None = None
        declined: list[PartitionKey] = []  # the stopped partition, when nothing is before it
        behind: dict[PartitionKey, int] = {}
        staged_before: dict[PartitionKey, frozenset[EpochKey]] = {}
        while batch.records:
            started = time.perf_counter()
            applied: dict[str, tuple[int, int, int]] = {}
            staged: dict[str, int] = {}
            dead_letters: list[DeadLetterNote] = []
            ahead: dict[PartitionKey, Ahead] = {}
            try:
                self._write_once(conn, batch, applied, staged, dead_letters, ahead)
            except _LeaseRefused as exc:
                log.warning("offset lease refused", extra={"partitions": exc.keys})
                refused += exc.keys
                batch = batch.without(exc.keys)
                continue
            except RecordStopped as exc:  # rolled back: written again up to the record
                stopped, key = exc, (exc.topic, exc.partition)
                batch = batch.before(key, exc.offset)
                declined += [] if key in batch.records else [key]
                continue
            except _BehindStaged as exc:  # rolled back: written again up to those records
                staged_before.update(exc.epochs)
                for key, offset in exc.at.items():
                    behind[key] = offset
                    batch = batch.before(key, offset)
                    declined += [] if key in batch.records else [key]
                continue
            except psycopg.Error as exc:
                drift = _drift(batch, exc)
                refusal = refusal_of(exc) or drift
                if refusal is not None:
                    return CommitResult(
                        batch=batch,
                        refused=refused,
                        declined=[*declined, *batch.records],
                        refusal=refusal,
                        stopped=stopped,
                        drifted=drift is not None,
                        behind=behind,
                        staged_before=staged_before,
                    )
                if not is_lost(exc):
                    raise
                # `applied` is whole if the COMMIT went through and only its reply was lost.
                return CommitResult(
                    batch=batch,
                    applied=applied,
                    staged=staged,
                    dead_letters=dead_letters,
                    refused=refused,
                    unknown=list(batch.records),
                    lost=str(exc),
                    declined=declined,
                    stopped=stopped,
                    behind=behind,
                    staged_before=staged_before,
                )
            return CommitResult(
                batch=batch,
                committed=batch.next_offsets(),
                applied=applied,
                staged=staged,
                dead_letters=dead_letters,
                seconds=time.perf_counter() - started,
                refused=refused,
                declined=declined,
                stopped=stopped,
                behind=behind,
                staged_before=staged_before,
                ahead=ahead,
            )
        return CommitResult(
            batch=batch,
            refused=refused,
            declined=declined,
            stopped=stopped,
            behind=behind,
            staged_before=staged_before,
        )

    def _write_once(
        self,
        conn: psycopg.Connection[Any],
        batch: Batch,
        applied: dict[str, tuple[int, int, int]],
        staged_counts: dict[str, int],
        dead_letters: list[DeadLetterNote],
        ahead: dict[PartitionKey, Ahead],
    ) -> None:
        with conn.transaction():
            # Step 1
            refused = self._store.advance(conn, self._advances(batch))
            if refused:
                raise _LeaseRefused(refused)  # rolls the transaction back
            run_steps(conn, [*self._runs(batch), *batch.changes, *self._replays(batch)])
            # Step 2
            staged: set[str] = set()
            for topic, records in by_topic(batch.applied_records()).items():
                if topic in batch.planned.staging:
                    assert self._stager is not None  # noqa: S101 - it staged them
                    done = self._stager.apply(conn, topic, records)
                    staged_counts[topic] = done.staged
                    dead_letters += done.dead_letters
                    counts = ApplyCounts()
                    if done.bare:  # of no epoch: to the table, as the planner planned them
                        found = self._stager.behind_staged(
                            conn, done.bare, records, batch.planned.ahead
                        )
                        if found.behind:  # rolls the transaction back
                            raise _BehindStaged(found.behind, found.before)
                        ahead.update(found.ahead)
                        target = batch.planned.targets[topic]
                        counts = self._applier.apply(conn, target, done.bare, staged)
                        dead_letters += counts.dead_letters
                    applied[topic] = (
                        counts.applied + counts.deleted,
                        counts.dead + len(done.dead_letters),
                        counts.skipped,
                    )
                    continue
                target = batch.planned.targets[topic]
                counts = self._applier.apply(conn, target, records, staged)
                applied[topic] = (counts.applied + counts.deleted, counts.dead, counts.skipped)
                dead_letters += counts.dead_letters
        # Step 3: the block above committed on leaving it.

    def _runs(self, batch: Batch) -> list[Step]:
        """The runs the batch's records leave in its partitions, stored with its offsets."""
        runs = [(batch.leases[k], r) for k, r in batch.replays.runs.items() if k in batch.leases]
        return [Step(self._store.runs_statement(runs))] if runs else []

    def _replays(self, batch: Batch) -> list[Step]:
        """For each partition whose records start below its last dead letter: clearing the
        dead letters of the range it applies again."""
        steps = []
        for key, records in batch.records.items():
            first = offset_of(records[0])
            if first < batch.leases[key].dead_letters_end:
                steps.append(self._applier.replayed(key, first, offset_of(records[-1])))
        return steps

    @staticmethod
    def _advances(batch: Batch) -> list[tuple[Lease, int]]:
        return [(batch.leases[key], offset) for key, offset in batch.next_offsets().items()]


def _drift(batch: Batch, exc: psycopg.Error) -> Refusal | None:
    """A followed table other than its follower knew it: nothing written; the owner has the
    followers read their tables again (`CommitResult.drifted`), and the batch is tried again
    after the refusal's wait."""
    if not batch.planned.followed or not isinstance(exc, DRIFT):
        return None
    message = exc.diag.message_primary or str(exc)
    return Refusal(exc.sqlstate or "", f"a followed table changed meanwhile: {message}")
