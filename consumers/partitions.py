"""Where each partition Kafka gave this member stands, and the only moves it may make.

| state          | meaning                                      | leaves by                       |
|----------------|----------------------------------------------|---------------------------------|
| `consuming`    | the lease holds; its records are applied     | a batch's outcome unknown; a    |
|                |                                              | fence seen                      |
| `unresolved`   | the connection dropped during its batch, or  | the offsets table read (after   |
|                | its advance was refused: committed or not?   | reconnecting): its truth wins   |
| `fenced`       | another owner epoch is in the offsets table  | the row's owner cleared         |
|                |                                              | (released, or reset): a claim   |
| `out_of_range` | the stored offset is outside the log         | an operator's reset: a claim    |

A partition enters the table when it is claimed and leaves it when Kafka revokes or loses it;
no state needs a rebalance to be left. Every move is an event (`PartitionEvent`) looked up in
`TRANSITIONS`, (state, event) -> next state; a pair it does not list raises. `fenced` and
`out_of_range` partitions are paused in Kafka; records of any partition not `consuming` are not
applied. Whether a batch of a partition's records is in flight is not a state here: the batch's
owner (`consumers.batch.lifecycle`) holds the batch in flight, and a partition stays `consuming`
until its outcome. The table does no I/O: the owner and the leases move it, and read from it
what to pause, where to seek and what to report.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from bridge.errors import BridgeError
from consumers.database.offsets import Lease, PartitionKey, Runs, StoredRow


class PartitionState(StrEnum):
    CONSUMING = "consuming"
    UNRESOLVED = "unresolved"
    FENCED = "fenced"
    OUT_OF_RANGE = "out_of_range"


class PartitionEvent(StrEnum):
    CLAIMED = "claimed"  # claimed at a stored offset the log holds
    CLAIMED_OUT_OF_RANGE = "claimed_out_of_range"  # claimed at one it does not
    COMMITTED = "committed"  # a batch of its records committed: the lease moves on
    LOST = "lost"  # no answer, or the fenced advance refused: the outcome is unknown
    RESOLVED_OURS = "resolved_ours"  # the offsets table still names this member's epoch
    RESOLVED_TAKEN = "resolved_taken"  # it names another, or no row
    TAKEN = "taken"  # reconcile found another owner epoch
    FELL_OUT_OF_RANGE = "fell_out_of_range"  # Kafka refused to fetch from the stored offset
    REVOKED = "revoked"  # Kafka revoked or lost it: it leaves the table


S, E = PartitionState, PartitionEvent
# (state, event) -> the state it moves to; None: it leaves the table. A pair not listed is an
# illegal move. A claim happens only with no batch in flight.
TRANSITIONS: dict[tuple[PartitionState, PartitionEvent], PartitionState | None] = {
    (S.CONSUMING, E.CLAIMED): S.CONSUMING,
    (S.CONSUMING, E.CLAIMED_OUT_OF_RANGE): S.OUT_OF_RANGE,
    (S.CONSUMING, E.COMMITTED): S.CONSUMING,
    (S.CONSUMING, E.LOST): S.UNRESOLVED,
    (S.CONSUMING, E.TAKEN): S.FENCED,
    (S.CONSUMING, E.FELL_OUT_OF_RANGE): S.OUT_OF_RANGE,
    (S.CONSUMING, E.REVOKED): None,
    (S.UNRESOLVED, E.CLAIMED): S.CONSUMING,
    (S.UNRESOLVED, E.CLAIMED_OUT_OF_RANGE): S.OUT_OF_RANGE,
    (S.UNRESOLVED, E.RESOLVED_OURS): S.CONSUMING,
    (S.UNRESOLVED, E.RESOLVED_TAKEN): S.FENCED,
    (S.UNRESOLVED, E.TAKEN): S.FENCED,
    (S.UNRESOLVED, E.REVOKED): None,
    (S.FENCED, E.CLAIMED): S.CONSUMING,
    (S.FENCED, E.CLAIMED_OUT_OF_RANGE): S.OUT_OF_RANGE,
    (S.FENCED, E.REVOKED): None,
    (S.OUT_OF_RANGE, E.CLAIMED): S.CONSUMING,
    (S.OUT_OF_RANGE, E.CLAIMED_OUT_OF_RANGE): S.OUT_OF_RANGE,
    (S.OUT_OF_RANGE, E.TAKEN): S.FENCED,
    (S.OUT_OF_RANGE, E.REVOKED): None,
}
del S, E


class IllegalTransition(BridgeError):
    """A move the state table does not allow: a bug, never an operating condition."""

    def __init__(self, key: PartitionKey, state: PartitionState, event: PartitionEvent) -> None:
        self.key, self.state, self.event = key, state, event
        super().__init__(f"{key[0]}[{key[1]}]: '{event}' is not allowed in state {state}")


@dataclass
class Partition:
    lease: Lease  # in `fenced`, the lease this member last held
    state: PartitionState
    since: float  # monotonic: when it entered its state
    progressed: float  # monotonic: its last commit (or its claim)
    delivered: int = -1  # the offset after the last record Kafka handed over
    reason: str = ""


class PartitionTable:
    def __init__(self, *, out_of_range_notes: Mapping[str, str] | None = None) -> None:
        """`out_of_range_notes`: by topic, what its records' loss means and how to recover,
        added to the reason of its partitions that are out of range."""
        self._partitions: dict[PartitionKey, Partition] = {}
        self._notes = dict(out_of_range_notes or {})

    def __contains__(self, key: PartitionKey) -> bool:
        return key in self._partitions

    def keys(self) -> list[PartitionKey]:
        return sorted(self._partitions)

    def get(self, key: PartitionKey) -> Partition | None:
        return self._partitions.get(key)

    def in_state(self, *states: PartitionState) -> list[PartitionKey]:
        return sorted(k for k, p in self._partitions.items() if p.state in states)

    def lease(self, key: PartitionKey) -> Lease | None:
        """The lease of a `consuming` partition: its records are ours to apply."""
        partition = self._partitions.get(key)
        if partition is None or partition.state is not PartitionState.CONSUMING:
            return None
        return partition.lease

    def leases(self) -> list[Lease]:
        """The leases this member still holds (all states but `fenced`)."""
        return [p.lease for p in self._partitions.values() if p.state is not PartitionState.FENCED]

    def _move(self, key: PartitionKey, event: PartitionEvent, reason: str = "") -> Partition:
        """Moves `key` as the table says for `event` in its state, or raises."""
        partition = self._partitions[key]
        try:
            to = TRANSITIONS[partition.state, event]
        except KeyError:
            raise IllegalTransition(key, partition.state, event) from None
        if to is None:
            del self._partitions[key]
            return partition
        if partition.state is not to:
            partition.since = time.monotonic()
        partition.state, partition.reason = to, reason
        return partition

    # -- events -------------------------------------------------------------------------------

    def claimed(self, lease: Lease, *, log_start: int, log_end: int) -> PartitionState:
        """A fresh claim (on assignment, or after the row's owner was cleared)."""
        now = time.monotonic()
        reason = out_of_range_reason(lease.next_offset, log_start, log_end)
        event = PartitionEvent.CLAIMED_OUT_OF_RANGE if reason else PartitionEvent.CLAIMED
        if lease.key in self._partitions:
            partition = self._move(lease.key, event, reason)
            partition.lease, partition.progressed = lease, now
            return partition.state
        state = PartitionState.OUT_OF_RANGE if reason else PartitionState.CONSUMING
        self._partitions[lease.key] = Partition(lease, state, now, now, reason=reason)
        return state

    def committed(
        self, advanced: dict[PartitionKey, int], runs: Mapping[PartitionKey, Runs] | None = None
    ) -> None:
        """`runs`: of the partitions whose runs the batch stored with its offsets."""
        now = time.monotonic()
        for key, next_offset in advanced.items():
            partition = self._move(key, PartitionEvent.COMMITTED)
            lease = replace(partition.lease, next_offset=next_offset)
            if runs and key in runs:
                lease = replace(lease, runs=runs[key])
            partition.lease = lease
            partition.progressed = now

    def lost(self, keys: list[PartitionKey], why: str) -> None:
        """The database connection dropped while a batch of theirs was open or being committed;
        or the fenced advance refused their batch, so their offset is not what this member
        thought. Either way the offsets table must say where they stand."""
        for key in keys:
            if key in self._partitions:
                self._move(key, PartitionEvent.LOST, f"outcome unknown: {why}")

    def resolved(self, key: PartitionKey, row: StoredRow | None) -> PartitionState:
        """The offsets table was read: still ours (at the stored offset, whichever way the
        batch went), or taken by another member."""
        partition = self._partitions[key]
        if row is not None and row.owner_epoch == partition.lease.epoch:
            self._move(key, PartitionEvent.RESOLVED_OURS)
            partition.lease = replace(partition.lease, next_offset=row.next_offset, runs=row.runs)
            partition.progressed = time.monotonic()
        else:
            self._move(key, PartitionEvent.RESOLVED_TAKEN, _taken_reason(row))
        return partition.state

    def taken(self, key: PartitionKey, row: StoredRow | None) -> None:
        """The offsets table shows another owner epoch: this member's lease is void."""
        self._move(key, PartitionEvent.TAKEN, _taken_reason(row))

    def fell_out_of_range(self, key: PartitionKey, reason: str) -> None:
        """Kafka refused to fetch from the stored offset: the log no longer holds it."""
        self._move(key, PartitionEvent.FELL_OUT_OF_RANGE, reason)

    def delivered(self, key: PartitionKey, next_offset: int) -> None:
        partition = self._partitions.get(key)
        if partition is not None:
            partition.delivered = next_offset

    def forget(self, keys: list[PartitionKey]) -> None:
        """Revoked or lost by Kafka: no longer this member's, from any state the table allows."""
        for key in keys:
            if key in self._partitions:
                self._move(key, PartitionEvent.REVOKED)

    # -- what the service reads ---------------------------------------------------------------

    def caught_up(self, keys: Iterable[PartitionKey]) -> set[PartitionKey]:
        """Those of `keys` held here whose records Kafka delivered are all applied: the one
        definition that the lag metrics and the commits' reports share."""
        found = set()
        for key in keys:
            partition = self._partitions.get(key)
            if partition is not None and partition.delivered <= partition.lease.next_offset:
                found.add(key)
        return found

    def counts(self) -> dict[PartitionState, int]:
        counts = dict.fromkeys(PartitionState, 0)
        for partition in list(self._partitions.values()):
            counts[partition.state] += 1
        return counts

    def not_progressing(self, *, stalled_after_s: float) -> list[str]:
        """Why the member is not ready: each held partition that does not move, and why. A
        `consuming` partition is stalled when records wait and nothing committed for long."""
        now = time.monotonic()
        reasons = []
        # Read by the HTTP thread while the loop moves states: a copy, taken in one step.
        for (topic, number), p in sorted(list(self._partitions.items())):
            where = f"{topic}[{number}]"
            if p.state is PartitionState.CONSUMING:
                waiting = p.delivered > p.lease.next_offset
                if waiting and now - p.progressed > stalled_after_s:
                    reasons.append(
                        f"{where} stalled: records waiting, nothing committed for "
                        f"{now - p.progressed:.0f}s"
                    )
            else:
                note = self._notes.get(topic) if p.state is PartitionState.OUT_OF_RANGE else None
                reason = f"{p.reason}; {note}" if note else p.reason
                reasons.append(f"{where} {p.state} for {now - p.since:.0f}s: {reason}")
        return reasons


def out_of_range_reason(next_offset: int, log_start: int, log_end: int) -> str:
    """Why a stored offset cannot be fetched from, or "" when it can."""
    if next_offset < log_start:
        return (
            f"stored offset {next_offset} is below the log start {log_start}: records were "
            "lost before they were applied; see `bridge offsets reset`"
        )
    if next_offset > log_end:
        return (
            f"stored offset {next_offset} is beyond the log end {log_end}: the topic was "
            "deleted and recreated, or its records were lost; see `bridge offsets reset`"
        )
    return ""


def _taken_reason(row: StoredRow | None) -> str:
    if row is None:
        return "its row is gone from the offsets table"
    owner = row.owner or "nobody (released or reset)"
    return f"owner epoch {row.owner_epoch} now belongs to {owner}"
