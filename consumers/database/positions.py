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

from bridge.kafka_admin import KafkaAdmin, LogRange, PartitionKey, TopicError
from consumers.database.offsets import stored_positions

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


def read_positions(
    conn: psycopg.Connection[Any], schema: str, admin: KafkaAdmin, group: str | None
) -> list[Position]:
    rows = stored_positions(conn, schema, group)
    keys = sorted({(row.topic, row.partition) for row in rows})
    ranges = _ranges(admin, keys)
    owners: dict[str, dict[PartitionKey, str]] = {}
    unknown: set[str] = set()  # groups Kafka could not describe: their live members are unknown
    for group_id in sorted({row.group for row in rows}):
        try:
            owners[group_id] = admin.owners(group_id)
        except TopicError:
            owners[group_id] = {}
            unknown.add(group_id)
    # Offsets between a stored position and the last stable offset can be transaction markers
    # (each committed transaction ends with one) rather than records: ask Kafka which are real.
    behind = {
        (row.topic, row.partition): row.next_offset
        for row in rows
        if (log := ranges.get((row.topic, row.partition)))
        and log.log_start <= row.next_offset < log.last_stable
    }
    try:
        unread = admin.committed_records_from(behind)
    except KafkaException:
        unread = set(behind)
    positions = []
    for row in rows:
        key = (row.topic, row.partition)
        log = ranges.get(key)
        lag = max(0, log.last_stable - row.next_offset) if log else None
        if lag and key not in unread:
            lag = 0
        positions.append(
            Position(
                group=row.group,
                topic=row.topic,
                partition=row.partition,
                next_offset=row.next_offset,
                log_start_offset=log.log_start if log else None,
                last_stable_offset=log.last_stable if log else None,
                high_watermark=log.high_watermark if log else None,
                lag=lag,
                owner=row.owner,
                owner_epoch=row.owner_epoch,
                live_owner=_UNKNOWN_MEMBER if row.group in unknown else owners[row.group].get(key),
                updated_at=row.updated_at,
                out_of_range=bool(
                    log and not log.log_start <= row.next_offset <= log.high_watermark
                ),
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


def caught_up_position(admin: KafkaAdmin, topic: str, partitions: int) -> int:
    """The sum of next offsets once every committed record of a transactionally written topic is
    applied: each partition's log ends with the commit marker of its last transaction, one
    offset past its last record."""
    ranges = admin.log_ranges([(topic, p) for p in range(partitions)])
    return sum(r.last_stable - 1 for r in ranges.values() if r.last_stable > 0)
