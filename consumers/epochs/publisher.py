"""Whole epochs, the second half: an epoch becomes visible in one transaction.

Every member of a group with whole-epoch routes looks at the ledger (`ledger`) between
batches, at most every `_LOOK_EVERY_S`, on a connection of its own (the session's may have a
batch in flight). For each query, its first open epoch, when it is whole (or an operator forced
it), is published:

1. its `epochs` row is locked, FOR UPDATE SKIP LOCKED: a member that finds it locked leaves it
   to the one publishing it;
2. under the lock the ledger's judge (`ledger.take`) must find it whole, or forced and not
   overstaged;
3. its chunks (`consumers.epochs.chunks`) are written in the order they were staged,
   which is each Kafka partition's offset order: a chunk's plan, made when it was staged, runs
   under a savepoint when it was made for the route, table and release this member would plan
   for now (its fingerprint); a chunk without one (a followed table, a mode that counts what it
   skips, a record that is not a row), with one made for others, or whose plan the table
   refuses, has its records written as any batch's are (`consumers.batch.planner` with
   `publishing=True`, `consumers.tables.applier`): followed tables made or changed first,
   tombstones, dead letters for what cannot be a row, `on_record_error: stop` refusing the
   whole publication;
4. the chunks, counts and parts are deleted, the epoch marked published, and the transaction
   commits: every table the epoch touched in this group changes at once.

A fault on the way (the database lost, the registry out of reach, a table that does not fit, a
record that stops) rolls the whole publication back: nothing of the epoch is visible, nothing is
lost, and it is tried again after a growing wait, with `/readyz` naming it. An epoch that stays
incomplete longer than `epochs_incomplete_after_ms` is named on `/readyz` too, with what it
lacks, and the age of the oldest one is a metric all along.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Protocol

import psycopg
from psycopg import sql

from bridge.errors import BridgeError
from bridge.names import DEAD_LETTERS_TABLE
from consumers.backoff import HoldBackoff
from consumers.database.db_session import DatabaseSession, is_lost, refusal_of
from consumers.database.ledger_tables import LedgerNames
from consumers.database.offsets import PartitionKey
from consumers.database.pg_errors import RECORD_FAULTS
from consumers.decoding.records import Record
from consumers.epochs.assembly import LedgerLook
from consumers.epochs.chunks import stamps_of, unpack_plan, unpack_records
from consumers.epochs.ledger import (
    EpochKey,
    EpochPhase,
    EpochState,
    Manifest,
    age_s,
    database_now,
    discard,
    hold,
    knows_epochs,
    manifests,
    open_epochs,
    prune_settled,
    publishable,
    published,
    replayed,
    skip_replayed,
    take,
)
from consumers.metrics import ConsumerMetrics
from consumers.tables.applier import Applier, EveryStage, Step, run_steps
from consumers.tables.table_follower import DRIFT
from consumers.tables.targets import Target

log = logging.getLogger("bridge.consumer")

_LOOK_EVERY_S = 0.2  # what whole epochs add to the end-to-end latency, at most, besides the work
_PUBLISH_BUDGET_S = 2.0  # publications in one look: the poll loop turns in between
# Settled epochs are pruned this often, a batch at a time; while batches come full (a ledger
# upgraded with its history) every second: 1,000 epochs a second, well above any trigger's
# rate, and a small share of PostgreSQL's time beside the batches.
_PRUNE_EVERY_S = 10.0
_PRUNE_AGAIN_S = 1.0
_PRUNE_BATCH = 1_000
_CHUNK_IDS = sql.SQL(
    "SELECT id FROM {} WHERE group_id = %s AND query = %s AND epoch = %s ORDER BY id"
)
_CHUNK_PLAN = sql.SQL(
    "SELECT topic, records, rows, plan, stamps, fingerprint FROM {} WHERE id = %s"
)
_CHUNK_RAW = sql.SQL("SELECT raw FROM {} WHERE id = %s")


class Planned(Protocol):
    """What the batch's planner (`consumers.batch.planner`) makes of an epoch's records that
    were staged without a plan, as the publisher uses it."""

    @property
    def targets(self) -> dict[str, Target]: ...
    @property
    def plans(self) -> dict[str, list[Step]] | None: ...
    @property
    def changes(self) -> list[Step]: ...


class Planner(Protocol):
    """The batch's planner, as the publisher uses it. A protocol, so that the epochs sit below
    the batch that uses them (import contract `consumer-layers`)."""

    @property
    def follows(self) -> bool: ...
    def plan(
        self,
        records: dict[PartitionKey, list[Record]],
        conn: psycopg.Connection[Any] | None,
        *,
        in_flight: list[Step],
        publishing: bool = False,
        staged: set[str] | None = None,
    ) -> Planned: ...
    def made(self, changes: list[Step]) -> None: ...
    def drifted(self) -> None: ...
    def fingerprint(self, topic: str) -> str | None: ...


@dataclass
class _Published:
    records: int = 0
    applied: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    changes: list[Step] = field(default_factory=list)


class EpochPublisher:
    def __init__(
        self,
        *,
        db: DatabaseSession,
        ledger: LedgerNames,
        group_id: str,
        planner: Planner,
        applier: Applier,
        metrics: ConsumerMetrics,
        whole_topic: Callable[[str], bool],
        incomplete_after_s: float,
        hold_bound: Callable[[str], float | None] = lambda topic: None,
    ) -> None:
        self._db = db
        self._ledger = ledger
        self._group = group_id
        self._planner = planner
        self._applier = applier
        self._metrics = metrics
        self._whole_topic = whole_topic
        self._incomplete_after_s = incomplete_after_s
        self._hold_bound = hold_bound
        # What the look under way found, for its report (`LedgerLook`).
        self._published_now: list[EpochKey] = []
        self._open_now: tuple[frozenset[EpochKey], float] | None = None
        self._next_look = 0.0
        self._next_prune = 0.0
        self._failures = HoldBackoff(
            what="an epoch cannot be published",
            consequence="none of it is visible, its records stay staged",
            recovered="epochs are published again",
        )
        self._incomplete: list[str] = []
        self.published_total = 0
        self._waiting_for: dict[EpochKey, EpochKey] = {}  # said once: whole, waits for that
        # The ledger holds an epoch of the group: asked at each look until it does, never
        # after (epochs' rows stay). A group with whole epochs by default elects then.
        self.knows_epochs = False

    def look(self, asking: list[EpochKey] | None = None) -> LedgerLook:
        """Publish what is whole, when a look is due; note what is incomplete for too long;
        read the manifests of the epochs `asking` names (`EpochAssembly.asking`). What it
        found goes back to the batch owner for the assembly."""
        self._published_now, self._open_now = [], None
        self._look()
        still_open, as_of = self._open_now or (None, 0.0)
        found = self._manifests(asking) if asking else None
        return LedgerLook(tuple(self._published_now), still_open, as_of, found)

    def _look(self) -> None:
        now = time.monotonic()
        if now < max(self._next_look, self._failures.retry_at):
            return
        self._next_look = now + _LOOK_EVERY_S
        current: tuple[list[EpochState], float] | None = None
        idle = self._db.open_connection()
        try:
            try:
                conn = idle or self._db.connect()
                current = self._read_and_publish(conn, until=now + _PUBLISH_BUDGET_S)
            except psycopg.OperationalError:
                if idle is None:
                    raise
                # The idle session was ended meanwhile (a restart, a terminated backend, the
                # loop waiting out a refused batch): not a failure while a new one answers.
                # A publication is never retried here: its errors are EpochNotPublished.
                self._db.close()
                conn = self._db.connect()
                current = self._read_and_publish(conn, until=now + _PUBLISH_BUDGET_S)
        except psycopg.OperationalError as exc:
            self._db.close()
            self._failures.failed(f"database: {exc}")
            return
        except Exception as exc:
            if _is_bug(exc):
                raise
            self._failures.failed(str(exc))
        else:
            self._failures.cleared()
        # Also after a publication failed: the oldest incomplete epoch's age keeps counting.
        try:
            self._note_incomplete(conn, current)
        except psycopg.OperationalError as exc:
            self._db.close()
            self._failures.failed(f"database: {exc}")

    def _waits(self, key: EpochKey, first: EpochKey, where: str) -> None:
        """A whole epoch waits for another query's epoch whose records come before its own
        (`ledger.comes_first`): said once; if that one never completes, its own incomplete
        notice names it, and the operator settles it (`bridge epochs`)."""
        if self._waiting_for.get(key) == first:
            return
        if len(self._waiting_for) > 1_000:
            self._waiting_for.clear()
        self._waiting_for[key] = first
        log.info(
            "epoch %s of query %s is whole and waits for epoch %s of query %s, whose records "
            "come before its own in %s (a table is left as the records one by one would leave "
            "it)", key[1], key[0], first[1], first[0], where,
        )  # fmt: skip

    def _read_and_publish(
        self, conn: psycopg.Connection[Any], *, until: float
    ) -> tuple[list[EpochState], float] | None:
        # Replays first: a replayed epoch's staged records read as an open epoch of its query,
        # ahead of the query's next ones, which would wait for it.
        self._skip_replays(conn)
        current = self._publish_whole(conn, until=until)
        self._prune(conn)
        if not self.knows_epochs:
            # None: it published until its budget ran out.
            self.knows_epochs = (
                current is None or bool(current[0]) or knows_epochs(conn, self._ledger, self._group)
            )
        return current

    def _prune(self, conn: psycopg.Connection[Any]) -> None:
        """Settled epochs past their keep deleted (`ledger.prune_settled`), every
        `_PRUNE_EVERY_S` rather than at each look: an epoch a second settles at a 1 s trigger.
        Sooner while a batch of them comes full (a ledger upgraded with its history)."""
        now = time.monotonic()
        if now < self._next_prune:
            return
        with conn.transaction():
            gone = prune_settled(conn, self._ledger, self._group, limit=_PRUNE_BATCH)
        self._next_prune = now + (_PRUNE_AGAIN_S if gone >= _PRUNE_BATCH else _PRUNE_EVERY_S)

    def _skip_replays(self, conn: psycopg.Connection[Any]) -> None:
        """Records staged of an epoch at or below its query's watermark are a replay's: their
        tables hold them already. They go, counted and named, never to a table."""
        for key, records in sorted(replayed(conn, self._ledger, self._group).items()):
            with conn.transaction():
                skip_replayed(conn, self._ledger, self._group, key)
            self._metrics.replayed_epoch_records(key[0]).inc(records)
            log.warning(
                "epoch %s of query %s came again after it was settled (%d records: its driver "
                "replayed an epoch it had committed, its markers expired, or an offsets reset "
                "read them again); its tables hold it already: skipped", key[1], key[0],
                records,
            )  # fmt: skip

    def _manifests(self, keys: list[EpochKey]) -> dict[EpochKey, Manifest] | None:
        """The ledger's manifest of each open epoch of `keys` (`ledger.manifests`), for the
        assembly; None when the database cannot say now: the epochs' records are held, then
        staged, as with no manifest yet, and asked about again."""
        try:
            conn = self._db.open_connection() or self._db.connect()
            return manifests(conn, self._ledger, self._group, keys)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                self._db.close()
            log.warning("the ledger could not say what it holds of epochs %s: %s", keys, exc)
            return None

    def reasons(self) -> list[str]:
        """For `/readyz`: a publication that fails, and epochs incomplete for too long."""
        return self._failures.reasons() + self._incomplete

    def close(self) -> None:
        self._db.close()

    # -- publishing ---------------------------------------------------------------------------

    def _publish_whole(
        self, conn: psycopg.Connection[Any], *, until: float
    ) -> tuple[list[EpochState], float] | None:
        """Publish what is whole until nothing is, or the budget is spent. When the last read
        of the open epochs led to no publication, they are still the ledger's: that read, and
        when it began (monotonic), so that the look's report needs no second one; else None."""
        while time.monotonic() < until:
            read_at = time.monotonic()
            states = open_epochs(conn, self._ledger, self._group)
            ready = publishable(states, self._whole_topic)
            if not any([self._publish(conn, state) for state in ready]):
                return states, read_at  # nothing whole, or taken by other members
        return None

    def _publish(self, conn: psycopg.Connection[Any], state: EpochState) -> bool:
        """Steps 1 to 4 for one epoch; whether this member published it."""
        started = time.perf_counter()
        done = _Published()
        stamps: list[int] = []
        try:
            with conn.transaction():
                # Steps 1 and 2: locked, and judged ready under the lock.
                locked = take(
                    conn, self._ledger, self._group, state.key, self._whole_topic, self._waits
                )
                if locked is None:
                    return False
                stamps = self._apply_staged(conn, state.key, done)  # step 3
                published(conn, self._ledger, self._group, state.key)  # step 4
        except psycopg.Error as exc:
            if _drifted(exc, self._planner):
                self._planner.drifted()
            raise EpochNotPublished(state, str(exc)) from exc
        except Exception as exc:
            if _is_bug(exc):
                raise
            raise EpochNotPublished(state, str(exc)) from exc
        self._planner.made(done.changes)
        self._published_now.append(state.key)
        self._counted(done, stamps, time.perf_counter() - started)
        log.info(
            "epoch published",
            extra={"query": state.query, "epoch": state.epoch, "records": done.records,
                   "forced": locked.forced},
        )  # fmt: skip
        return True

    def _apply_staged(
        self, conn: psycopg.Connection[Any], key: EpochKey, done: _Published
    ) -> list[int]:
        """The epoch's chunks, in the order they were staged (each Kafka partition's in offset
        order), written to their tables in the caller's transaction: by the plan a chunk was
        staged with, or, without one or when the table refuses it, as any batch is. Returns a
        sample of the records' timestamps, for the latency."""
        sample: list[int] = []
        staged = EveryStage()  # each plan empties the upsert staging table it uses first
        query, epoch = key
        ids = conn.execute(
            _CHUNK_IDS.format(self._ledger.chunks), (self._group, query, epoch)
        ).fetchall()
        # Binary: the chunks' bytes come as they are, not in hex.
        read = conn.cursor(binary=True)
        for (chunk,) in ids:  # one chunk's bytes in memory at a time
            row = read.execute(_CHUNK_PLAN.format(self._ledger.chunks), (chunk,)).fetchone()
            assert row is not None  # noqa: S101 - the epoch's row is locked: nothing deletes it
            topic, records, rows, plan, stamps, made_for = row
            done.records += records
            sample += stamps_of(stamps)
            if plan is not None and made_for != self._planner.fingerprint(topic):
                log.info(
                    "a staged plan of topic %s was made for another route, table or release: "
                    "its records are planned again", topic,
                )  # fmt: skip
                plan = None
            if plan is not None and _ran(conn, plan):
                _add(done.applied, topic, (rows, 0, 0))
                continue
            (raw,) = read.execute(_CHUNK_RAW.format(self._ledger.chunks), (chunk,)).fetchall()[0]
            unpacked = unpack_records(raw, topic=topic, query=query, epoch=epoch)
            planned = self._planner.plan(
                _by_partition(unpacked), conn, in_flight=[], publishing=True, staged=staged
            )
            run_steps(conn, planned.changes)
            done.changes += planned.changes
            self._write(conn, planned, unpacked, staged, done)
        return sample

    def _write(
        self,
        conn: psycopg.Connection[Any],
        planned: Planned,
        records: list[Record],
        staged: set[str],
        done: _Published,
    ) -> None:
        applied = done.applied
        if planned.plans is not None:  # every record a row: the planned statements
            try:
                with conn.transaction():
                    run_steps(conn, list(chain.from_iterable(planned.plans.values())))
            except psycopg.Error as exc:
                if not isinstance(exc, RECORD_FAULTS):
                    raise
            else:
                for topic, plan in planned.plans.items():
                    rows = sum(len(s.rows) for s in plan if s.rows is not None)
                    _add(applied, topic, (rows, 0, 0))
                return
        for topic, of_topic in _by_topic(records).items():
            counts = self._applier.apply(conn, planned.targets[topic], of_topic, staged)
            _add(applied, topic, (counts.applied + counts.deleted, counts.dead, counts.skipped))

    def _counted(self, done: _Published, sample: list[int], seconds: float) -> None:
        self.published_total += 1
        self._metrics.epochs_published(path="staged").inc()
        for topic, (rows, dead, skipped) in done.applied.items():
            self._metrics.records_applied(topic).inc(rows)
            self._metrics.dead_letters(topic).inc(dead)
            self._metrics.records_skipped(topic).inc(skipped)
        self._metrics.visible(sample, seconds)

    # -- reporting ----------------------------------------------------------------------------

    def _note_incomplete(
        self, conn: psycopg.Connection[Any], current: tuple[list[EpochState], float] | None
    ) -> None:
        """The open epochs' ages, and those incomplete too long, from `current` (this look's
        read, with when it began, none published since) or a read of their own."""
        if current is None:
            as_of = time.monotonic()
            states = open_epochs(conn, self._ledger, self._group)
        else:
            states, as_of = current
        ages: list[float] = []
        if states:
            now = database_now(conn)
            ages = [age_s(s, now) for s in states]
            settled = self._settle_overdue(conn, states, ages)
            if settled:
                kept = [(s, a) for s, a in zip(states, ages, strict=True) if s.key not in settled]
                states, ages = [s for s, _ in kept], [a for _, a in kept]
        self._open_now = (frozenset(s.key for s in states), as_of)
        self._metrics.oldest_incomplete_epoch.set(max(ages, default=0.0))
        self._incomplete = [
            state.held_too_long(self._whole_topic, age)
            for state, age in zip(states, ages, strict=True)
            if age >= self._incomplete_after_s
        ][:10]

    def _settle_overdue(
        self, conn: psycopg.Connection[Any], states: list[EpochState], ages: list[float]
    ) -> set[EpochKey]:
        """Discard each epoch open longer than its routes' `epochs_hold_s` (the smallest of the
        routes of the topics it has records of) that lacks something: its query is taken as
        gone for good, and its records go to the dead letters, kept for `bridge dead-letters
        replay`, as an operator's `bridge epochs discard` sends them, with an audit row naming
        the policy. One whole (or forced) is left to wait (for an earlier epoch, or another
        query's before it in a partition), and publishes once that is settled. Returns the
        epochs it discarded; one another member settled meanwhile is left to it."""
        settled: set[EpochKey] = set()
        for state, age in zip(states, ages, strict=True):
            topics = {t for written in state.written.values() for t in written}
            topics |= {topic for _, topic in state.staged}
            bounds = [b for b in map(self._hold_bound, sorted(topics)) if b is not None]
            ready = state.phase(state.lacks(self._whole_topic)) in _PUBLISHABLE
            if not bounds or age < min(bounds) or ready:
                continue
            policy = f"the policy epochs_hold_s: {min(bounds):g}"
            try:
                with conn.transaction():
                    held = hold(conn, self._ledger, self._group, state.key, self._whole_topic)
                    if held.phase in _PUBLISHABLE:  # whole after all, under the lock
                        continue
                    dead_letters = sql.Identifier(self._ledger.schema, DEAD_LETTERS_TABLE)
                    moved = discard(conn, self._ledger, dead_letters, held, requested_by=policy)
            except BridgeError as exc:  # published or settled by another member meanwhile
                log.info("epoch %s of query %s not discarded by policy: %s", state.epoch,
                         state.query, exc)  # fmt: skip
                continue
            settled.add(state.key)
            log.warning(
                "epoch %s of query %s was open for %.0fs, past %s: discarded, its %d staged "
                "record(s) moved to the dead letters (bridge dead-letters replay brings them "
                "back); it lacked: %s", state.epoch, state.query, age, policy, moved, held.lacking,
            )  # fmt: skip
        return settled


_PUBLISHABLE = (EpochPhase.WHOLE, EpochPhase.FORCED)  # waits for nothing of its own


class EpochNotPublished(Exception):
    def __init__(self, state: EpochState, why: str) -> None:
        super().__init__(f"query {state.query} epoch {state.epoch}: {why}")


def _ran(conn: psycopg.Connection[Any], plan: bytes) -> bool:
    """Run a chunk's plan under a savepoint; False, with nothing of it written, when the
    database refuses it for its rows or its table (the chunk's records are then written as any
    batch's are, which finds the record to dead-letter or plans against the table as it is)."""
    try:
        with conn.transaction():
            for statement, data in unpack_plan(plan):
                if data is None:
                    conn.execute(statement)
                    continue
                with conn.cursor().copy(statement) as copy:
                    copy.write(data)
    except psycopg.Error as exc:
        if is_lost(exc) or refusal_of(exc) is not None:
            raise  # not the records': the publication fails, and is tried again
        log.info("a staged plan was refused at publication, writing its records again: %s", exc)
        return False
    return True


def _by_partition(records: list[Record]) -> dict[PartitionKey, list[Record]]:
    found: dict[PartitionKey, list[Record]] = defaultdict(list)
    for record in records:
        found[(record.topic(), record.partition())].append(record)  # type: ignore[index]
    return dict(found)


def _by_topic(records: list[Record]) -> dict[str, list[Record]]:
    """Each topic's records, partition after partition, as the batch's planner groups them."""
    found: dict[str, list[Record]] = defaultdict(list)
    for (topic, _), of_partition in _by_partition(records).items():
        found[topic].extend(of_partition)
    return dict(found)


def _add(
    applied: dict[str, tuple[int, int, int]], topic: str, counts: tuple[int, int, int]
) -> None:
    before = applied.get(topic, (0, 0, 0))
    applied[topic] = (before[0] + counts[0], before[1] + counts[1], before[2] + counts[2])


def _drifted(exc: psycopg.Error, planner: Planner) -> bool:
    return planner.follows and isinstance(exc, DRIFT)


def _is_bug(exc: BaseException) -> bool:
    """Errors no fault outside explains: raised, not retried."""
    return isinstance(exc, (AssertionError, TypeError, AttributeError, NameError, KeyError))
