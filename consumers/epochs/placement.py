"""Which epoch each record of a whole topic belongs to: from the manifest's offsets where the sink
named them, from the record's provenance headers elsewhere.

Reading a record's headers makes Python objects of them (confluent-kafka does it on first
access: 0.52 us a record with the sink's three, bench/headers.py), which was the whole cost of
whole epochs with one member. The sink's parts name their records' offsets
(`bridge.epoch_manifest.Part.offsets`): every offset inside one of a part's ranges is a record of
that task. So the records of a partition inside a range learned from the manifest are the
task's, and only the first and last of them have their headers read, as a check that the range
speaks of these records: a topic deleted and made again starts its offsets over, and the ranges
of an old manifest would name other records. On any difference the partition's ranges are
forgotten, and its records' headers read, as they are where no range is known (a part of an
older sink, or one this member did not read: the ledger keeps no offsets).

Nothing here is a guarantee: the ledger's judge, in the batch's transaction, counts what the
batch says it holds of each epoch against the manifest, as it always has.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterator, Sequence
from typing import Final, NamedTuple, cast

from bridge.epoch_manifest import Part
from consumers.database.offsets import PartitionKey
from consumers.decoding.records import Record, offset_of
from consumers.epochs.ledger import EpochKey
from consumers.epochs.staging import Headers, Provenance, provenance_of, runs

# Ranges remembered a partition (a few a part; about 1.5 MB at most), the oldest forgotten
# first: a partition this member does not hold keeps them until then, and records behind them
# are placed by their headers.
_MAX_SPANS: Final = 10_000
_AFTER_ANY: Final = 1 << 63  # more than any offset


class Placed(NamedTuple):
    """Consecutive records of one write task in a partition: their epoch and Spark partition.
    Without an epoch: records without the sink's provenance (`bare`: another producer's, of no
    epoch, written to their table as in the per-partition mode), or with a broken one (to be
    dead-lettered, naming why)."""

    epoch: EpochKey | None
    spark_partition: int
    records: list[Record]
    bare: bool = False


class _Span(NamedTuple):
    first: int
    last: int
    query: str
    epoch: int
    spark_partition: int


class Placement:
    """The ranges of the parts this member read, by partition, until its records pass them:
    only the whole topics' (`whole_topic`); a part names every topic its task wrote to."""

    def __init__(self, whole_topic: Callable[[str], bool]) -> None:
        self._whole_topic = whole_topic
        self._spans: dict[PartitionKey, list[_Span]] = {}

    def learn(self, part: Part) -> None:
        for topic, of_topic in part.offsets.items():
            if not self._whole_topic(topic):
                continue
            for partition, ranges in of_topic.items():
                spans = self._spans.setdefault((topic, partition), [])
                for first, last in ranges:
                    insort(spans, _Span(first, last, part.query, part.epoch, part.partition))
                del spans[:-_MAX_SPANS]

    def epochs_after(self, key: PartitionKey, offset: int) -> set[EpochKey]:
        """The epochs whose parts name records of `key` after `offset`, read or not yet."""
        return {(s.query, s.epoch) for s in self._spans.get(key, ()) if s.last > offset}

    def runs(self, key: PartitionKey, records: list[Record]) -> Iterator[Placed]:
        """`records` (a partition's, in offset order) as runs of one task's records each."""
        spans = self._spans.get(key)
        if not spans or not records:
            yield from _by_headers(records)
            return
        passed = 0  # ranges before this batch's records: a rewind reads headers instead
        start = offset_of(records[0])
        while passed < len(spans) and spans[passed].last < start:
            passed += 1
        del spans[:passed]
        i = 0
        while i < len(records):
            offset = offset_of(records[i])
            at = bisect_right(spans, (offset, _AFTER_ANY)) - 1  # the last starting at or before
            if at < 0 or spans[at].last < offset:
                ahead = spans[at + 1].first if at + 1 < len(spans) else _AFTER_ANY
                end = bisect_left(records, ahead, lo=i, key=offset_of)
                yield from _by_headers(records[i:end])
                i = end
                continue
            span = spans[at]
            end = bisect_right(records, span.last, lo=i, key=offset_of)
            run = records[i:end]
            task = Provenance(span.query, span.epoch, span.spark_partition)
            if _provenance(run[0]) != task or _provenance(run[-1]) != task:
                del self._spans[key]  # not these records' ranges
                yield from _by_headers(records[i:])
                return
            yield Placed((span.query, span.epoch), span.spark_partition, run)
            i = end


def _provenance(record: Record) -> Provenance | str | None:
    return provenance_of(cast(Headers, record.headers() or []))


def _by_headers(records: Sequence[Record]) -> Iterator[Placed]:
    for headers, run in runs(records):
        origin = provenance_of(headers)
        if origin is None:
            yield Placed(None, -1, run, bare=True)  # another producer's
        elif isinstance(origin, str):
            yield Placed(None, -1, run)  # a dead letter, staged
        else:
            yield Placed((origin.query, origin.epoch), origin.spark_partition, run)
