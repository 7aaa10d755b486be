"""Dead letters applied again, exactly once: `bridge dead-letters show|replay`.

After a fix (a column widened, a constraint dropped, a schema registered), a dead letter goes
through its route again as the consumer would write it: routed by its topic, its followed table
made or changed first, decoded, written in the route's mode. Each one is replayed in a
transaction of its own that also settles it:

- it lands (or its mode leaves it out by design, `skipped`): its dead letter is deleted;
- it does not fit still: its dead letter stays, with the new error and one more attempt;
- in both cases an audit row (`dead_letter_replays`) says who replayed what, and how it went.

The dead letter's row is locked (FOR UPDATE) for the transaction, so a replay killed at any
instant leaves each record either applied and gone from the dead letters, or not applied and
still there; two replays at once take each record once. A replayed record is applied as it
is now: on a keyed route it replaces the row of its key even where a newer record of that key
came after it (as a Kafka Connect DLQ replay does), so replay before newer records of the same
keys matter, or filter.

What a replayed record lacks against the original: headers that were not UTF-8 come back as
the visible escapes the dead letters keep, and the Kafka timestamp of a dead letter written
before state version 0003 is gone (a timestamp metadata column is NULL for it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, Message
from psycopg import sql
from psycopg.rows import dict_row

from bridge.settings import ConsumerSettings
from consumers.batch.planner import Planner
from consumers.database.state import StateTables
from consumers.decoding.records import RecordStopped
from consumers.metrics import ConsumerMetrics
from consumers.tables.applier import Applier, run_steps
from consumers.tables.routing import Router

log = logging.getLogger("bridge.dead_letters")

_LOCK_WAIT = "30s"  # a dead letter another replay holds; a member's batch never locks one
_LANDED, _SKIPPED, _DEAD_AGAIN, _GONE = "landed", "skipped", "dead again", "gone"


@dataclass(frozen=True, kw_only=True)
class Chosen:
    """Which dead letters of a group: each filter narrows, None leaves it open."""

    group: str
    topic: str | None = None
    partition: int | None = None
    error: str | None = None  # a part of the error, any case
    since: datetime | None = None  # failed at or after
    until: datetime | None = None  # failed before
    limit: int | None = None

    def where(self) -> sql.Composed:
        clauses = [sql.SQL("group_id = {}").format(sql.Literal(self.group))]
        if self.topic is not None:
            clauses.append(sql.SQL("topic = {}").format(sql.Literal(self.topic)))
        if self.partition is not None:
            clauses.append(sql.SQL("partition = {}").format(sql.Literal(self.partition)))
        if self.error is not None:
            pattern = "%" + self.error.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            clauses.append(sql.SQL("error ILIKE {}").format(sql.Literal(pattern + "%")))
        if self.since is not None:
            clauses.append(sql.SQL("failed_at >= {}").format(sql.Literal(self.since)))
        if self.until is not None:
            clauses.append(sql.SQL("failed_at < {}").format(sql.Literal(self.until)))
        return sql.SQL(" AND ").join(clauses)


@dataclass(frozen=True)
class DeadLetter:
    id: int
    topic: str
    partition: int
    offset: int
    error: str
    failed_at: datetime
    attempts: int
    value_bytes: int | None


def dead_letters(
    conn: psycopg.Connection[Any], tables: StateTables, chosen: Chosen
) -> list[DeadLetter]:
    """The chosen dead letters, in each partition's offset order (the order they are replayed)."""
    limit = sql.SQL("") if chosen.limit is None else sql.SQL(" LIMIT {}").format(chosen.limit)
    rows = conn.execute(
        sql.SQL(
            'SELECT id, topic, partition, "offset", error, failed_at, attempts, length(value) '
            'FROM {} WHERE {} ORDER BY topic, partition, "offset"'
        ).format(tables.qualified(tables.dead_letters), chosen.where())
        + limit
    ).fetchall()
    return [DeadLetter(*row) for row in rows]


@dataclass
class Replayed:
    landed: int = 0
    skipped: int = 0
    dead_again: int = 0
    gone: int = 0  # replayed or deleted meanwhile by another


class Replayer:
    """Replays dead letters through the routes of `config`, on `conn` (autocommit: each
    dead letter in a transaction of its own)."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        config: ConsumerSettings,
        router: Router,
        tables: StateTables,
        requested_by: str,
    ) -> None:
        self._conn = conn
        self._tables = tables
        self._table = tables.qualified(tables.dead_letters)
        self._group = config.group_id
        self._requested_by = requested_by
        self._applier = Applier(tables=tables, group_id=self._group)
        self._planner = Planner(
            applier=self._applier, router=router, routed={}, metrics=ConsumerMetrics(self._group)
        )

    def replay(self, letters: list[DeadLetter], done: Replayed) -> None:
        """Replay `letters` in order, counting into `done` as each commits (so that a caller
        whose replay is cut short by an error can say how far it came)."""
        for letter in letters:
            outcome = self._replay(letter.id)
            if outcome == _LANDED:
                done.landed += 1
            elif outcome == _SKIPPED:
                done.skipped += 1
            elif outcome == _DEAD_AGAIN:
                done.dead_again += 1
            else:
                done.gone += 1

    def _replay(self, letter_id: int) -> str:
        conn = self._conn
        changes = []
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(_LOCK_WAIT)))
                found = (
                    conn.cursor(row_factory=dict_row)
                    .execute(
                        sql.SQL(
                            'SELECT topic, partition, "offset", key, value, headers, attempts, '
                            "kafka_timestamp_ms FROM {} WHERE id = %s AND group_id = %s FOR UPDATE"
                        ).format(self._table),
                        (letter_id, self._group),
                    )
                    .fetchone()
                )
                if found is None:
                    return _GONE
                record = _record(found)
                planned = self._planner.plan(
                    {(found["topic"], found["partition"]): [record]}, conn, in_flight=[],
                    publishing=True, staged=set(),
                )  # fmt: skip
                run_steps(conn, planned.changes)
                changes = planned.changes
                counts = self._applier.apply(conn, planned.targets[found["topic"]], [record], set())
                if counts.dead_letters:  # written again: the new error, one more attempt
                    outcome, error, attempt = (
                        _DEAD_AGAIN,
                        counts.dead_letters[0].error,
                        found["attempts"] + 1,
                    )
                else:
                    conn.execute(
                        sql.SQL("DELETE FROM {} WHERE id = %s").format(self._table), (letter_id,)
                    )
                    landed = counts.applied + counts.deleted
                    outcome, error, attempt = (
                        (_LANDED if landed else _SKIPPED),
                        None,
                        found["attempts"],
                    )
                self._audit(found, outcome, error, attempt)
        except RecordStopped as stopped:  # on_record_error: stop, and it still does not fit
            return self._stopped_again(letter_id, stopped.error)
        self._planner.made(changes)
        return outcome

    def _stopped_again(self, letter_id: int, error: str) -> str:
        """The route stops at a bad record: nothing of the replay was written; the dead letter
        gets the new error and one more attempt."""
        with self._conn.transaction():
            row = (
                self._conn.cursor(row_factory=dict_row)
                .execute(
                    sql.SQL(
                        "UPDATE {} SET error = %s, attempts = attempts + 1, failed_at = now() "
                        'WHERE id = %s RETURNING topic, partition, "offset", attempts'
                    ).format(self._table),
                    (error, letter_id),
                )
                .fetchone()
            )
            if row is None:
                return _GONE
            self._audit(row, _DEAD_AGAIN, error, row["attempts"])
        return _DEAD_AGAIN

    def _audit(self, letter: dict[str, Any], outcome: str, error: str | None, attempt: int) -> None:
        self._conn.execute(
            sql.SQL(
                'INSERT INTO {} (group_id, topic, partition, "offset", outcome, error, attempt, '
                "requested_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(self._tables.qualified(self._tables.dead_letter_replays)),
            (self._group, letter["topic"], letter["partition"], letter["offset"], outcome, error,
             attempt, self._requested_by),
        )  # fmt: skip
        log.info(
            "dead letter replayed",
            extra={"topic": letter["topic"], "partition": letter["partition"],
                   "offset": letter["offset"], "outcome": outcome, "error": error},
        )  # fmt: skip


def _record(row: dict[str, Any]) -> Message:
    """The dead letter as the record Kafka gave: key, value, headers, timestamp."""
    headers: list[tuple[str, str | bytes | None]] = [
        (str(name), None if value is None else str(value).encode())
        for name, value in (row["headers"] or [])
    ]
    stamp = row["kafka_timestamp_ms"]
    timestamp = (TIMESTAMP_NOT_AVAILABLE, 0) if stamp is None else (TIMESTAMP_CREATE_TIME, stamp)
    return Message(
        row["topic"], row["partition"], row["offset"], _bytes(row["key"]), _bytes(row["value"]),
        headers or None, None, timestamp,
    )  # fmt: skip


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)
