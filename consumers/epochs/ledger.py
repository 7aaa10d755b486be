"""The ledger of whole epochs, in bridge's state schema: what each group knows of each Spark epoch,
and the records it holds back until the epoch is whole.

A group whose routes want whole epochs (`epochs: whole`) keeps, per (query, epoch):

- `epochs`: the epoch's row, made by its first part that names a topic the group holds back;
  the Spark partitions the driver's epoch record names (`parts`, NULL until it comes); whether
  an operator forced it; and its outcome (`published`, `discarded`) once settled. Rows stay
  after publication: a driver that replays its commit hook writes the same epoch record again,
  and the row says it is done;
- `epoch_parts`: each write task's part, the records it wrote per topic;
- `epoch_chunks`: the records themselves, a chunk per batch, topic and epoch
  (`consumers.epochs.chunks`), staged in the batch that advances their offsets, until
  the epoch is published in one transaction;
- `epoch_staged`: how many records of each (Spark partition, topic) each Kafka partition staged.
  Keyed by the Kafka partition, so that only the member holding it ever writes a row: members
  staging the same epoch never wait on each other's locks;
- `epoch_actions`: the audit trail of `bridge epochs publish` and `discard`.

The members coordinate through these rows only: an epoch is published by whichever member first
locks its `epochs` row (FOR UPDATE SKIP LOCKED) and finds it whole under the lock.

**The one judge.** Whether an epoch is whole is `epoch_lacks`, a function of the state schema
(migration 0004), asked under the epoch's row lock by every path that settles an epoch: the
publisher (`take`), the batch that publishes an epoch itself (`publish_in_batch`), and the
operator's commands (`judge`, after `lock`). `EpochState.lacks` is the same rule in memory, for
what only forecasts (the assembly choosing to hold records, the publisher choosing what to
lock) and for display; tests/integration/test_epoch_judge.py holds the two equal.

**Phases.** An epoch's phase is read from its row and the judge's verdict (`EpochState.phase`):

| phase        | meaning                                                  | leaves by          |
|--------------|----------------------------------------------------------|--------------------|
| `open`       | its record, a part or some of its records are to come    | staging; operator  |
| `whole`      | nothing lacking: the next member to look publishes it    | publication        |
| `forced`     | an operator asked to publish it as it is                 | publication        |
| `overstaged` | more records staged than its parts wrote, or staged      | discard only       |
|              | after it was settled (an offsets reset read them again)  | (publish: twice)   |
| `published`  | its records are in their tables                          | records restaged   |
| `discarded`  | its staged records are dead letters                      | records restaged   |

Every move is an event (`EpochEvent`) looked up in `TRANSITIONS`; a pair it does not list is
refused (`IllegalEpochMove`), which is how `bridge epochs publish` refuses an overstaged epoch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from bridge.errors import BridgeError
from consumers.database.dead_letters import write_dead_letters
from consumers.database.ledger_tables import LedgerNames
from consumers.epochs.chunks import unpack_records

PUBLISHED = "published"
DISCARDED = "discarded"


class EpochPhase(StrEnum):
    OPEN = "open"
    WHOLE = "whole"
    FORCED = "forced"
    OVERSTAGED = "overstaged"
    PUBLISHED = "published"
    DISCARDED = "discarded"


class EpochEvent(StrEnum):
    STAGED = "staged"  # records, a part or the epoch record came, and it still lacks some
    COMPLETED = "completed"  # ... and now it lacks nothing
    STAGED_TWICE = "staged_twice"  # more records staged than written, or after it was settled
    FORCED = "forced"  # `bridge epochs publish`
    PUBLISHED = "published"  # by the publisher, or by the batch that held it whole
    DISCARDED = "discarded"  # `bridge epochs discard`


P, E = EpochPhase, EpochEvent
# (phase, event) -> the phase it moves to. A pair not listed is refused.
TRANSITIONS: dict[tuple[EpochPhase, EpochEvent], EpochPhase] = {
    (P.OPEN, E.STAGED): P.OPEN,
    (P.OPEN, E.COMPLETED): P.WHOLE,
    (P.OPEN, E.STAGED_TWICE): P.OVERSTAGED,
    (P.OPEN, E.FORCED): P.FORCED,
    # Only by the batch that holds it whole in memory: the judge counts that batch's records.
    (P.OPEN, E.PUBLISHED): P.PUBLISHED,
    (P.OPEN, E.DISCARDED): P.DISCARDED,
    # A replayed task's part may come after the others: it can lack again.
    (P.WHOLE, E.STAGED): P.OPEN,
    (P.WHOLE, E.COMPLETED): P.WHOLE,
    (P.WHOLE, E.STAGED_TWICE): P.OVERSTAGED,
    (P.WHOLE, E.FORCED): P.FORCED,
    (P.WHOLE, E.PUBLISHED): P.PUBLISHED,
    (P.WHOLE, E.DISCARDED): P.DISCARDED,
    (P.FORCED, E.STAGED): P.FORCED,
    (P.FORCED, E.COMPLETED): P.FORCED,
    (P.FORCED, E.STAGED_TWICE): P.OVERSTAGED,
    (P.FORCED, E.FORCED): P.FORCED,
    (P.FORCED, E.PUBLISHED): P.PUBLISHED,
    (P.FORCED, E.DISCARDED): P.DISCARDED,
    (P.OVERSTAGED, E.STAGED): P.OVERSTAGED,
    (P.OVERSTAGED, E.STAGED_TWICE): P.OVERSTAGED,
    (P.OVERSTAGED, E.DISCARDED): P.DISCARDED,
    # A settled epoch's record again (a replayed commit hook) changes nothing; its records
    # again (a partition reset below them) are staged twice.
    (P.PUBLISHED, E.STAGED): P.PUBLISHED,
    (P.PUBLISHED, E.STAGED_TWICE): P.OVERSTAGED,
    (P.DISCARDED, E.STAGED): P.DISCARDED,
    (P.DISCARDED, E.STAGED_TWICE): P.OVERSTAGED,
}
del P, E


class IllegalEpochMove(BridgeError):
    def __init__(self, what: str, phase: EpochPhase, event: EpochEvent) -> None:
        refusal = {
            EpochPhase.OVERSTAGED: (
                "it holds records staged twice (an offsets reset read them again): "
                "publishing it would write them twice; discard it instead"
            ),
            EpochPhase.PUBLISHED: "it is published",
            EpochPhase.DISCARDED: "it is discarded",
        }.get(phase, f"{event} is not a move from {phase}")
        super().__init__(f"{what} is {phase}: {refusal}")
        self.phase, self.event = phase, event


def move(what: str, phase: EpochPhase, event: EpochEvent) -> EpochPhase:
    """The phase `event` moves an epoch in `phase` to; `IllegalEpochMove` when it may not."""
    found = TRANSITIONS.get((phase, event))
    if found is None:
        raise IllegalEpochMove(what, phase, event)
    return found


class Lack(NamedTuple):
    """One thing an epoch lacks to be whole: a row of the judge (`epoch_lacks`)."""

    kind: str  # one of the LACK_* below
    spark_partition: int | None = None
    topic: str | None = None
    have: int | None = None  # records staged (or counted by the batch)
    wrote: int | None = None  # records its part wrote

    def __str__(self) -> str:
        part, topic, have, wrote = self.spark_partition, self.topic, self.have, self.wrote
        return {
            LACK_RECORD: "no epoch record in the manifest: the driver has not committed the epoch",
            LACK_PART: f"Spark partition {part}: its part is not in the manifest",
            LACK_RECORDS: f"Spark partition {part}, topic {topic}: "
            f"{have} of {wrote} records staged",
            LACK_OVERSTAGED: f"more records staged than written: Spark partition {part}, "
            f"topic {topic}: {have} staged, its part wrote {wrote}",
            LACK_STRAY: f"records staged from Spark partition {part}, which has no part in the "
            "manifest",
        }[self.kind]

    @property
    def order(self) -> tuple[int, int, str]:
        """The order a reader checks an epoch in, as the judge's rule reads."""
        rank = 2 if self.kind == LACK_STRAY else 1
        return (
            0 if self.kind == LACK_RECORD else rank,
            self.spark_partition or 0,
            self.topic or "",
        )


LACK_RECORD, LACK_PART, LACK_RECORDS = "no epoch record", "part missing", "short"
LACK_OVERSTAGED, LACK_STRAY = "overstaged", "stray part"


EpochKey = tuple[str, int]  # (query, epoch)
Counted = Mapping[int, Mapping[str, int]]  # spark partition: {topic: records}


@dataclass
class EpochState:
    """What a group's ledger says of one epoch that is open (or holds records staged after it
    was settled: a partition reset below it)."""

    group: str
    query: str
    epoch: int
    parts: tuple[int, ...] | None = None  # from the driver's epoch record
    seen_at: datetime | None = None
    forced: bool = False
    outcome: str | None = None
    written: dict[int, dict[str, int]] = field(default_factory=dict)  # part: {topic: records}
    staged: dict[tuple[int, str], int] = field(default_factory=dict)  # (part, topic): records

    @property
    def key(self) -> EpochKey:
        return self.query, self.epoch

    @property
    def staged_records(self) -> int:
        return sum(self.staged.values())

    def lacks(self, whole_topic: Callable[[str], bool]) -> list[Lack]:
        """The judge's rule (`epoch_lacks`) on what this state holds, in memory: what the
        epoch lacks to be whole for a group whose `whole_topic` records wait for it. Topics the
        group does not hold back are not waited for."""
        if self.parts is None:
            return [Lack(LACK_RECORD)]
        lacking = []
        # The parts the epoch record names, and any other part of the epoch in the manifest:
        # a replay whose tasks are fewer (Spark's parallelism changed with its executors) names
        # only its own, yet the first attempt's committed parts, records and all, are the
        # epoch's too. Every part precedes its epoch's record in the manifest's one partition,
        # so once the record is here, so are they.
        for part in sorted(set(self.parts) | set(self.written)):
            written = self.written.get(part)
            if written is None:
                lacking.append(Lack(LACK_PART, part))
                continue
            for topic, records in sorted(written.items()):
                if not whole_topic(topic):
                    continue
                staged = self.staged.get((part, topic), 0)
                if staged != records:
                    kind = LACK_RECORDS if staged < records else LACK_OVERSTAGED
                    lacking.append(Lack(kind, part, topic, staged, records))
        strays = sorted({part for part, _ in self.staged if part not in self.written})
        lacking += [Lack(LACK_STRAY, part) for part in strays]
        return lacking

    def missing(self, whole_topic: Callable[[str], bool]) -> list[str]:
        """What the epoch lacks, in words; empty when it is whole."""
        return [str(lack) for lack in self.lacks(whole_topic)]

    def phase(self, lacks: Iterable[Lack]) -> EpochPhase:
        """Its phase, by its row and the judge's `lacks` of it."""
        if self.outcome is not None:
            return EpochPhase.OVERSTAGED if self.staged else EpochPhase(self.outcome)
        lacking = list(lacks)
        if any(lack.kind == LACK_OVERSTAGED for lack in lacking):
            return EpochPhase.OVERSTAGED
        if self.forced:
            return EpochPhase.FORCED
        return EpochPhase.OPEN if lacking else EpochPhase.WHOLE

    def describe(self, whole_topic: Callable[[str], bool]) -> str:
        what = "; ".join(self.missing(whole_topic)) or "whole"
        return f"query {self.query} epoch {self.epoch} ({self.staged_records} staged): {what}"

    def held_too_long(self, whole_topic: Callable[[str], bool], age: float) -> str:
        """What `/readyz` and `bridge status` say of an epoch open too long: which, what it
        lacks, and the commands that settle it, which an operator runs once its query is
        known to be gone (docs/operations.md, "Operator tools")."""
        where = f"--group {self.group} --query {self.query} --epoch {self.epoch}"
        return (
            f"epoch incomplete for {age:.0f}s: {self.describe(whole_topic)}; if its query "
            f"will not finish it, settle it: `bridge epochs discard {where} --execute` (its "
            f"records to the dead letters) or `bridge epochs publish {where} --execute` (as it "
            "is)"
        )


def judge(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    group: str,
    key: EpochKey,
    whole_topic: Callable[[str], bool],
    counted: Counted | None = None,
) -> list[Lack]:
    """What the epoch lacks to be whole, by the ledger's one judge (`epoch_lacks`), in the
    caller's transaction: under the epoch's row lock, for a verdict that holds until it
    commits. `counted`: records a batch holds of it, judged instead of those staged."""
    topics = [
        topic
        for (topic,) in conn.execute(
            sql.SQL(
                "SELECT DISTINCT jsonb_object_keys(records) FROM {} "
                "WHERE group_id = %s AND query = %s AND epoch = %s"
            ).format(names.parts),
            (group, *key),
        )
    ]
    found = conn.execute(
        sql.SQL("SELECT * FROM {}(%s, %s, %s, %s::text[], %s::jsonb)").format(names.judge),
        (group, *key, [t for t in topics if whole_topic(t)], _counted_json(counted)),
    ).fetchall()
    return sorted((Lack(*row) for row in found), key=lambda lack: lack.order)


def _counted_json(counted: Counted | None) -> str | None:
    if counted is None:
        return None
    return json.dumps({str(part): dict(topics) for part, topics in counted.items()})


def knows_epochs(conn: psycopg.Connection[Any], names: LedgerNames, group: str) -> bool:
    """Whether the ledger holds an epoch of `group`, open or settled: a part of it was read, or
    records of it staged, or its watermark says it settled some (their rows pruned)."""
    found = conn.execute(
        sql.SQL(
            "SELECT EXISTS (SELECT FROM {} WHERE group_id = %(group)s) "
            "OR EXISTS (SELECT FROM {} WHERE group_id = %(group)s)"
        ).format(names.epochs, names.watermarks),
        {"group": group},
    ).fetchone()
    return found is not None and bool(found[0])


def open_epochs(conn: psycopg.Connection[Any], names: LedgerNames, group: str) -> list[EpochState]:
    """Every epoch of `group` not settled, or holding staged records, in (query, epoch) order."""
    states: dict[EpochKey, EpochState] = {}

    def state(query: str, epoch: int) -> EpochState:
        return states.setdefault((query, epoch), EpochState(group, query, epoch))

    # Two branches, not one OR: each reaches its rows by an index (the open ones by
    # `epochs_open`, the settled ones records were staged for again by the primary key), where
    # the OR read every epoch the group ever settled, a sequential scan growing with its age.
    # The second looks each staged epoch up (LATERAL ... LIMIT 1, which the planner cannot
    # turn into a join): as a join, a small table's statistics chose a hash join over a
    # sequential scan, which reads every page of a table that held a long history once.
    for query, epoch, parts, seen_at, forced, outcome in conn.execute(
        sql.SQL(
            "SELECT query, epoch, parts, seen_at, forced, outcome FROM {epochs} "
            "WHERE group_id = %(group)s AND outcome IS NULL "
            "UNION ALL "
            "SELECT e.query, e.epoch, e.parts, e.seen_at, e.forced, e.outcome "
            "FROM (SELECT DISTINCT query, epoch FROM {staged} WHERE group_id = %(group)s) AS s "
            "CROSS JOIN LATERAL (SELECT * FROM {epochs} AS x WHERE x.group_id = %(group)s "
            "AND x.query = s.query AND x.epoch = s.epoch AND x.outcome IS NOT NULL LIMIT 1) AS e"
        ).format(epochs=names.epochs, staged=names.staged),
        {"group": group},
    ):
        found = state(query, epoch)
        found.parts = None if parts is None else tuple(sorted(parts))
        found.seen_at, found.forced, found.outcome = seen_at, forced, outcome
    for query, epoch, part, records in conn.execute(
        sql.SQL(
            # Each part's epoch looked up by the primary key, as above.
            "SELECT p.query, p.epoch, p.spark_partition, p.records FROM {parts} AS p "
            "CROSS JOIN LATERAL (SELECT FROM {epochs} AS e WHERE e.group_id = %(group)s "
            "AND e.query = p.query AND e.epoch = p.epoch AND e.outcome IS NULL LIMIT 1) AS e "
            "WHERE p.group_id = %(group)s"
        ).format(parts=names.parts, epochs=names.epochs),
        {"group": group},
    ):
        state(query, epoch).written[part] = dict(records)
    for query, epoch, part, topic, records, first in conn.execute(
        sql.SQL(
            "SELECT query, epoch, spark_partition, topic, sum(records), min(first_staged_at) "
            "FROM {} WHERE group_id = %s GROUP BY query, epoch, spark_partition, topic"
        ).format(names.staged),
        (group,),
    ):
        found = state(query, epoch)
        found.staged[(part, topic)] = int(records)
        if found.seen_at is None or first < found.seen_at:
            found.seen_at = first
    return [states[key] for key in sorted(states)]


_READY = (EpochPhase.WHOLE, EpochPhase.FORCED)


def publishable(
    states: Iterable[EpochState], whole_topic: Callable[[str], bool]
) -> list[EpochState]:
    """Of each query's open epochs, the first, when it looks whole or is forced: epochs of a
    query publish in epoch order, so a later one waits for the one before. A forecast, from
    what was read without a lock: `take` asks the judge under it."""
    first: dict[str, EpochState] = {}
    for found in states:
        if found.outcome is None or found.staged:
            first.setdefault(found.query, found)
    return [s for s in first.values() if s.phase(s.lacks(whole_topic)) in _READY]


def age_s(found: EpochState, now: datetime) -> float:
    return 0.0 if found.seen_at is None else max(0.0, (now - found.seen_at).total_seconds())


def database_now(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock: the ledger's times are its own."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None  # noqa: S101 - SELECT returns its row
    return row[0]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Held:
    """An epoch an operator acts on, locked in the command's transaction, and judged under
    the lock: nothing settles it meanwhile."""

    state: EpochState
    lacks: list[Lack]
    phase: EpochPhase

    @property
    def lacking(self) -> str:
        return "; ".join(map(str, self.lacks)) or "nothing"

    @property
    def what(self) -> str:
        return f"query {self.state.query} epoch {self.state.epoch}"


def hold(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    group: str,
    key: EpochKey,
    whole_topic: Callable[[str], bool],
) -> Held:
    """In the caller's transaction: the epoch's row locked, then read and judged. A member
    publishing it is waited for. Only an epoch that is open, or holds staged records, can be
    held; `BridgeError` otherwise."""
    query, epoch = key
    unknown = BridgeError(f"query {query} epoch {epoch} is not open in this group "
                          "(published or unknown)")  # fmt: skip
    where = sql.SQL("WHERE group_id = %s AND query = %s AND epoch = %s")
    locked = conn.execute(
        sql.SQL("SELECT 1 FROM {} ").format(names.epochs) + where + sql.SQL(" FOR UPDATE"),
        (group, *key),
    ).fetchone()
    if locked is None:  # only staged records know it (their parts never came): its row made
        if conn.execute(sql.SQL("SELECT 1 FROM {} ").format(names.staged) + where + sql.SQL(
                " LIMIT 1"), (group, *key)).fetchone() is None:  # fmt: skip
            raise unknown
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (group_id, query, epoch) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
            ).format(names.epochs),
            (group, *key),
        )
        conn.execute(
            sql.SQL("SELECT 1 FROM {} ").format(names.epochs) + where + sql.SQL(" FOR UPDATE"),
            (group, *key),
        )
    found = _state(conn, names, group, key)
    if found is None:
        raise unknown
    lacks = judge(conn, names, group, key, whole_topic)
    return Held(found, lacks, found.phase(lacks))


def discard(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    dead_letters: sql.Identifier,
    held: Held,
    *,
    requested_by: str,
) -> int:
    """In the transaction that `hold` locked it in: the epoch's staged records go to the dead
    letters (nothing is lost: they can be replayed from there), the epoch is settled as
    discarded, and the audit row names who asked and what the epoch lacked. Returns how many
    records it held."""
    move(held.what, held.phase, EpochEvent.DISCARDED)
    group, key = held.state.group, held.state.key
    query, epoch = key
    error = f"epoch {epoch} of query {query} discarded by {requested_by}: {held.lacking}"
    moved = 0
    chunks = conn.execute(
        sql.SQL(
            "SELECT topic, raw FROM {} WHERE group_id = %s AND query = %s AND epoch = %s "
            "ORDER BY id"
        ).format(names.chunks),
        (group, *key),
    ).fetchall()
    for topic, raw in chunks:
        records = unpack_records(bytes(raw), topic=topic, query=query, epoch=epoch)
        write_dead_letters(conn, dead_letters, group, [(r, error) for r in records])
        moved += len(records)
    _clear(conn, names, group, key)
    _settle(conn, names, group, key, DISCARDED)
    _audit(conn, names, group, key, "discard", held.lacking, moved, requested_by)
    return moved


def force(
    conn: psycopg.Connection[Any], names: LedgerNames, held: Held, *, requested_by: str
) -> None:
    """In the transaction that `hold` locked it in: the epoch is marked to be published as it
    is, by the next member that looks (whole or not), with the audit row. An overstaged epoch
    is refused (`IllegalEpochMove`): publishing it would write records twice."""
    move(held.what, held.phase, EpochEvent.FORCED)
    group, key = held.state.group, held.state.key
    conn.execute(
        sql.SQL(
            "UPDATE {} SET forced = true WHERE group_id = %s AND query = %s AND epoch = %s"
        ).format(names.epochs),
        (group, *key),
    )
    _audit(conn, names, group, key, "publish", held.lacking, held.state.staged_records,
           requested_by)  # fmt: skip


def _state(
    conn: psycopg.Connection[Any], names: LedgerNames, group: str, key: EpochKey
) -> EpochState | None:
    return next((s for s in open_epochs(conn, names, group) if s.key == key), None)


def _clear(conn: psycopg.Connection[Any], names: LedgerNames, group: str, key: EpochKey) -> None:
    for table in (names.chunks, names.staged, names.parts):
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE group_id = %s AND query = %s AND epoch = %s").format(
                table
            ),
            (group, *key),
        )


def _settle(
    conn: psycopg.Connection[Any], names: LedgerNames, group: str, key: EpochKey, outcome: str
) -> None:
    conn.execute(
        sql.SQL(
            "UPDATE {} SET outcome = %s, settled_at = now(), forced = false "
            "WHERE group_id = %s AND query = %s AND epoch = %s"
        ).format(names.epochs),
        (outcome, group, *key),
    )
    conn.execute(advance_watermark(names, group, key[0]))


_NO_EPOCH = 2**63 - 1  # above every epoch: a query with no open epoch


def advance_watermark(names: LedgerNames, group: str, query: str) -> sql.Composed:
    """For the transaction that settles an epoch of `query`: its watermark moved to the highest
    settled epoch below which the group holds none open (migration 0006), never back. Sound
    because a query's epochs publish in order and the manifest names an epoch's parts before
    the next epoch's: no epoch at or below it can open again."""
    return sql.SQL(
        # max() alone, so that PostgreSQL reads it from the primary key's end backwards
        # (an aggregate beside it would read every settled epoch below the open ones).
        "INSERT INTO {marks} AS w (group_id, query, settled_through) "
        "SELECT {group}, {query}, x.top FROM (SELECT max(e.epoch) AS top FROM {epochs} AS e "
        "WHERE e.group_id = {group} AND e.query = {query} AND e.outcome IS NOT NULL "
        "AND e.epoch < coalesce((SELECT min(o.epoch) FROM {epochs} AS o WHERE o.group_id = "
        "{group} AND o.query = {query} AND o.outcome IS NULL), {none})) AS x "
        "WHERE x.top IS NOT NULL "
        "ON CONFLICT (group_id, query) DO UPDATE SET settled_through = "
        "greatest(w.settled_through, EXCLUDED.settled_through), moved_at = now()"
    ).format(
        marks=names.watermarks,
        epochs=names.epochs,
        group=sql.Literal(group),
        query=sql.Literal(query),
        none=sql.Literal(_NO_EPOCH),
    )


# Settled epochs kept per query below its watermark: the recent history `bridge status` and an
# operator read (which epochs were published, and when; 17 minutes at a 1 s trigger); the
# watermark holds what the older ones said. A count, not an age, so that the prune's search is
# a range of the primary key holding only what it deletes: its cost does not grow with the
# history, and the ledger holds the open epochs plus this many rows per query.
KEEP_SETTLED = 1_000
# A query's topics are forgotten once no part named them for this long: the sink's default
# manifest retention (`epochs.retention.ms`), past which a group could not read the query's
# epochs anyway. A query that writes again is named again by its next part.
TOPICS_UNSEEN = timedelta(days=7)


def prune_settled(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    group: str,
    *,
    limit: int = 1_000,
    keep: int = KEEP_SETTLED,
) -> int:
    """Up to `limit` settled epochs more than `keep` below their query's watermark deleted,
    with parts a replay left of epochs at or below it, in the caller's transaction: the
    watermark says all they said. An epoch holding staged records (overstaged) stays until
    they are settled. Returns how many epochs went."""
    gone = conn.execute(
        sql.SQL(
            # Per query, its oldest settled epochs from the primary key's start, in order:
            # an index range holding only what goes (and overstaged epochs, which stay).
            "DELETE FROM {epochs} WHERE ctid = ANY(ARRAY(SELECT d.ctid FROM {marks} AS w "
            "CROSS JOIN LATERAL (SELECT e.ctid FROM {epochs} AS e WHERE e.group_id = w.group_id "
            "AND e.query = w.query AND e.epoch <= w.settled_through - %(keep)s "
            "AND e.outcome IS NOT NULL AND NOT EXISTS (SELECT FROM {staged} AS s "
            "WHERE s.group_id = e.group_id AND s.query = e.query AND s.epoch = e.epoch) "
            "ORDER BY e.epoch LIMIT %(limit)s) AS d WHERE w.group_id = %(group)s "
            "LIMIT %(limit)s))"
        ).format(epochs=names.epochs, marks=names.watermarks, staged=names.staged),
        {"group": group, "limit": limit, "keep": keep},
    ).rowcount
    conn.execute(
        sql.SQL(
            "DELETE FROM {parts} AS p USING {marks} AS w WHERE p.group_id = %(group)s "
            "AND w.group_id = p.group_id AND w.query = p.query AND p.epoch <= w.settled_through "
            "AND NOT EXISTS (SELECT FROM {epochs} AS e WHERE e.group_id = p.group_id "
            "AND e.query = p.query AND e.epoch = p.epoch AND e.outcome IS NULL)"
        ).format(parts=names.parts, marks=names.watermarks, epochs=names.epochs),
        {"group": group},
    )
    conn.execute(
        sql.SQL(
            "DELETE FROM {topics} WHERE group_id = %(group)s AND seen_at < now() - %(unseen)s"
        ).format(topics=names.topics),
        {"group": group, "unseen": TOPICS_UNSEEN},
    )
    return max(0, gone)


def replayed(conn: psycopg.Connection[Any], names: LedgerNames, group: str) -> dict[EpochKey, int]:
    """Epochs at or below their query's watermark with records staged: a replay's (a driver
    restarted from an older checkpoint after its markers expired, an offsets reset below
    them), and how many records. Their tables have them already."""
    return {
        (str(query), int(epoch)): int(records)
        for query, epoch, records in conn.execute(
            sql.SQL(
                "SELECT s.query, s.epoch, sum(s.records) FROM {staged} AS s "
                "JOIN {marks} AS w USING (group_id, query) WHERE s.group_id = %s "
                "AND s.epoch <= w.settled_through GROUP BY s.query, s.epoch"
            ).format(staged=names.staged, marks=names.watermarks),
            (group,),
        )
    }


def skip_replayed(
    conn: psycopg.Connection[Any], names: LedgerNames, group: str, key: EpochKey
) -> None:
    """In the caller's transaction: the staged records of a replayed epoch (`replayed`) go,
    never to a table: each is the copy of one its table has."""
    for table in (names.chunks, names.staged):
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE group_id = %s AND query = %s AND epoch = %s").format(
                table
            ),
            (group, *key),
        )


def _audit(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    group: str,
    key: EpochKey,
    action: str,
    missing: str,
    records: int,
    requested_by: str,
) -> None:
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (group_id, query, epoch, action, missing, records, requested_by) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)"
        ).format(names.actions),
        (group, *key, action, missing, records, requested_by),
    )


def published(conn: psycopg.Connection[Any], names: LedgerNames, group: str, key: EpochKey) -> None:
    """In the publishing transaction, after the records are applied: the staged rows go and
    the epoch is settled."""
    _clear(conn, names, group, key)
    _settle(conn, names, group, key, PUBLISHED)


def take(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    group: str,
    key: EpochKey,
    whole_topic: Callable[[str], bool],
    waits: Callable[[EpochKey, EpochKey, str], None] | None = None,
) -> EpochState | None:
    """In the publishing transaction: the epoch's row locked and the epoch judged whole (or
    forced) under the lock, for the caller to write its staged records and settle it
    (`published`). None when another member holds the row (it is publishing it, or an operator
    is acting on it: it is left alone), or the judge finds it not ready, or another epoch's
    records come first (`comes_first`; told to `waits`: this epoch, that one, where)."""
    row = conn.execute(
        sql.SQL(
            "SELECT 1 FROM {} WHERE group_id = %s AND query = %s AND epoch = %s "
            "FOR UPDATE SKIP LOCKED"
        ).format(names.epochs),
        (group, *key),
    ).fetchone()
    if row is None:
        return None
    found = _state(conn, names, group, key)
    if found is None:
        return None
    phase = found.phase(judge(conn, names, group, key, whole_topic))
    if phase not in _READY:
        return None
    if phase is EpochPhase.WHOLE:  # forced: the operator's order
        first = comes_first(conn, names, group, key)
        if first is not None:
            if waits is not None:
                waits(key, *first)
            return None
    move(f"query {key[0]} epoch {key[1]}", phase, EpochEvent.PUBLISHED)
    return found


def comes_first(
    conn: psycopg.Connection[Any], names: LedgerNames, group: str, key: EpochKey
) -> tuple[EpochKey, str] | None:
    """Another epoch with records staged before this one's in a Kafka partition they share,
    and after them in none; and that partition. Publishing `key` first would apply its records
    ahead of earlier ones, and an earlier record of a key would overwrite a later one, as no
    batch of the per-partition mode ever does: it waits (epochs of one query are in order
    already; this is two queries writing to one topic, one after the other). Two epochs whose
    records come before each other's in different partitions were written at once by two
    queries, whose order Kafka does not decide: neither waits. Rows staged before migration
    0005 (no `first_offset`) are in no order."""
    row = conn.execute(
        sql.SQL(
            "WITH firsts AS ("
            " SELECT query, epoch, topic, partition, min(first_offset) AS first FROM {staged}"
            " WHERE group_id = %(group)s AND first_offset IS NOT NULL AND (topic, partition) IN"
            "  (SELECT topic, partition FROM {staged}"
            "   WHERE group_id = %(group)s AND query = %(query)s AND epoch = %(epoch)s)"
            " GROUP BY query, epoch, topic, partition"
            "), mine AS ("
            " SELECT topic, partition, first FROM firsts"
            " WHERE query = %(query)s AND epoch = %(epoch)s"
            ") "
            "SELECT o.query, o.epoch, min(o.topic || '[' || o.partition || ']') "
            "FILTER (WHERE o.first < m.first) "
            "FROM firsts AS o JOIN mine AS m USING (topic, partition) "
            "WHERE (o.query, o.epoch) <> (%(query)s, %(epoch)s) "
            "GROUP BY o.query, o.epoch HAVING bool_and(o.first < m.first) "
            "ORDER BY o.query, o.epoch LIMIT 1"
        ).format(staged=names.staged),
        {"group": group, "query": key[0], "epoch": key[1]},
    ).fetchone()
    return None if row is None else ((row[0], int(row[1])), str(row[2]))


Firsts = dict[tuple[str, int], int]  # (topic, partition): where records begin there


class Ahead(NamedTuple):
    """Records of no epoch in one Kafka partition, from `first` to `last`, that a batch writes
    ahead of `epochs`: epochs staged before them there, whose records lie after them too. Such
    an epoch cannot be whole before they are passed, so they cannot wait for it: they go first,
    as if written before its tasks (an epoch is visible when its driver commits it), and its
    records written before them overwrite theirs of a key at its publication."""

    first: int
    last: int
    epochs: frozenset[EpochKey]
    records: int  # how many records of no epoch, from `first` to `last`


def staged_before(
    conn: psycopg.Connection[Any], names: LedgerNames, group: str, firsts: Firsts
) -> dict[tuple[str, int], set[EpochKey]]:
    """Of `firsts`, where records of no epoch (another producer's) begin in their Kafka
    partitions, those after records staged of an epoch not yet published, and those epochs:
    written now, they would be overwritten by those earlier ones at the epoch's publication.
    They wait for it, unless it has records after them too (`Ahead`)."""
    if not firsts:
        return {}
    rows = conn.execute(
        sql.SQL(
            "SELECT DISTINCT b.topic, b.partition, s.query, s.epoch FROM {staged} AS s "
            "JOIN {firsts} USING (topic, partition) "
            "WHERE s.group_id = %s AND s.first_offset < b.first"
        ).format(staged=names.staged, firsts=_firsts(firsts)),
        (group,),
    ).fetchall()
    found: dict[tuple[str, int], set[EpochKey]] = {}
    for topic, partition, query, epoch in rows:
        found.setdefault((str(topic), int(partition)), set()).add((str(query), int(epoch)))
    return found


def bare_in_batch(
    names: LedgerNames, group: str, firsts: Firsts, ahead: Mapping[tuple[str, int], Ahead]
) -> sql.Composed:
    """For a batch that writes records of no epoch to their tables (`firsts`: where they begin
    in their partitions): a statement that fails the batch's transaction when records of an
    epoch are staged before them (`staged_before`), other than of the epochs it writes them
    `ahead` of; the batch is then written statement by statement, and those partitions wait."""
    passed = [
        sql.SQL("({}, {}::integer, {}, {}::bigint)").format(
            sql.Literal(topic), sql.Literal(partition), sql.Literal(query), sql.Literal(epoch)
        )
        for (topic, partition), of_key in sorted(ahead.items())
        for query, epoch in sorted(of_key.epochs)
    ]
    exempt = (
        sql.SQL(" AND (s.topic, s.partition, s.query, s.epoch) NOT IN (VALUES {})").format(
            sql.SQL(", ").join(passed)
        )
        if passed
        else sql.SQL("")
    )
    return sql.SQL(
        "SELECT CASE WHEN count(*) = 0 THEN 1 ELSE ({refusal} || count(*))::integer END "
        "FROM {staged} AS s JOIN {firsts} USING (topic, partition) "
        "WHERE s.group_id = {group} AND s.first_offset < b.first{exempt}"
    ).format(
        refusal=sql.Literal(
            "records of no epoch cannot be written by their batch: records of an epoch are "
            "staged before them in their partition; staged rows "
        ),
        staged=names.staged,
        firsts=_firsts(firsts),
        group=sql.Literal(group),
        exempt=exempt,
    )


def _firsts(firsts: Firsts) -> sql.Composed:
    """`firsts` as a table `b (topic, partition, first)`."""
    return sql.SQL("(VALUES {}) AS b (topic, partition, first)").format(
        sql.SQL(", ").join(
            sql.SQL("({}, {}::integer, {}::bigint)").format(
                sql.Literal(topic), sql.Literal(partition), sql.Literal(first)
            )
            for (topic, partition), first in sorted(firsts.items())
        )
        if firsts
        else sql.SQL("(NULL::text, NULL::integer, NULL::bigint)")
    )


@dataclass(frozen=True)
class Judged:
    """What a batch judged an epoch whole with, for the ledger's check in its transaction."""

    parts: tuple[int, ...]  # every Spark partition of the epoch the batch knew of
    held_back: tuple[str, ...]  # the topics its parts wrote that the group holds back
    counted: dict[int, dict[str, int]]  # the records the batch holds: part: {topic: records}
    # Where its records begin in each Kafka partition, the batch's (topic, partition): offset.
    firsts: dict[tuple[str, int], int] = field(default_factory=dict)


def publish_in_batch(
    names: LedgerNames, group: str, key: EpochKey, judged: Judged
) -> list[sql.Composed]:
    """For a batch that holds a whole epoch and writes its records to their tables itself
    (`consumers.epochs.assembly`): statements that settle it as published in the batch's
    transaction, or fail it, so that nothing of the batch is written, unless the ledger agrees:
    every part the ledger knows of is one the batch knew (so the topics it holds back are the
    ones the batch counted); the judge (`epoch_lacks`) finds it whole with the batch's records
    counted; none of its records, and none of an earlier epoch of its query, is staged; and no
    earlier epoch of its query is open (epochs publish in order)."""
    query, epoch = key
    where = sql.SQL("group_id = {} AND query = {} AND epoch").format(
        sql.Literal(group), sql.Literal(query)
    )
    this = sql.SQL("{} = {}").format(where, sql.Literal(epoch))
    known = sql.SQL("{}::integer[]").format(sql.Literal(list(judged.parts)))
    lacks = sql.SQL("{}({}, {}, {}, {}::text[], {}::jsonb)").format(
        names.judge,
        sql.Literal(group),
        sql.Literal(query),
        sql.Literal(epoch),
        sql.Literal(list(judged.held_back)),
        sql.Literal(_counted_json(judged.counted)),
    )
    settle = sql.SQL(
        "WITH settled AS (UPDATE {epochs} SET outcome = {published}, settled_at = now(), "
        "forced = false WHERE {this} AND outcome IS NULL "
        "AND NOT EXISTS (SELECT FROM {parts} WHERE {this} AND spark_partition <> ALL({known})) "
        "AND NOT EXISTS (SELECT FROM {lacks}) "
        "AND NOT EXISTS (SELECT FROM {staged} WHERE {where} <= {epoch}) "
        "AND NOT EXISTS (SELECT FROM {epochs} WHERE {where} < {epoch} AND outcome IS NULL) "
        "AND NOT EXISTS (SELECT FROM {staged} AS s JOIN {firsts} USING (topic, partition) "
        "WHERE s.group_id = {group} AND s.first_offset < b.first) "
        "RETURNING 1) "
        # A failing cast is the one way a plain statement refuses its transaction; its text
        # depends on count(*), so that the planner cannot fold it into a constant and fail early.
        "SELECT CASE WHEN count(*) = 1 THEN 1 ELSE ({refusal} || count(*))::integer END "
        "FROM settled"
    ).format(
        epochs=names.epochs,
        parts=names.parts,
        staged=names.staged,
        published=sql.Literal(PUBLISHED),
        this=this,
        where=where,
        epoch=sql.Literal(epoch),
        known=known,
        lacks=lacks,
        refusal=sql.Literal(
            f"epoch {epoch} of query {query} cannot be published by its batch: the ledger "
            "holds an earlier epoch open, records of it staged, records of another epoch "
            "staged before its own in a partition, a part the batch did not count, or finds "
            "it lacking; settled "
        ),
        group=sql.Literal(group),
        # Records staged (by any epoch) before the batch's own in one of its partitions would
        # be applied after them: the batch stages instead, and the publisher keeps the order.
        firsts=_firsts(judged.firsts),
    )
    clear = sql.SQL("DELETE FROM {} WHERE {}").format(names.parts, this)
    return [settle, clear, advance_watermark(names, group, query)]


Manifest = tuple[tuple[int, ...] | None, dict[int, dict[str, int]]]  # parts, written per part


def manifests(
    conn: psycopg.Connection[Any], names: LedgerNames, group: str, keys: list[EpochKey]
) -> dict[EpochKey, Manifest]:
    """What the ledger holds of the manifest of each open epoch of `keys`: the Spark
    partitions its epoch record names (None before it comes), and each part's records per
    topic. A member that (re)joined after the manifest's first records were committed knows
    them only from here."""
    found: dict[EpochKey, Manifest] = {}
    queries, epochs = [q for q, _ in keys], [e for _, e in keys]
    wanted = sql.SQL("(query, epoch) IN (SELECT * FROM unnest(%s::text[], %s::bigint[]))")
    for query, epoch, parts in conn.execute(
        sql.SQL(
            "SELECT query, epoch, parts FROM {} WHERE group_id = %s AND outcome IS NULL AND "
        ).format(names.epochs)
        + wanted,
        (group, queries, epochs),
    ):
        found[query, epoch] = (None if parts is None else tuple(sorted(parts)), {})
    for query, epoch, part, records in conn.execute(
        sql.SQL(
            "SELECT query, epoch, spark_partition, records FROM {} WHERE group_id = %s AND "
        ).format(names.parts)
        + wanted,
        (group, queries, epochs),
    ):
        if (query, epoch) in found:
            found[query, epoch][1][part] = dict(records)
    return found
