"""Where a transaction's records landed: each topic partition's offsets, as ranges, from the
producer's delivery reports.

A write task with whole epochs names its records' offsets in its part of the manifest
(`bridge.epoch_manifest.Part.offsets`), so that a reader finds each record's epoch from its
offset, without turning every record's provenance headers into Python objects (0.52 us a record
in confluent-kafka, the whole cost of whole epochs with one member: docs/benchmarks.md). Only
the delivery reports know the offsets: the partitioner picks most records' partitions inside
librdkafka. A task's records are mostly contiguous in a partition (others' batches interleave
between its own), so a handful of ranges a partition name them all.

Ours rather than a library's: nothing else gathers delivery reports into ranges.
"""

from __future__ import annotations

from typing import Any, Final

# Ranges a part names at most; beyond it the part names none, and readers read headers.
MAX_RANGES: Final = 20_000

# topic -> partition -> ranges of offsets, (first, last), in order
Ranges = dict[str, dict[int, tuple[tuple[int, int], ...]]]


class DeliveredOffsets:
    """The producer's `on_delivery` callback: gathers the delivered records' offsets."""

    def __init__(self) -> None:
        self._ranges: dict[str, dict[int, list[list[int]]]] = {}
        self.failed = False  # a record was not delivered: its offset is unknown
        self._unordered: set[str] = set()  # topics a partition's reports of came out of order

    def clear(self) -> None:
        """Forget what was gathered: a producer's next transaction starts."""
        self._ranges.clear()
        self._unordered.clear()
        self.failed = False

    def __call__(self, error: Any, message: Any) -> None:
        if error is not None:
            self.failed = True
            return
        partition: int = message.partition()
        offset: int = message.offset()
        of_topic = self._ranges.get(message.topic())
        if of_topic is None:
            of_topic = self._ranges[message.topic()] = {}
        ranges = of_topic.get(partition)
        if ranges is None:
            of_topic[partition] = [[offset, offset]]
        else:
            last = ranges[-1]
            if offset == last[1] + 1:
                last[1] = offset
            elif offset > last[1]:
                ranges.append([offset, offset])
            else:
                self._unordered.add(message.topic())  # librdkafka reports in order: never seen

    def ranges(self, records: dict[str, int]) -> Ranges | None:
        """The ranges of the topics in `records` (records delivered to each), or None when they
        cannot be named exactly: a record undelivered, a report out of order, a count that
        differs, or more than `MAX_RANGES` ranges."""
        if self.failed or self._unordered & records.keys():
            return None
        found = {topic: self._ranges.get(topic, {}) for topic, n in records.items() if n}
        for topic, of_topic in found.items():
            delivered = sum(last - first + 1 for r in of_topic.values() for first, last in r)
            if delivered != records[topic]:
                return None
        if sum(len(r) for of_topic in found.values() for r in of_topic.values()) > MAX_RANGES:
            return None
        return {
            topic: {p: tuple((first, last) for first, last in r) for p, r in of_topic.items()}
            for topic, of_topic in found.items()
        }
