"""`bridge offsets reset`: move a group's stored positions, safely and on the record.

A reset is planned first (old -> new per partition, shown as a dry run) and applied only on
request. Applying refuses partitions a live member holds unless forced; it clears the owner and
bumps the owner epoch, so a member still writing is fenced at its next batch and, still holding
the partition in Kafka, claims it again at the new offset. Every move leaves an audit row.
"""

from __future__ import annotations

import getpass
import re
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg

from bridge.errors import BridgeError
from bridge.kafka_admin import KafkaAdmin
from consumers.state import StateTables

_LOCK_WAIT = "30s"  # a member's batch holds the row lock for one transaction, well under this


class ResetRefused(BridgeError):
    """The reset was not applied; the message says why and what to do."""


@dataclass(frozen=True)
class ResetTarget:
    kind: Literal["earliest", "latest", "offset", "time"]
    text: str
    offset: int = 0
    timestamp_ms: int = 0


def parse_reset_target(text: str) -> ResetTarget:
    """`earliest`, `latest`, an offset, or an ISO 8601 date-time (UTC unless it says otherwise)."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return ResetTarget("earliest" if value.lower() == "earliest" else "latest", value)
    if re.fullmatch(r"\d+", value):
        return ResetTarget("offset", value, offset=int(value))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BridgeError(
            f"--to {text!r}: expected earliest, latest, an offset (0 or more) "
            "or an ISO 8601 date-time such as 2026-11-22T08:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return ResetTarget("time", moment.isoformat(), timestamp_ms=int(moment.timestamp() * 1000))


@dataclass(frozen=True, kw_only=True)
class ResetStep:
    topic: str
    partition: int
    old_offset: int | None  # None: no stored offset yet
    new_offset: int
    owner: str | None
    live_owner: str | None


def plan_reset(
    conn: psycopg.Connection[Any],
    tables: StateTables,
    admin: KafkaAdmin,
    *,
    group: str,
    topic: str,
    partition: int | None,
    target: ResetTarget,
) -> list[ResetStep]:
    partitions = admin.partitions(topic)
    if partition is not None:
        if partition not in partitions:
            raise BridgeError(
                f"--partition {partition}: topic {topic!r} has partitions 0..{max(partitions)}"
            )
        partitions = [partition]
    keys = [(topic, p) for p in partitions]
    ranges = admin.log_ranges(keys)
    stored = {
        (t, p): (offset, owner)
        for t, p, offset, owner in conn.execute(
            f"SELECT topic, partition, next_offset, owner FROM {tables.qualified(tables.offsets)} "  # noqa: S608
            "WHERE group_id = %s AND topic = %s",
            (group, topic),
        ).fetchall()
    }
    at_time = admin.offsets_at(keys, target.timestamp_ms) if target.kind == "time" else {}
    live = admin.owners(group)
    steps = []
    for key in keys:
        log = ranges[key]
        if target.kind == "earliest":
            new = log.log_start
        elif target.kind == "latest":
            new = log.last_stable  # where read_committed reaches: nothing committed is skipped
        elif target.kind == "time":
            found = at_time.get(key)
            new = log.last_stable if found is None else found
        else:
            new = target.offset
            if not log.log_start <= new <= log.high_watermark:
                raise BridgeError(
                    f"--to {new}: {topic}[{key[1]}] holds offsets "
                    f"{log.log_start}..{log.high_watermark}"
                )
        old, owner = stored.get(key, (None, None))
        steps.append(
            ResetStep(
                topic=topic,
                partition=key[1],
                old_offset=old,
                new_offset=new,
                owner=owner,
                live_owner=live.get(key),
            )
        )
    return steps


def execute_reset(
    conn: psycopg.Connection[Any],
    tables: StateTables,
    *,
    group: str,
    steps: list[ResetStep],
    target: ResetTarget,
    force: bool,
) -> list[int]:
    """Apply the plan in one transaction; returns the new owner epoch of each step."""
    held = [s for s in steps if s.live_owner]
    if held and not force:
        names = ", ".join(f"{s.topic}[{s.partition}] by {s.live_owner}" for s in held)
        raise ResetRefused(
            f"group {group!r} has live members holding {names}. Stop them first, or pass --force: "
            "each member holding a partition is then fenced and carries on from the new offset"
        )
    offsets = tables.qualified(tables.offsets)
    audit = tables.qualified(tables.offset_resets)
    requested_by = f"{getpass.getuser()}@{socket.gethostname()}"
    epochs = []
    with conn.transaction():
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (_LOCK_WAIT,))
        for step in steps:
            before = conn.execute(
                f"SELECT next_offset, owner FROM {offsets} "  # noqa: S608 - our table
                "WHERE group_id = %s AND topic = %s AND partition = %s FOR UPDATE",
                (group, step.topic, step.partition),
            ).fetchone()
            row = conn.execute(
                f"INSERT INTO {offsets} AS o "  # noqa: S608 - our table
                "(group_id, topic, partition, next_offset, owner, owner_epoch) "
                "VALUES (%s, %s, %s, %s, NULL, 1) "
                "ON CONFLICT (group_id, topic, partition) DO UPDATE "
                "SET next_offset = EXCLUDED.next_offset, owner = NULL, "
                "owner_epoch = o.owner_epoch + 1, updated_at = now() "
                "RETURNING owner_epoch",
                (group, step.topic, step.partition, step.new_offset),
            ).fetchone()
            assert row is not None  # noqa: S101 - INSERT ... RETURNING returns the row
            conn.execute(
                f"INSERT INTO {audit} (group_id, topic, partition, old_offset, new_offset, "  # noqa: S608
                "old_owner, new_owner_epoch, target, forced, requested_by) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    group,
                    step.topic,
                    step.partition,
                    before[0] if before else None,
                    step.new_offset,
                    before[1] if before else None,
                    row[0],
                    target.text,
                    force,
                    requested_by,
                ),
            )
            epochs.append(int(row[0]))
    return epochs
