"""Records are the client's own messages; what a dead letter and a latency sample read of them."""

from __future__ import annotations

import json

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, Message

from consumers.database.dead_letters import headers_json, timestamp_ms
from consumers.decoding.records import offset_of


def test_headers_become_json_text_pairs_whatever_their_bytes() -> None:
    record = Message(
        topic="t",
        partition=0,
        offset=7,
        value=b"{}",
        headers=[("trace", b"t-1"), ("empty", None), ("raw", b"\xff\x00"), ("n\x00", "a")],
    )
    assert json.loads(headers_json(record)) == [
        ["trace", "t-1"],
        ["empty", None],
        ["raw", "\\xff\\x00"],  # not UTF-8, and NUL (jsonb refuses it): visible escapes
        ["n\\x00", "a"],
    ]
    assert headers_json(Message(topic="t", partition=0, offset=8, value=b"{}")) == "[]"
    assert offset_of(record) == 7


def test_a_record_without_a_timestamp_has_none() -> None:
    stamped = Message(topic="t", partition=0, offset=1, timestamp=(TIMESTAMP_CREATE_TIME, 123))
    unstamped = Message(topic="t", partition=0, offset=1, timestamp=(TIMESTAMP_NOT_AVAILABLE, 0))
    assert timestamp_ms(stamped) == 123
    assert timestamp_ms(unstamped) is None
