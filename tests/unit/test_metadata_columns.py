"""Metadata columns: a row's columns filled from the record's coordinates, timestamp, key and
headers (the Spark sink's provenance among them), after the value's own columns."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, Message

from bridge.errors import ConfigError
from bridge.settings import RouteSettings, load_settings
from consumers.decoding.records import RecordError
from consumers.tables.targets import Target

METADATA = {
    "src_topic": "topic", "src_partition": "partition", "src_offset": "offset",
    "written_at": "timestamp", "k": "key", "raw_key": "key", "trace": "header:trace",
    "query": "spark.query", "spark_partition": "spark.partition", "epoch": "spark.epoch",
}  # fmt: skip


def _target(mode: Literal["insert", "upsert"] = "insert") -> Target:
    route = RouteSettings(topic="t", table="t", mode=mode, key_columns=("id",), metadata=METADATA)
    # The table's order mixes them; a row holds the value's columns first.
    columns = ("src_topic", "id", "k", "raw_key", "src_partition", "note", "src_offset",
               "written_at", "trace", "query", "spark_partition", "epoch")  # fmt: skip
    return Target(route=route, schema="public", name="t", columns=columns,
                  required=frozenset(), binaries=frozenset({"raw_key"}))  # fmt: skip


def _record(**more: Any) -> Message:
    fields: dict[str, Any] = {
        "topic": "t", "partition": 3, "offset": 41, "key": b"k-1", "value": b'{"id": 1}',
        "timestamp": (TIMESTAMP_CREATE_TIME, 1_764_077_168_123),
        "headers": [("trace", b"a"), ("bridge.query", b"q-1"), ("bridge.partition", b"2"),
                    ("bridge.epoch", b"17"), ("trace", b"b")],
    }  # fmt: skip
    return Message(**{**fields, **more})


def test_metadata_columns_follow_the_values_and_hold_the_records_coordinates() -> None:
    target = _target()
    assert target.columns[:2] == ("id", "note")
    record = _record()
    row = target.row(b'{"id": 1, "note": "n", "src_topic": "from the value: not used"}', record)
    assert dict(zip(target.columns, row, strict=True)) == {
        "id": 1, "note": "n", "src_topic": "t", "src_partition": 3, "src_offset": 41,
        "written_at": datetime(2025, 11, 25, 13, 26, 8, 123000, tzinfo=UTC), "k": "k-1",
        "raw_key": b"k-1", "trace": "b", "query": "q-1", "spark_partition": "2", "epoch": "17",
    }  # fmt: skip
    assert target.rows([b'{"id": 1, "note": "m"}'], [record]) == [(1, "m", *row[2:])]
    assert target.carried_rows([b'{"id": 1, "note": "m"}']) is None  # metadata rows need records


def test_missing_metadata_is_null_and_a_key_that_is_not_text_is_the_records_fault() -> None:
    target = _target()
    bare = _record(key=None, headers=None, timestamp=(TIMESTAMP_NOT_AVAILABLE, 0))
    row = dict(zip(target.columns, target.row(b'{"id": 2, "note": null}', bare), strict=True))
    assert [row[c] for c in ("k", "raw_key", "written_at", "trace", "epoch")] == [None] * 5
    with pytest.raises(RecordError, match="column k: not UTF-8 text"):
        target.row(b'{"id": 3, "note": "n"}', _record(key=b"\xff"))
    assert target.rows([b'{"id": 3, "note": "n"}'], [_record(key=b"\xff")]) is None


def test_upsert_writes_the_metadata_columns_too() -> None:
    target = _target("upsert")
    assert {target.columns[i] for i in target.tracked} == set(target.columns)


def test_a_metadata_source_that_is_not_one_is_refused_naming_it() -> None:
    route = {"topic": "t", "table": "t", "metadata": {"at": "time"}}
    with pytest.raises(ConfigError, match=r"consumer\.routes\.0\.metadata"):
        load_settings(
            kafka={"bootstrap_servers": "k:9092"}, postgres={"dsn": "postgresql://x@h/db"},
            consumer={"group_id": "g", "routes": [route]},
        )  # fmt: skip
