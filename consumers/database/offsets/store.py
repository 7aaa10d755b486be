"""Every read and write of the offsets table and its audit trail.

`(group, topic, partition) -> next_offset`, with an owner lease (`owner`, `owner_epoch`) that
fences a member which lost its partition, and `updated_at`. Beside it live the audit table of
operator resets and the fenced advance as a plpgsql function, so that a batch sent as a single
message has PostgreSQL itself refuse it when a lease no longer holds. Every write that takes a
partition over, a member's claim or an operator's reset, goes through one statement that bumps
the owner epoch (`_TAKE_OVER`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from bridge.errors import BridgeError
from bridge.names import (
    ADVANCE_OFFSETS_FUNCTION,
    CONSUMER_APPLICATION_PREFIX,
    OFFSET_DELETIONS_TABLE,
    OFFSET_RESETS_TABLE,
    OFFSETS_TABLE,
)

log = logging.getLogger("bridge.consumer")

PartitionKey = tuple[str, int]
"""(topic, partition)."""


class Run(NamedTuple):
    """The last task attempt of a (query, Spark partition) a partition's records came from
    (`consumers.batch.replays`)."""

    query: str
    spark_partition: int
    epoch: int
    attempt: str


Runs = tuple[Run, ...]


def _runs_of(stored: Any) -> Runs:
    """The `runs` column as read (jsonb: a list of [query, partition, epoch, attempt]); a value
    not of that shape (written by hand) reads as none."""
    if not isinstance(stored, list):
        return ()
    try:
        return tuple(Run(str(q), int(p), int(e), str(a)) for q, p, e, a in stored)
    except (TypeError, ValueError):
        return ()


@dataclass(frozen=True, kw_only=True)
class Lease:
    """This member's claim on one partition: writes are valid only while `epoch` is current."""

    topic: str
    partition: int
    epoch: int
    next_offset: int
    # The offset after the group's last dead letter of this partition, read at the claim: a
    # batch that starts below it applies a range again (an offset reset, a restart after one).
    dead_letters_end: int = 0
    # The partition's runs as its row holds them at `next_offset` (`consumers.batch.replays`).
    runs: Runs = ()

    @property
    def key(self) -> PartitionKey:
        return (self.topic, self.partition)


@dataclass(frozen=True, kw_only=True)
class StoredRow:
    """One partition's row as the database holds it: the source of truth for positions."""

    next_offset: int
    owner: str | None
    owner_epoch: int
    runs: Runs = ()


@dataclass(frozen=True, kw_only=True)
class StoredPosition:
    """A row of `offsets show`."""

    group: str
    topic: str
    partition: int
    next_offset: int
    owner: str | None
    owner_epoch: int
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class ResetMove:
    """One partition moved by an operator, for its audit row."""

    topic: str
    partition: int
    new_offset: int


# Takes partitions over: a new row starts at its given offset; an existing one gets the new
# owner (NULL after a reset) and a bumped epoch, which fences whoever held it, and keeps its
# offset unless the caller moves it (a reset does, a claim never). A move clears the runs, so
# that the range it moves back to is applied again, as a reset asks.
_TAKE_OVER = """
INSERT INTO {table} AS o (group_id, topic, partition, next_offset, owner, owner_epoch)
SELECT %(group)s, t, p, n, %(owner)s, 1 FROM unnest(%(topics)s::text[], %(partitions)s::int[],
    %(offsets)s::bigint[]) AS x(t, p, n)
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET owner = EXCLUDED.owner, owner_epoch = o.owner_epoch + 1, updated_at = now(),
    next_offset = CASE WHEN %(move)s THEN EXCLUDED.next_offset ELSE o.next_offset END,
    runs = CASE WHEN %(move)s THEN NULL ELSE o.runs END
RETURNING topic, partition, owner_epoch, next_offset, runs"""

_KEYS = sql.SQL(
    "(topic, partition) IN (SELECT * FROM unnest(%(topics)s::text[], %(partitions)s::int[]))"
)


class OffsetStore:
    """The offsets table of one group, as seen by one member (`owner`) or by an operator."""

    def __init__(self, *, schema: str, group_id: str, owner: str | None = None) -> None:
        self._group = group_id
        self._owner = owner
        self._table = sql.Identifier(schema, OFFSETS_TABLE)
        self._resets = sql.Identifier(schema, OFFSET_RESETS_TABLE)
        self._deletions = sql.Identifier(schema, OFFSET_DELETIONS_TABLE)
        self._advance = sql.Identifier(schema, ADVANCE_OFFSETS_FUNCTION)

    def _keys(self, keys: list[PartitionKey]) -> dict[str, Any]:
        return {
            "group": self._group,
            "topics": [k[0] for k in keys],
            "partitions": [k[1] for k in keys],
        }

    def rows(
        self, conn: psycopg.Connection, keys: list[PartitionKey]
    ) -> dict[PartitionKey, StoredRow]:
        """The rows of those partitions that have one."""
        found = conn.execute(
            sql.SQL(
                "SELECT topic, partition, next_offset, owner, owner_epoch, runs FROM {} "
                "WHERE group_id = %(group)s AND {}"
            ).format(self._table, _KEYS),
            self._keys(keys),
        ).fetchall()
        return {
            (topic, partition): StoredRow(
                next_offset=offset, owner=owner, owner_epoch=epoch, runs=_runs_of(runs)
            )
            for topic, partition, offset, owner, epoch, runs in found
        }

    def stored(self, conn: psycopg.Connection, keys: list[PartitionKey]) -> dict[PartitionKey, int]:
        """The stored next offsets of those partitions that have a row."""
        return {key: row.next_offset for key, row in self.rows(conn, keys).items()}

    def claim(
        self,
        conn: psycopg.Connection,
        start_offsets: dict[PartitionKey, int],
        *,
        lock_wait_ms: int,
    ) -> list[Lease]:
        """Take ownership of the partitions (bumping their owner epoch, which fences the previous
        owner) and return where to start. `start_offsets` is used only for partitions that have
        no row yet; a stored offset always wins. Commits.

        A previous owner paused inside a batch (GC, SIGSTOP, a frozen VM) still holds the row
        locks; PostgreSQL's timeouts do not end a session stalled in the middle of a COPY. After
        `lock_wait_ms` the stalled sessions of this group are terminated (their batch rolls back,
        which is what fencing wants anyway) and the claim is tried once more."""
        try:
            return self._claim_once(conn, start_offsets, lock_wait_ms)
        except psycopg.errors.LockNotAvailable:
            self._end_stalled_sessions(conn, lock_wait_ms)
            return self._claim_once(conn, start_offsets, lock_wait_ms)

    def _claim_once(
        self, conn: psycopg.Connection, start_offsets: dict[PartitionKey, int], lock_wait_ms: int
    ) -> list[Lease]:
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{lock_wait_ms}ms",))
            rows = self._take_over(conn, start_offsets, owner=self._owner, move=False)
        return [
            Lease(
                topic=topic, partition=partition, epoch=epoch, next_offset=offset,
                runs=_runs_of(runs),
            )
            for topic, partition, epoch, offset, runs in rows
        ]  # fmt: skip

    def _take_over(
        self,
        conn: psycopg.Connection,
        offsets: dict[PartitionKey, int],
        *,
        owner: str | None,
        move: bool,
    ) -> list[tuple[Any, ...]]:
        keys = list(offsets)
        return conn.execute(
            sql.SQL(_TAKE_OVER).format(table=self._table),
            {**self._keys(keys), "owner": owner, "offsets": list(offsets.values()), "move": move},
        ).fetchall()

    def _end_stalled_sessions(self, conn: psycopg.Connection, older_than_ms: int) -> None:
        ended = conn.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid() "
            "AND xact_start < now() - make_interval(secs => %s)",
            (application_name(self._group), older_than_ms / 1000),
        ).fetchall()
        log.warning(
            "claim waited on the locks of a stalled member; ended %d of its sessions",
            len(ended),
            extra={"pids": [pid for pid, _ in ended], "group": self._group},
        )

    def advance(
        self, conn: psycopg.Connection, advances: list[tuple[Lease, int]]
    ) -> list[PartitionKey]:
        """The fenced offset updates of a batch, in one statement, first of its transaction: each
        lease's partition moves to its new next offset if the lease still holds (same owner
        epoch, same expected offset). Returns the partitions it did not hold for: roll back and
        look at those again; they are no longer ours, or their offset is not where we thought."""
        rows = conn.execute(self.advance_statement(advances, strict=False)).fetchall()
        fenced = {(topic, partition) for topic, partition in rows}
        return [lease.key for lease, _ in advances if lease.key in fenced]

    def advance_statement(self, advances: list[tuple[Lease, int]], *, strict: bool) -> sql.Composed:
        """The statement of `advance`, values inlined so that it can go in a multi-statement
        message. `strict`: raise (and so abort the transaction) rather than return fenced keys."""
        return sql.SQL(
            "SELECT * FROM {}({}, {}::text[], {}::int[], {}::bigint[], {}::bigint[], "
            "{}::bigint[], {})"
        ).format(
            self._advance,
            sql.Literal(self._group),
            sql.Literal([lease.topic for lease, _ in advances]),
            sql.Literal([lease.partition for lease, _ in advances]),
            sql.Literal([lease.epoch for lease, _ in advances]),
            sql.Literal([lease.next_offset for lease, _ in advances]),
            sql.Literal([next_offset for _, next_offset in advances]),
            sql.Literal(strict),
        )

    def runs_statement(self, runs: list[tuple[Lease, Runs]]) -> sql.Composed:
        """For a batch's transaction, after its advance: the runs of its partitions as its
        records leave them (`consumers.batch.replays`), stored with their offsets; only while
        each lease holds (a fenced batch's transaction fails at its advance anyway)."""
        return sql.SQL(
            "UPDATE {} AS o SET runs = x.r::jsonb FROM unnest({}::text[], {}::int[], "
            "{}::bigint[], {}::text[]) AS x(t, p, e, r) WHERE o.group_id = {} AND o.topic = x.t "
            "AND o.partition = x.p AND o.owner_epoch = x.e"
        ).format(
            self._table,
            sql.Literal([lease.topic for lease, _ in runs]),
            sql.Literal([lease.partition for lease, _ in runs]),
            sql.Literal([lease.epoch for lease, _ in runs]),
            sql.Literal([json.dumps([list(run) for run in of_lease]) for _, of_lease in runs]),
            sql.Literal(self._group),
        )

    def release(self, conn: psycopg.Connection, leases: list[Lease]) -> None:
        """Mark partitions as unowned after a clean revoke; a newer owner's row is left alone."""
        conn.execute(
            sql.SQL(
                "UPDATE {} AS o SET owner = NULL, updated_at = now() "
                "FROM unnest(%(topics)s::text[], %(partitions)s::int[], %(epochs)s::bigint[]) "
                "AS x(t, p, e) WHERE o.group_id = %(group)s AND o.topic = x.t "
                "AND o.partition = x.p AND o.owner_epoch = x.e"
            ).format(self._table),
            {
                **self._keys([lease.key for lease in leases]),
                "epochs": [lease.epoch for lease in leases],
            },
        )

    # -- operators ----------------------------------------------------------------------------

    def reset(
        self,
        conn: psycopg.Connection,
        moves: list[ResetMove],
        *,
        target: str,
        forced: bool,
        requested_by: str,
        lock_wait: str,
    ) -> list[int]:
        """Move partitions to new offsets in one transaction: the owner is cleared and the
        owner epoch bumped (a member still writing is fenced), and each move leaves an audit
        row. Returns the new owner epoch of each move."""
        keys = [(move.topic, move.partition) for move in moves]
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (lock_wait,))
            conn.execute(
                sql.SQL("SELECT 1 FROM {} WHERE group_id = %(group)s AND {} FOR UPDATE").format(
                    self._table, _KEYS
                ),
                self._keys(keys),
            )
            before = self.rows(conn, keys)
            taken = self._take_over(
                conn, {key: move.new_offset for key, move in zip(keys, moves, strict=True)},
                owner=None, move=True,
            )  # fmt: skip
            epochs = {(topic, partition): epoch for topic, partition, epoch, _, _ in taken}
            with conn.cursor() as cursor:
                cursor.executemany(
                    sql.SQL(
                        "INSERT INTO {} (group_id, topic, partition, old_offset, new_offset, "
                        "old_owner, new_owner_epoch, target, forced, requested_by) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    ).format(self._resets),
                    [
                        (
                            self._group,
                            move.topic,
                            move.partition,
                            old.next_offset if (old := before.get(key)) else None,
                            move.new_offset,
                            old.owner if old else None,
                            epochs[key],
                            target,
                            forced,
                            requested_by,
                        )
                        for key, move in zip(keys, moves, strict=True)
                    ],
                )
        return [int(epochs[key]) for key in keys]

    def delete(
        self, conn: psycopg.Connection, *, forced: bool, requested_by: str, lock_wait: str
    ) -> list[tuple[str, int, int, str | None]]:
        """Remove every position of the group in one transaction, each with an audit row:
        (topic, partition, old next offset, old owner) of each. A member still writing the
        group finds its row gone at its next batch and is fenced."""
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (lock_wait,))
            deleted = conn.execute(
                sql.SQL(
                    "DELETE FROM {} WHERE group_id = %s "
                    "RETURNING topic, partition, next_offset, owner"
                ).format(self._table),
                (self._group,),
            ).fetchall()
            with conn.cursor() as cursor:
                cursor.executemany(
                    sql.SQL(
                        "INSERT INTO {} (group_id, topic, partition, old_offset, old_owner, "
                        "forced, requested_by) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    ).format(self._deletions),
                    [(self._group, *row, forced, requested_by) for row in deleted],
                )
        return sorted(deleted)


def stored_positions(
    conn: psycopg.Connection[Any], schema: str, group: str | None
) -> list[StoredPosition]:
    """Every stored position of one group (or of all), in order."""
    table = sql.Identifier(schema, OFFSETS_TABLE)
    try:
        rows = conn.execute(
            sql.SQL(
                "SELECT group_id, topic, partition, next_offset, owner, owner_epoch, updated_at "
                "FROM {} WHERE %(group)s::text IS NULL OR group_id = %(group)s "
                "ORDER BY group_id, topic, partition"
            ).format(table),
            {"group": group},
        ).fetchall()
    except psycopg.errors.UndefinedTable:
        raise BridgeError(
            f'no offsets table "{schema}".{OFFSETS_TABLE}: '
            "no consumer has run with this state schema yet"
        ) from None
    return [
        StoredPosition(
            group=g, topic=t, partition=p, next_offset=n, owner=o, owner_epoch=e, updated_at=u
        )
        for g, t, p, n, o, e, u in rows
    ]


def applied_position(
    source: str | psycopg.Connection[Any], group: str, schema: str, topic: str
) -> int:
    """The sum of a group's stored next offsets in `topic` (0 before its consumer created the
    tables). One topic's: a group of whole routes also stores its place in the epoch manifest.

    `source`: a DSN, for one question; or an open autocommit connection, for a poller that asks
    many times: a connection per question costs PostgreSQL a new backend process each time,
    which, every 50 ms beside a busy consumer, took CPU from the database being measured."""
    if isinstance(source, str):
        with psycopg.connect(source, autocommit=True) as conn:
            return applied_position(conn, group, schema, topic)
    try:
        row = source.execute(
            sql.SQL(
                "SELECT coalesce(sum(next_offset), 0) FROM {} WHERE group_id = %s AND topic = %s"
            ).format(sql.Identifier(schema, OFFSETS_TABLE)),
            (group, topic),
        ).fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    return int(row[0]) if row else 0


def application_name(group_id: str) -> str:
    """How the sessions of a group's members name themselves (PostgreSQL keeps 63 bytes)."""
    return f"{CONSUMER_APPLICATION_PREFIX}{group_id}"[:63]
