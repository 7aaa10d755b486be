"""Offsets live in PostgreSQL, next to the rows: `(group, topic, partition) -> next_offset`,
with an owner lease (`owner`, `owner_epoch`) that fences a member which lost its partition."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from consumers.state import ADVANCE_OFFSETS_FUNCTION, StateTables

log = logging.getLogger("bridge.consumer")

PartitionKey = tuple[str, int]
"""(topic, partition)."""


@dataclass(frozen=True, kw_only=True)
class Lease:
    """This instance's claim on one partition: writes are valid only while `epoch` is current."""

    topic: str
    partition: int
    epoch: int
    next_offset: int

    @property
    def key(self) -> PartitionKey:
        return (self.topic, self.partition)


class OffsetStore:
    def __init__(self, *, tables: StateTables, group_id: str, owner: str) -> None:
        self._group = group_id
        self._owner = owner
        self._table = tables.qualified(tables.offsets)
        self._advance = f'"{tables.schema}".{ADVANCE_OFFSETS_FUNCTION}'

    def stored(self, conn: psycopg.Connection, keys: list[PartitionKey]) -> dict[PartitionKey, int]:
        """The stored next offsets of those partitions that have a row."""
        rows = conn.execute(
            f"SELECT topic, partition, next_offset FROM {self._table} "  # noqa: S608 - our table
            "WHERE group_id = %s AND (topic, partition) IN "
            "(SELECT * FROM unnest(%s::text[], %s::int[]))",
            (self._group, [k[0] for k in keys], [k[1] for k in keys]),
        ).fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}

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
            rows = conn.execute(
                f"INSERT INTO {self._table} AS o "  # noqa: S608 - our table
                "(group_id, topic, partition, next_offset, owner, owner_epoch) "
                "SELECT %s, t, p, n, %s, 1 "
                "FROM unnest(%s::text[], %s::int[], %s::bigint[]) AS x(t, p, n) "
                "ON CONFLICT (group_id, topic, partition) DO UPDATE "
                "SET owner = EXCLUDED.owner, owner_epoch = o.owner_epoch + 1, updated_at = now() "
                "RETURNING topic, partition, owner_epoch, next_offset",
                (
                    self._group,
                    self._owner,
                    [k[0] for k in start_offsets],
                    [k[1] for k in start_offsets],
                    list(start_offsets.values()),
                ),
            ).fetchall()
        return [
            Lease(topic=topic, partition=partition, epoch=epoch, next_offset=offset)
            for topic, partition, epoch, offset in rows
        ]

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

    def owners(
        self, conn: psycopg.Connection, keys: list[PartitionKey]
    ) -> dict[PartitionKey, tuple[int, str | None]]:
        """The current owner epoch and owner of those partitions that have a row."""
        rows = conn.execute(
            f"SELECT topic, partition, owner_epoch, owner FROM {self._table} "  # noqa: S608
            "WHERE group_id = %s AND (topic, partition) IN "
            "(SELECT * FROM unnest(%s::text[], %s::int[]))",
            (self._group, [k[0] for k in keys], [k[1] for k in keys]),
        ).fetchall()
        return {(topic, partition): (epoch, owner) for topic, partition, epoch, owner in rows}

    def advance(
        self, conn: psycopg.Connection, advances: list[tuple[Lease, int]]
    ) -> list[PartitionKey]:
        """The fenced offset updates of a batch, in one statement, first of its transaction: each
        lease's partition moves to its new next offset if the lease still holds (same owner
        epoch, same expected offset). Returns the partitions it did not hold for: roll back and
        let those go; they are no longer ours, or someone moved their offset."""
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
            sql.SQL(self._advance),
            sql.Literal(self._group),
            sql.Literal([lease.topic for lease, _ in advances]),
            sql.Literal([lease.partition for lease, _ in advances]),
            sql.Literal([lease.epoch for lease, _ in advances]),
            sql.Literal([lease.next_offset for lease, _ in advances]),
            sql.Literal([next_offset for _, next_offset in advances]),
            sql.Literal(strict),
        )

    def release(self, conn: psycopg.Connection, leases: list[Lease]) -> None:
        """Mark partitions as unowned after a clean revoke; a newer owner's row is left alone."""
        with conn.transaction():
            for lease in leases:
                conn.execute(
                    f"UPDATE {self._table} SET owner = NULL, updated_at = now() "  # noqa: S608
                    "WHERE group_id = %s AND topic = %s AND partition = %s AND owner_epoch = %s",
                    (self._group, lease.topic, lease.partition, lease.epoch),
                )


def application_name(group_id: str) -> str:
    """How the sessions of a group's members name themselves (PostgreSQL keeps 63 bytes)."""
    return f"bridge-consumer:{group_id}"[:63]
