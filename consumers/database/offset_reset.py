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
from consumers.database.offsets import OffsetStore, ResetMove

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
    schema: str,
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
    stored = OffsetStore(schema=schema, group_id=group).rows(conn, keys)
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
        row = stored.get(key)
        steps.append(
            ResetStep(
                topic=topic,
                partition=key[1],
                old_offset=row.next_offset if row else None,
                new_offset=new,
                owner=row.owner if row else None,
                live_owner=live.get(key),
            )
        )
    return steps


def execute_reset(
    conn: psycopg.Connection[Any],
    schema: str,
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
    return OffsetStore(schema=schema, group_id=group).reset(
        conn,
        [ResetMove(topic=s.topic, partition=s.partition, new_offset=s.new_offset) for s in steps],
        target=target.text,
        forced=force,
        requested_by=f"{getpass.getuser()}@{socket.gethostname()}",
        lock_wait=_LOCK_WAIT,
    )
