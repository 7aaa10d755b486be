"""Where every partition of a consumer group stands: the stored offset against Kafka's log.

What `bridge offsets show` prints. The stored `next_offset` is the truth; Kafka supplies the log's
range and which live member holds the partition now.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from bridge.errors import BridgeError
from bridge.kafka_admin import KafkaAdmin, LogRange, PartitionKey, TopicError
from consumers.state import StateTables

_UNKNOWN_MEMBER = "unknown (the group could not be described)"


@dataclass(frozen=True, kw_only=True)
class Position:
    group: str
    topic: str
    partition: int
    next_offset: int
    log_start_offset: int | None  # None: Kafka could not tell (topic deleted, broker down)
    last_stable_offset: int | None
    high_watermark: int | None
    # Offsets up to the last stable one (records, and markers between them); 0 when only
    # transaction markers or aborted records remain.
    lag: int | None
    owner: str | None  # as the database records it: the member that claimed the partition last
    owner_epoch: int
    live_owner: str | None  # the member of the Kafka group that holds the partition now
    updated_at: datetime
    out_of_range: bool  # the stored offset is outside the log: an operator must reset it

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["updated_at"] = self.updated_at.isoformat()
        return document


def stored_positions(
    conn: psycopg.Connection[Any], tables: StateTables, group: str | None
) -> list[tuple[Any, ...]]:
    """(group, topic, partition, next_offset, owner, owner_epoch, updated_at) rows, in order."""
    table = tables.qualified(tables.offsets)
    try:
        return conn.execute(
            "SELECT group_id, topic, partition, next_offset, owner, owner_epoch, updated_at "  # noqa: S608 - our table
            f"FROM {table} WHERE %(group)s::text IS NULL OR group_id = %(group)s "
            "ORDER BY group_id, topic, partition",
            {"group": group},
        ).fetchall()
    except psycopg.errors.UndefinedTable:
        raise BridgeError(
            f"no offsets table {table}: no consumer has run with this state schema yet"
        ) from None


def read_positions(
    conn: psycopg.Connection[Any], tables: StateTables, admin: KafkaAdmin, group: str | None
) -> list[Position]:
    rows = stored_positions(conn, tables, group)
    keys = sorted({(topic, partition) for _, topic, partition, *_ in rows})
    ranges = _ranges(admin, keys)
    owners: dict[str, dict[PartitionKey, str]] = {}
    unknown: set[str] = set()  # groups Kafka could not describe: their live members are unknown
    for group_id in sorted({row[0] for row in rows}):
        try:
            owners[group_id] = admin.owners(group_id)
        except TopicError:
            owners[group_id] = {}
            unknown.add(group_id)
    # Offsets between a stored position and the last stable offset can be transaction markers
    # (each committed transaction ends with one) rather than records: ask Kafka which are real.
    behind = {
        (topic, partition): next_offset
        for _, topic, partition, next_offset, *_ in rows
        if (log := ranges.get((topic, partition)))
        and log.log_start <= next_offset < log.last_stable
    }
    try:
        unread = admin.committed_records_from(behind)
    except KafkaException:
        unread = set(behind)
    positions = []
    for group_id, topic, partition, next_offset, owner, epoch, updated_at in rows:
        log = ranges.get((topic, partition))
        lag = max(0, log.last_stable - next_offset) if log else None
        if lag and (topic, partition) not in unread:
            lag = 0
        positions.append(
            Position(
                group=group_id,
                topic=topic,
                partition=partition,
                next_offset=next_offset,
                log_start_offset=log.log_start if log else None,
                last_stable_offset=log.last_stable if log else None,
                high_watermark=log.high_watermark if log else None,
                lag=lag,
                owner=owner,
                owner_epoch=epoch,
                live_owner=_UNKNOWN_MEMBER
                if group_id in unknown
                else owners[group_id].get((topic, partition)),
                updated_at=updated_at,
                out_of_range=bool(log and not log.log_start <= next_offset <= log.high_watermark),
            )
        )
    return positions


def _ranges(admin: KafkaAdmin, keys: list[PartitionKey]) -> dict[PartitionKey, LogRange]:
    """Every partition Kafka still knows; one that it does not (a deleted topic) is left out
    rather than failing the whole listing."""
    try:
        return admin.log_ranges(keys)
    except TopicError:
        found: dict[PartitionKey, LogRange] = {}
        for key in keys:
            try:
                found.update(admin.log_ranges([key]))
            except TopicError:
                continue
        return found


def applied_position(dsn: str, group: str, schema: str) -> int:
    """The sum of a group's stored next offsets (0 before its consumer created the tables)."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                f'SELECT coalesce(sum(next_offset), 0) FROM "{schema}".offsets '  # noqa: S608
                "WHERE group_id = %s",
                (group,),
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    return int(row[0]) if row else 0


def caught_up_position(admin: KafkaAdmin, topic: str, partitions: int) -> int:
    """The sum of next offsets once every committed record of a transactionally written topic is
    applied: each partition's log ends with the commit marker of its last transaction, one
    offset past its last record."""
    ranges = admin.log_ranges([(topic, p) for p in range(partitions)])
    return sum(r.last_stable - 1 for r in ranges.values() if r.last_stable > 0)
