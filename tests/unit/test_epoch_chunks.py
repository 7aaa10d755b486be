"""A chunk of staged records: what goes in comes out, headers rebuilt; and bytes that are not a
chunk raise only ChunkError."""

from __future__ import annotations

import contextlib

from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from consumers.epochs.chunks import (
    ChunkError,
    PlannedStep,
    Run,
    pack_plan,
    pack_records,
    unpack_plan,
    unpack_records,
)

PROVENANCE = [("bridge.query", b"q"), ("bridge.partition", b"2"), ("bridge.epoch", b"9"),
              ("bridge.epochs", b"whole")]  # fmt: skip


def test_records_come_back_as_kafka_gave_them() -> None:
    first = [
        Message("t", 0, 5, None, b'{"id": 1}', [*PROVENANCE], None, (1, 1000)),
        Message("t", 1, 7, b"k", None, [*PROVENANCE], None, (1, 1001)),
    ]
    second = [Message("t", 0, 6, b"", b"", [*PROVENANCE[:1], ("bridge.partition", b"3"),
                                             PROVENANCE[2], PROVENANCE[3], ("x", None),
                                             ("y", b"\xff")],
                      None, (0, 0))]  # fmt: skip
    raw = pack_records([Run(first, 2, []), Run(second, 3, [("x", None), ("y", b"\xff")])])
    back = unpack_records(raw, topic="t", query="q", epoch=9)
    for before, after in zip([*first, *second], back, strict=True):
        assert (after.topic(), after.partition(), after.offset(), after.key(), after.value(),
                after.headers(), after.timestamp()) == (
            before.topic(), before.partition(), before.offset(), before.key(), before.value(),
            before.headers(), before.timestamp())  # fmt: skip


def test_a_plan_comes_back_step_by_step() -> None:
    steps = [PlannedStep(b"CREATE TEMP TABLE x ()", None), PlannedStep(b"COPY x FROM STDIN", b"")]
    assert unpack_plan(pack_plan(steps)) == steps


@given(st.binary(max_size=300))
def test_bytes_that_are_not_a_chunk_raise_only_chunk_error(raw: bytes) -> None:
    for read in (
        lambda: unpack_records(raw, topic="t", query="q", epoch=1),
        lambda: unpack_plan(raw),
    ):
        with contextlib.suppress(ChunkError):
            read()
