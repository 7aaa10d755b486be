"""The epoch manifest: what each Spark micro-batch (epoch) wrote, and when it is whole.

A sink with `epochs=whole` writes two kinds of record to the manifest topic (one partition,
keyed by the query id), both JSON:

- a **part**, written by a write task inside the very Kafka transaction that carries its records,
  so that the part and the records commit or abort together: the query, the epoch, the task's
  Spark partition, and how many records it wrote to each topic;
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
from dataclasses import dataclass
from typing import Any, Final

from bridge.errors import BridgeError

VERSION: Final = 1
MAX_MANIFEST_BYTES: Final = 1 << 20  # an epoch of 65,536 tasks fits in well under this
MAX_PARTS: Final = 65_536  # Spark partitions of one epoch
MAX_TOPICS: Final = 10_000  # topics one task writes to
_MAX_QUERY_ID: Final = 200
_MAX_INT64: Final = (1 << 63) - 1
_TOPIC: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")


class ManifestError(BridgeError):
    """A manifest record that is not one: too large, not JSON, or a field out of bounds."""


@dataclass(frozen=True, kw_only=True)
class Part:
    """One write task's share of an epoch: records per topic."""

    query: str
    epoch: int
    partition: int
    records: Mapping[str, int]

    def encode(self) -> bytes:
        return _dump(
            {
                "v": VERSION,
                "kind": "part",
                "query": self.query,
                "epoch": self.epoch,
                "partition": self.partition,
                "records": dict(sorted(self.records.items())),
            }
        )


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
        return Part(query=query, epoch=epoch, partition=partition, records=records)
    if kind == "epoch":
        parts = document.get("parts")
        if not isinstance(parts, list) or len(parts) > MAX_PARTS:
            raise ManifestError(f"parts: a list of at most {MAX_PARTS} partitions expected")
        checked = tuple(_number(p, f"parts[{i}]", most=MAX_PARTS - 1) for i, p in enumerate(parts))
        if len(set(checked)) != len(checked):
            raise ManifestError("parts: a partition is named twice")
        return Epoch(query=query, epoch=epoch, parts=tuple(sorted(checked)))
    raise ManifestError(f"kind: {str(kind)[:20]!r}, expected 'part' or 'epoch'")


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
