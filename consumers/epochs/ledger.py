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

This module is the tables' one home and the one judge of an epoch's state (`EpochState.missing`),
for the consumer and the command line alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from consumers.database.dead_letters import write_dead_letters
from consumers.database.ledger_tables import LedgerNames
from consumers.epochs.chunks import unpack_records

PUBLISHED = "published"
# Records staged twice (an offsets reset read them again): publishing would write them twice.
OVERSTAGED = "more records staged than written"
DISCARDED = "discarded"


EpochKey = tuple[str, int]  # (query, epoch)


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

    def missing(self, whole_topic: Callable[[str], bool]) -> list[str]:
        """What the epoch lacks to be whole for a group whose `whole_topic` records wait for
        it; empty when it is whole. Topics the group does not hold back are not waited for."""
        if self.parts is None:
            return ["no epoch record in the manifest: the driver has not committed the epoch"]
        lacking = []
        # The parts the epoch record names, and any other part of the epoch in the manifest:
        # a replay whose tasks are fewer (Spark's parallelism changed with its executors) names
        # only its own, yet the first attempt's committed parts, records and all, are the
        # epoch's too. Every part precedes its epoch's record in the manifest's one partition,
        # so once the record is here, so are they.
        for part in sorted(set(self.parts) | set(self.written)):
            written = self.written.get(part)
            if written is None:
                lacking.append(f"Spark partition {part}: its part is not in the manifest")
                continue
            for topic, records in sorted(written.items()):
                if not whole_topic(topic):
                    continue
                staged = self.staged.get((part, topic), 0)
                if staged < records:
                    lacking.append(
                        f"Spark partition {part}, topic {topic}: {staged} of {records} "
                        "records staged"
                    )
                elif staged > records:
                    lacking.append(f"{OVERSTAGED}: Spark partition {part}, topic {topic}: "
                                   f"{staged} staged, its part wrote {records}")  # fmt: skip
        strays = sorted({part for part, _ in self.staged if part not in self.written})
        if strays:
            lacking.append(
                "records staged from Spark partitions with no part in the manifest: "
                + ", ".join(map(str, strays))
            )
        return lacking

    def describe(self, whole_topic: Callable[[str], bool]) -> str:
        what = "; ".join(self.missing(whole_topic)) or "whole"
        return f"query {self.query} epoch {self.epoch} ({self.staged_records} staged): {what}"


def open_epochs(conn: psycopg.Connection[Any], names: LedgerNames, group: str) -> list[EpochState]:
    """Every epoch of `group` not settled, or holding staged records, in (query, epoch) order."""
    states: dict[EpochKey, EpochState] = {}

    def state(query: str, epoch: int) -> EpochState:
        return states.setdefault((query, epoch), EpochState(group, query, epoch))

    for query, epoch, parts, seen_at, forced, outcome in conn.execute(
        sql.SQL(
            "SELECT query, epoch, parts, seen_at, forced, outcome FROM {} WHERE group_id = %s "
            "AND (outcome IS NULL OR (query, epoch) IN "
            "(SELECT query, epoch FROM {} WHERE group_id = %s))"
        ).format(names.epochs, names.staged),
        (group, group),
    ):
        found = state(query, epoch)
        found.parts = None if parts is None else tuple(sorted(parts))
        found.seen_at, found.forced, found.outcome = seen_at, forced, outcome
    for query, epoch, part, records in conn.execute(
        sql.SQL(
            "SELECT p.query, p.epoch, p.spark_partition, p.records FROM {} AS p JOIN {} AS e "
            "USING (group_id, query, epoch) WHERE p.group_id = %s AND e.outcome IS NULL"
        ).format(names.parts, names.epochs),
        (group,),
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


def publishable(
    states: Iterable[EpochState], whole_topic: Callable[[str], bool]
) -> list[EpochState]:
    """Of each query's open epochs, the first, when it is whole or forced: epochs of a query
    publish in epoch order, so a later one waits for the one before."""
    first: dict[str, EpochState] = {}
    for found in states:
        if found.outcome is None or found.staged:
            first.setdefault(found.query, found)
    return [s for s in first.values() if s.forced or not s.missing(whole_topic)]


def age_s(found: EpochState, now: datetime) -> float:
    return 0.0 if found.seen_at is None else max(0.0, (now - found.seen_at).total_seconds())


def database_now(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock: the ledger's times are its own."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None  # noqa: S101 - SELECT returns its row
    return row[0]  # type: ignore[no-any-return]


def discard(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    dead_letters: sql.Identifier,
    *,
    group: str,
    key: EpochKey,
    missing: str,
    requested_by: str,
) -> int:
    """In the caller's transaction: the epoch's staged records go to the dead letters (nothing
    is lost: they can be replayed from there), the epoch is settled as discarded, and the audit
    row names who asked and what the epoch lacked. Returns how many records it held."""
    query, epoch = key
    _lock(conn, names, group, key)
    error = f"epoch {epoch} of query {query} discarded by {requested_by}: {missing}"
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
    _audit(conn, names, group, key, "discard", missing, moved, requested_by)
    return moved


def force(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    *,
    group: str,
    key: EpochKey,
    missing: str,
    staged: int,
    requested_by: str,
) -> None:
    """In the caller's transaction: the epoch is marked to be published as it is, by the next
    member that looks (whole or not), with the audit row."""
    _lock(conn, names, group, key)
    conn.execute(
        sql.SQL(
            "UPDATE {} SET forced = true WHERE group_id = %s AND query = %s AND epoch = %s"
        ).format(names.epochs),
        (group, *key),
    )
    _audit(conn, names, group, key, "publish", missing, staged, requested_by)


def _lock(conn: psycopg.Connection[Any], names: LedgerNames, group: str, key: EpochKey) -> None:
    """The epoch's row, made if only staged records knew it, and locked: a member publishing
    it is waited for."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (group_id, query, epoch) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
        ).format(names.epochs),
        (group, *key),
    )
    conn.execute(
        sql.SQL(
            "SELECT 1 FROM {} WHERE group_id = %s AND query = %s AND epoch = %s FOR UPDATE"
        ).format(names.epochs),
        (group, *key),
    )


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


def lock_open(conn: psycopg.Connection[Any], names: LedgerNames, group: str, key: EpochKey) -> bool:
    """In the publishing transaction: the epoch's row locked, unless another member holds it
    (it is publishing it, or an operator is acting on it): then False, and it is left alone."""
    row = conn.execute(
        sql.SQL(
            "SELECT 1 FROM {} WHERE group_id = %s AND query = %s AND epoch = %s "
            "FOR UPDATE SKIP LOCKED"
        ).format(names.epochs),
        (group, *key),
    ).fetchone()
    return row is not None


def publish_in_batch(
    names: LedgerNames, group: str, key: EpochKey, parts: tuple[int, ...]
) -> list[sql.Composed]:
    """For a batch that holds a whole epoch and writes its records to their tables itself
    (`consumers.epochs.assembly`): statements that settle it as published in the batch's
    transaction, or fail it, so that nothing of the batch is written, unless the ledger agrees
    the epoch is whole without any record staged: its epoch record is in, every part the ledger
    knows of is one of `parts` (those the batch was judged whole with), none of its records
    and no earlier epoch of its query is open or holds staged records (epochs publish in
    order)."""
    query, epoch = key
    where = sql.SQL("group_id = {} AND query = {} AND epoch").format(
        sql.Literal(group), sql.Literal(query)
    )
    this = sql.SQL("{} = {}").format(where, sql.Literal(epoch))
    known = sql.SQL("{}::integer[]").format(sql.Literal(list(parts)))
    settle = sql.SQL(
        "WITH settled AS (UPDATE {epochs} SET outcome = {published}, settled_at = now(), "
        "forced = false WHERE {this} AND outcome IS NULL AND parts IS NOT NULL "
        "AND parts <@ {known} "
        "AND NOT EXISTS (SELECT FROM {parts} WHERE {this} AND spark_partition <> ALL({known})) "
        "AND NOT EXISTS (SELECT FROM {staged} WHERE {where} <= {epoch}) "
        "AND NOT EXISTS (SELECT FROM {epochs} WHERE {where} < {epoch} AND outcome IS NULL) "
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
        refusal=sql.Literal(
            f"epoch {epoch} of query {query} cannot be published by its batch: the ledger "
            "holds an earlier epoch open, records of it staged, or a part the batch did not "
            "count; settled "
        ),
    )
    clear = sql.SQL("DELETE FROM {} WHERE {}").format(names.parts, this)
    return [settle, clear]


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
