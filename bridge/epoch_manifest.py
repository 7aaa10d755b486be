"""The epoch manifest: what each Spark micro-batch (epoch) wrote, and when it is whole.

A sink with `epochs=whole` writes two kinds of record to the manifest topic (one partition,
keyed by the query id), both JSON:

- a **part**, written by a write task inside the very Kafka transaction that carries its records,
  so that the part and the records commit or abort together: the query, the epoch, the task's
  Spark partition, how many records it wrote to each topic, and (from this version's sink) where
  they are: each topic partition's offsets as ranges, from the task's delivery reports, so that
  a reader finds a record's epoch from its offset instead of its headers;
- an **epoch**, written by the driver's commit hook once every task of the epoch succeeded, in a
  transaction of its own: the query, the epoch, and the Spark partitions that wrote a part (a
  task with no input writes none).

An epoch is whole for a reader once it holds the epoch record, a part for every partition the
epoch record names, and each part's records. A replay changes none of it: a task whose marker
says its (partition, epoch) is committed writes nothing, its part already in the log; a driver
killed before, inside or after its hook writes the epoch record again on replay, with the same
content. So the same epoch record may appear twice, and a reader takes the first.

Read from Kafka, a manifest record is hostile until parsed: `parse` bounds its size and every
number and list in it, and raises only `ManifestError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from bridge.errors import BridgeError

VERSION: Final = 1
MAX_MANIFEST_BYTES: Final = 1 << 20  # an epoch of 65,536 tasks fits in well under this
MAX_PARTS: Final = 65_536  # Spark partitions of one epoch
MAX_TOPICS: Final = 10_000  # topics one task writes to
_MAX_QUERY_ID: Final = 200
_MAX_INT64: Final = (1 << 63) - 1
MAX_RANGES: Final = 20_000  # offset ranges of one part (bridge.delivered_offsets bounds them)
_TOPIC: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")
_PARTITION: Final = re.compile(r"0|[1-9][0-9]{0,9}")
_MAX_KAFKA_PARTITION: Final = (1 << 31) - 1

# topic -> Kafka partition -> the task's records' offsets, as (first, last) ranges, in order
OffsetRanges = Mapping[str, Mapping[int, tuple[tuple[int, int], ...]]]


class ManifestError(BridgeError):
    """A manifest record that is not one: too large, not JSON, or a field out of bounds."""


@dataclass(frozen=True, kw_only=True)
class Part:
    """One write task's share of an epoch: records per topic, and where they are when the task
    knew it (`offsets`: each range's offsets are all the task's records; empty: not named)."""

    query: str
    epoch: int
    partition: int
    records: Mapping[str, int]
    offsets: OffsetRanges = field(default_factory=dict)

    def encode(self) -> bytes:
        document: dict[str, Any] = {
            "v": VERSION,
            "kind": "part",
            "query": self.query,
            "epoch": self.epoch,
            "partition": self.partition,
            "records": dict(sorted(self.records.items())),
        }
        if self.offsets:
            document["offsets"] = {
                topic: {str(p): [list(r) for r in ranges] for p, ranges in sorted(of.items())}
                for topic, of in sorted(self.offsets.items())
            }
        return _dump(document)


@dataclass(frozen=True, kw_only=True)
class Epoch:
    """An epoch every task of which succeeded: the Spark partitions that wrote a part."""

    query: str
    epoch: int
    parts: tuple[int, ...]  # in order, as `parse` gives them

    def encode(self) -> bytes:
        return _dump(
            {
                "v": VERSION,
                "kind": "epoch",
                "query": self.query,
                "epoch": self.epoch,
                "parts": sorted(self.parts),
            }
        )


def key_of(query: str) -> bytes:
    return query.encode()


def parse(value: bytes | None) -> Part | Epoch:
    """A manifest record's value, checked; ManifestError naming the field otherwise."""
    if value is None:
        raise ManifestError("a manifest record has no value")
    if len(value) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{len(value)} bytes, more than {MAX_MANIFEST_BYTES}")
    try:
        document = json.loads(value)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than json takes
        raise ManifestError(f"not JSON: {str(exc)[:200]}") from None
    if not isinstance(document, dict):
        raise ManifestError("not a JSON object")
    if document.get("v") != VERSION:
        raise ManifestError(f"v: version {str(document.get('v'))[:20]!r}, expected {VERSION}")
    kind = document.get("kind")
    query = document.get("query")
    if not isinstance(query, str) or not 0 < len(query) <= _MAX_QUERY_ID:
        raise ManifestError(f"query: a string of 1 to {_MAX_QUERY_ID} characters expected")
    epoch = _count(document, "epoch")
    if kind == "part":
        records = document.get("records")
        if not isinstance(records, dict) or len(records) > MAX_TOPICS:
            raise ManifestError(f"records: an object of at most {MAX_TOPICS} topics expected")
        for topic in records:
            if not _TOPIC.fullmatch(topic):
                raise ManifestError(f"records: {topic[:260]!r} is not a topic name")
            _count(records, topic, where=f"records.{topic}")
        partition = _count(document, "partition", most=MAX_PARTS - 1)
        offsets = _offsets(document.get("offsets", {}), records)
        return Part(query=query, epoch=epoch, partition=partition, records=records, offsets=offsets)
    if kind == "epoch":
        parts = document.get("parts")
        if not isinstance(parts, list) or len(parts) > MAX_PARTS:
            raise ManifestError(f"parts: a list of at most {MAX_PARTS} partitions expected")
        checked = tuple(_number(p, f"parts[{i}]", most=MAX_PARTS - 1) for i, p in enumerate(parts))
        if len(set(checked)) != len(checked):
            raise ManifestError("parts: a partition is named twice")
        return Epoch(query=query, epoch=epoch, parts=tuple(sorted(checked)))
    raise ManifestError(f"kind: {str(kind)[:20]!r}, expected 'part' or 'epoch'")


def _offsets(value: Any, records: Mapping[str, int]) -> OffsetRanges:
    """A part's offset ranges, checked: topics it counts, partitions, ranges in order, and as
    many offsets in a topic's ranges as the part counts records there."""
    if not isinstance(value, dict):
        raise ManifestError("offsets: an object of topics expected")
    found: dict[str, dict[int, tuple[tuple[int, int], ...]]] = {}
    ranges_seen = 0
    for topic, of_topic in value.items():
        where = f"offsets.{topic[:260]}"
        if topic not in records:
            raise ManifestError(f"{where}: a topic the part counts no records of")
        if not isinstance(of_topic, dict):
            raise ManifestError(f"{where}: an object of partitions expected")
        in_ranges = 0
        checked: dict[int, tuple[tuple[int, int], ...]] = {}
        for name, ranges in of_topic.items():
            if not _PARTITION.fullmatch(name) or int(name) > _MAX_KAFKA_PARTITION:
                raise ManifestError(f"{where}: {name[:20]!r} is not a partition")
            if not isinstance(ranges, list) or not ranges:
                raise ManifestError(f"{where}.{name}: a list of [first, last] ranges expected")
            ranges_seen += len(ranges)
            if ranges_seen > MAX_RANGES:
                raise ManifestError(f"offsets: more than {MAX_RANGES} ranges")
            pairs = []
            after = -1  # the end of the range before: ranges are in order, not overlapping
            for i, pair in enumerate(ranges):
                at = f"{where}.{name}[{i}]"
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ManifestError(f"{at}: a [first, last] pair expected")
                first, last = (_number(n, at, most=_MAX_INT64) for n in pair)
                if not after < first <= last:
                    raise ManifestError(f"{at}: first <= last, after the range before, expected")
                in_ranges += last - first + 1
                after = last
                pairs.append((first, last))
            checked[int(name)] = tuple(pairs)
        if in_ranges != records[topic]:
            raise ManifestError(
                f"{where}: {in_ranges} offsets in its ranges, {records[topic]} records counted"
            )
        found[topic] = checked
    return found


def _count(
    document: Mapping[str, Any], name: str, *, most: int = _MAX_INT64, where: str = ""
) -> int:
    return _number(document.get(name), where or name, most=most)


def _number(value: Any, where: str, *, most: int) -> int:
    # bool is an int to Python, never a count here.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        raise ManifestError(f"{where}: an integer from 0 to {most} expected")
    return value


def _dump(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()
