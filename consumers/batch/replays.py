"""Records of a Spark task written again after its first write committed, on routes applied per
partition: found from the runs each Kafka partition has carried, and left out of the batch.

The sink stamps every record with its task's query, Spark partition, epoch and a random id of
the task's attempt (`bridge.attempt`). Its markers make a replayed epoch's tasks write nothing,
but markers are group offsets and expire (`offsets.retention.minutes`) or are deleted: a query
restarted from a checkpoint that lacks an epoch's commit then writes the epoch again, a second
committed attempt. In one Kafka partition the records of one (query, Spark partition) come in
epoch order, and one attempt's records before any later attempt's (an attempt commits whole, and
the next starts after it). So per Kafka partition, the last (epoch, attempt) seen of each
(query, Spark partition), its **run**, tells a replay: an earlier epoch, or the same epoch by
another attempt. The runs are stored in the partition's offsets row, written in the batch's
transaction with its offset (`OffsetStore.runs_statement`), so they move exactly as far as the
records do; an offsets reset clears them, so that a range moved back is applied again.

Whole routes do not need it: their epochs are published once, and a replay of a settled epoch
is below its query's watermark (`consumers.epochs.ledger`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import groupby
from typing import Final, cast

from confluent_kafka import Message

from bridge.names import (
    PROVENANCE_ATTEMPT,
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
    PROVENANCE_WHOLE,
    WHOLE_EPOCHS,
)
from consumers.database.offsets import Lease, PartitionKey, Run, Runs
from consumers.decoding.records import Record, offset_of

# Runs kept per Kafka partition, the most recently written: one per (query, Spark partition)
# that writes to it. A query's id is new with each new checkpoint; the runs of queries long
# gone make room for new ones.
MAX_RUNS: Final = 256
_MAX_ATTEMPT = 64  # bytes of an attempt id: the sink writes 8
_MAX_QUERY_ID = 200  # as the manifest bounds it
_NAMES = frozenset((PROVENANCE_QUERY, PROVENANCE_PARTITION, PROVENANCE_EPOCH, PROVENANCE_ATTEMPT))

Headers = list[tuple[str, bytes | None]]
RunKey = tuple[str, int]  # (query, Spark partition)
Attempt = tuple[int, str]  # (epoch, attempt id)


def attempt_of(headers: Headers | None) -> tuple[RunKey, Attempt] | None:
    """The task attempt that wrote a record, from its headers; None without all four headers
    or with values out of range (a record of another producer, or of a sink before attempts
    were stamped): such records are never taken for replays."""
    found: dict[str, bytes | None] = {}
    for name, value in headers or ():
        if name in _NAMES:
            found.setdefault(name, value)
    if len(found) < len(_NAMES):
        return None
    query, attempt = found[PROVENANCE_QUERY] or b"", found[PROVENANCE_ATTEMPT] or b""
    try:
        epoch = int(found[PROVENANCE_EPOCH] or b"")
        partition = int(found[PROVENANCE_PARTITION] or b"")
        if not 0 < len(query) <= _MAX_QUERY_ID or not 0 < len(attempt) <= _MAX_ATTEMPT:
            return None
        key = (query.decode(), partition)
        return key, (epoch, attempt.decode())
    except ValueError:  # UnicodeDecodeError is one
        return None


def _whole(headers: Headers | None) -> bool:
    return any(n == PROVENANCE_WHOLE and v == WHOLE_EPOCHS for n, v in headers or ())


@dataclass(frozen=True)
class Replayed:
    """A run of records of one task attempt left out: its epoch was written before."""

    topic: str
    partition: int
    query: str
    spark_partition: int
    epoch: int
    first_offset: int
    last_offset: int
    records: int


@dataclass(frozen=True)
class Split:
    """A batch's records with the replays' left out, and what each partition's runs become."""

    kept: dict[PartitionKey, list[Record]]
    # (topic, partition, offset) of every record left out: the batch's offsets still pass them.
    skipped: frozenset[tuple[str, int, int]] = frozenset()
    replayed: tuple[Replayed, ...] = ()
    # The runs of each partition whose runs the batch changes, as its transaction stores them.
    runs: dict[PartitionKey, Runs] = field(default_factory=dict)
    # Where they changed: (offset of the first record after which they hold, the runs), in
    # offset order, so that a batch committed only up to an offset stores those it reached.
    changes: dict[PartitionKey, tuple[tuple[int, Runs], ...]] = field(default_factory=dict)

    def up_to(self, key: PartitionKey, offset: int) -> Split:
        """The split of a batch whose partition `key` commits only its records before
        `offset`: the runs its records there leave, or none to store if they changed none."""
        reached = [runs for at, runs in self.changes.get(key, ()) if at < offset]
        runs = {k: v for k, v in self.runs.items() if k != key}
        changes = {k: v for k, v in self.changes.items() if k != key}
        if reached:
            runs[key] = reached[-1]
            changes[key] = tuple(c for c in self.changes[key] if c[0] < offset)
        return replace(self, runs=runs, changes=changes)

    def without(self, keys: list[PartitionKey]) -> Split:
        return replace(
            self,
            runs={k: v for k, v in self.runs.items() if k not in keys},
            changes={k: v for k, v in self.changes.items() if k not in keys},
        )


class ReplayFilter:
    """Per Kafka partition this member applies, its runs as the batches planned so far leave
    them (a batch in flight included). Taken again from the partition's lease, which holds the
    runs its last commit stored, whenever the lease changes or the member goes back to its
    leases (`rewound`)."""

    def __init__(self, *, applies_whole: Callable[[str], bool]) -> None:
        # A topic whose route publishes whole epochs: its records carrying the sink's whole
        # marker are the ledger's to tell (the watermark), not this filter's.
        self._applies_whole = applies_whole
        self._runs: dict[PartitionKey, tuple[int, dict[RunKey, Attempt]]] = {}

    def rewound(self) -> None:
        """The member went back to its leases: the runs of batches not committed are void."""
        self._runs.clear()

    def split(
        self,
        records: Mapping[PartitionKey, list[Record]],
        lease: Callable[[PartitionKey], Lease | None],
    ) -> Split:
        kept: dict[PartitionKey, list[Record]] = {}
        skipped: set[tuple[str, int, int]] = set()
        replayed: list[Replayed] = []
        changed: dict[PartitionKey, Runs] = {}
        changes: dict[PartitionKey, tuple[tuple[int, Runs], ...]] = {}
        for key, of_key in records.items():
            held = lease(key)
            runs = self._runs_of(key, held)
            if runs is None:  # not ours: the batch drops it anyway
                kept[key] = of_key
                continue
            whole_topic = self._applies_whole(key[0])
            moved: list[tuple[int, Runs]] = []
            out: list[Record] = []
            for headers, run in _runs(of_key):
                found = None if whole_topic and _whole(headers) else attempt_of(headers)
                if found is None:
                    out.extend(run)
                    continue
                task, attempt = found
                last = runs.get(task)
                if attempt == last:
                    out.extend(run)
                    continue
                if last is None or attempt[0] > last[0]:
                    runs.pop(task, None)  # to the end: the most recently moved
                    runs[task] = attempt
                    while len(runs) > MAX_RUNS:
                        del runs[next(iter(runs))]
                    moved.append((offset_of(run[0]), stored(runs)))
                    out.extend(run)
                    continue
                skipped.update((key[0], key[1], offset_of(r)) for r in run)
                replayed.append(
                    Replayed(key[0], key[1], task[0], task[1], attempt[0],
                             offset_of(run[0]), offset_of(run[-1]), len(run))
                )  # fmt: skip
            if out:
                kept[key] = out
            if moved:
                changed[key] = moved[-1][1]
                changes[key] = tuple(moved)
        return Split(kept, frozenset(skipped), tuple(_merged(replayed)), changed, changes)

    def _runs_of(self, key: PartitionKey, held: Lease | None) -> dict[RunKey, Attempt] | None:
        if held is None:
            self._runs.pop(key, None)
            return None
        known = self._runs.get(key)
        if known is None or known[0] != held.epoch:  # claimed again since: its row says
            known = (held.epoch, {(q, p): (e, a) for q, p, e, a in held.runs})
            self._runs[key] = known
        return known[1]


def stored(runs: Mapping[RunKey, Attempt]) -> Runs:
    """The runs as the offsets row and a lease hold them, oldest first."""
    return tuple(Run(q, p, e, a) for (q, p), (e, a) in runs.items())


def _runs(records: list[Record]) -> Iterator[tuple[Headers | None, list[Record]]]:
    """The records in runs of equal headers, as a task's records come: compared in C."""
    for headers, run in groupby(records, Message.headers):
        yield cast(Headers | None, headers), list(run)


def _merged(replayed: list[Replayed]) -> Iterator[Replayed]:
    """Consecutive runs of one task attempt in one partition, as one (for the log)."""
    current: Replayed | None = None
    for each in replayed:
        if current is not None and (current.topic, current.partition, current.query,
                                    current.spark_partition, current.epoch) == (
            each.topic, each.partition, each.query, each.spark_partition, each.epoch
        ):  # fmt: skip
            current = Replayed(current.topic, current.partition, current.query,
                               current.spark_partition, current.epoch, current.first_offset,
                               each.last_offset, current.records + each.records)  # fmt: skip
            continue
        if current is not None:
            yield current
        current = each
    if current is not None:
        yield current
