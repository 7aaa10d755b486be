"""How a batch's records of one epoch wait in the ledger: one chunk, not a row per record.

A chunk holds, for one topic and one (query, epoch), the records a batch staged, packed as Kafka
gave them (`pack_records`), and, when the batch could plan them for their table, the statements
that write them with their COPY text (`pack_plan`), and what the plan was made for
(`plan_fingerprint`). Publishing runs the planned statements when the publishing member would
plan the same; the records are there for when it cannot (a record the table refuses, a route,
table or release changed since, a route that plans only at publication), and for an operator's
discard, which keeps them as dead letters.

Packing costs a few C loops over the batch: the records' fields as arrays, their keys and values
each joined into one string of bytes, and the headers once per run of a task's records (the
sink's provenance is the chunk's own query and epoch, and each run's Spark partition). A row per
record, as a first version had, cost PostgreSQL an index entry, a read and a delete per record:
whole epochs ran at a fifth of the per-partition mode's rate (bench/epochs.py).

The chunks are bridge's own writing, read back only by bridge; `unpack_records` still checks the
sizes it is given, and raises ChunkError for a chunk that is not one.
"""

from __future__ import annotations

import hashlib
import json
import struct
from array import array
from collections.abc import Sequence
from itertools import accumulate
from operator import itemgetter
from typing import NamedTuple, cast

from confluent_kafka import Message

from bridge import __version__
from bridge.errors import BridgeError
from bridge.names import (
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
    PROVENANCE_WHOLE,
    WHOLE_EPOCHS,
)
from consumers.tables.targets import Target

_VERSION = 1
_LENGTH = struct.Struct(">I")
_NONE = 0xFFFFFFFF  # a step without COPY text

Headers = list[tuple[str, bytes | None]]


class ChunkError(BridgeError):
    """Bytes that are not a chunk this release wrote."""


class Run(NamedTuple):
    """Consecutive records of one write task: its Spark partition, and the headers its records
    carry besides the provenance."""

    records: list[Message]
    spark_partition: int
    others: Headers


def _length(data: bytes | None) -> int:
    return -1 if data is None else len(data)


def pack_records(runs: Sequence[Run]) -> bytes:
    """The runs' records, for `unpack_records`."""
    records = [record for run in runs for record in run.records]
    stamps = list(map(Message.timestamp, records))
    keys = list(map(Message.key, records))
    values = list(map(Message.value, records))
    sections = [
        array("i", cast(list[int], list(map(Message.partition, records)))).tobytes(),
        array("q", cast(list[int], list(map(Message.offset, records)))).tobytes(),
        array("b", map(itemgetter(0), stamps)).tobytes(),
        array("q", map(itemgetter(1), stamps)).tobytes(),
        array("i", map(_length, keys)).tobytes(),
        array("i", map(_length, values)).tobytes(),
        b"".join(filter(None, keys)),
        b"".join(filter(None, values)),
    ]
    head = {
        "v": _VERSION,
        "n": len(records),
        "runs": [
            [len(run.records), run.spark_partition, [[n, v and v.hex()] for n, v in run.others]]
            for run in runs
        ],
        "sizes": [len(section) for section in sections],
    }
    packed = json.dumps(head, separators=(",", ":")).encode()
    return b"".join([_LENGTH.pack(len(packed)), packed, *sections])


def unpack_records(raw: bytes, *, topic: str, query: str, epoch: int) -> list[Message]:
    """The records of a chunk, headers and all, as the consumer got them from Kafka."""
    try:
        (size,) = _LENGTH.unpack_from(raw)
        head = json.loads(raw[4 : 4 + size])
        count, runs, sizes = int(head["n"]), head["runs"], list(map(int, head["sizes"]))
        if head["v"] != _VERSION or len(sizes) != 8 or 4 + size + sum(sizes) != len(raw):
            raise ChunkError("a chunk of another version, or cut short")
        bounds = list(accumulate(sizes, initial=4 + size))
        section = [raw[bounds[i] : bounds[i + 1]] for i in range(8)]
        partitions, offsets = array("i", section[0]), array("q", section[1])
        kinds, stamps = array("b", section[2]), array("q", section[3])
        keys = _split(array("i", section[4]), section[6])
        values = _split(array("i", section[5]), section[7])
        if not count == len(partitions) == len(offsets) == len(kinds) == len(keys):
            raise ChunkError("a chunk whose arrays disagree")
        headers: list[Headers] = []
        query_header = (PROVENANCE_QUERY, query.encode())
        epoch_header = (PROVENANCE_EPOCH, str(epoch).encode())
        whole = (PROVENANCE_WHOLE, WHOLE_EPOCHS)  # only a whole epoch's records are staged
        for length, part, others in runs:
            shared: Headers = [
                query_header, (PROVENANCE_PARTITION, str(part).encode()), epoch_header, whole,
                *((n, None if v is None else bytes.fromhex(v)) for n, v in others),
            ]  # fmt: skip
            headers += [shared] * length
    except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
        raise ChunkError(f"not a chunk: {exc}") from None
    return [
        Message(topic, partition, offset, key, value, header, None, (kind, stamp))
        for partition, offset, key, value, header, kind, stamp in zip(
            partitions, offsets, keys, values, headers, kinds, stamps, strict=True
        )
    ]


def _split(lengths: array[int], joined: bytes) -> list[bytes | None]:
    found: list[bytes | None] = []
    at = 0
    for length in lengths:
        if length < 0:
            found.append(None)
            continue
        found.append(joined[at : at + length])
        at += length
    if at != len(joined):
        raise ChunkError("a chunk whose lengths do not add up")
    return found


# COPY ... (FORMAT binary): the chunks' bytes go as they are, where text COPY doubles them in
# hex for the client to write and the server to read back.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_FIELD = struct.Struct(">i")
CHUNK_COLUMNS = (
    "group_id", "query", "epoch", "topic", "records", "rows", "raw", "plan", "stamps",
    "fingerprint",
)  # fmt: skip
LATENCY_SAMPLES = 100  # the timestamps a chunk keeps for the latency histogram


class Chunk(NamedTuple):
    group_id: str
    query: str
    epoch: int
    topic: str
    records: int
    rows: int | None
    raw: bytes
    plan: bytes | None
    stamps: bytes  # `sample_stamps`
    fingerprint: str | None  # `plan_fingerprint` of the target `plan` was made for


def plan_fingerprint(target: Target) -> str:
    """What a staged plan was made for: the route as configured, the table as reflected, and
    the release that wrote the statements. A plan whose fingerprint is not the publishing
    member's for the same topic is not run: a route changed, a table altered, or an upgrade
    between staging and publication would otherwise mix old plans with new ones."""
    made_for = {
        "release": [__version__, _VERSION],
        "route": target.route.model_dump(mode="json"),
        "table": [target.schema, target.name, list(target.columns)],
        "kinds": [sorted(target.required), sorted(target.defaulted), sorted(target.generated),
                  sorted(target.arrays), sorted(target.timestamps), sorted(target.binaries)],
    }  # fmt: skip
    return hashlib.sha256(json.dumps(made_for, sort_keys=True).encode()).hexdigest()[:32]


def sample_stamps(records: Sequence[Message]) -> bytes:
    """Timestamps (ms) of up to LATENCY_SAMPLES of `records`, evenly spread."""
    sampled = records[:: max(1, len(records) // LATENCY_SAMPLES)]
    return array("q", [stamp for _, stamp in map(Message.timestamp, sampled)]).tobytes()


def stamps_of(stamps: bytes) -> list[int]:
    return list(array("q", stamps[: len(stamps) - len(stamps) % 8]))


def copy_binary(chunks: Sequence[Chunk]) -> bytes:
    """`chunks` as `COPY <chunks table> (CHUNK_COLUMNS) FROM STDIN (FORMAT binary)` reads
    them."""
    out = [_COPY_HEADER]
    for chunk in chunks:
        made_for = None if chunk.fingerprint is None else chunk.fingerprint.encode()
        out.append(struct.pack(">h", len(CHUNK_COLUMNS)))
        for field in (chunk.group_id.encode(), chunk.query.encode(),
                      struct.pack(">q", chunk.epoch), chunk.topic.encode(),
                      struct.pack(">i", chunk.records),
                      None if chunk.rows is None else struct.pack(">i", chunk.rows),
                      chunk.raw, chunk.plan, chunk.stamps, made_for):  # fmt: skip
            if field is None:
                out.append(_FIELD.pack(-1))
            else:
                out += [_FIELD.pack(len(field)), field]
    out.append(_COPY_TRAILER)
    return b"".join(out)


class PlannedStep(NamedTuple):
    """A statement as the database reads it, and the COPY text it reads, if any."""

    statement: bytes
    data: bytes | None


def pack_plan(steps: Sequence[PlannedStep]) -> bytes:
    parts = []
    for statement, data in steps:
        parts += [_LENGTH.pack(len(statement)), statement]
        parts += [_LENGTH.pack(_NONE)] if data is None else [_LENGTH.pack(len(data)), data]
    return b"".join(parts)


def unpack_plan(packed: bytes) -> list[PlannedStep]:
    steps = []
    at = 0
    try:
        while at < len(packed):
            (size,) = _LENGTH.unpack_from(packed, at)
            statement = packed[at + 4 : at + 4 + size]
            at += 4 + size
            (size,) = _LENGTH.unpack_from(packed, at)
            at += 4
            data = None if size == _NONE else packed[at : at + size]
            at += 0 if data is None else size
            steps.append(PlannedStep(statement, data))
    except struct.error as exc:
        raise ChunkError(f"not a plan: {exc}") from None
    return steps
