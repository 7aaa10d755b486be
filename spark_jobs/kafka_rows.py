"""The input schema of the sink (that of Spark's own Kafka sink) and its rows as Kafka records.

Columns: `value` (required, string or binary; null is a tombstone), optional `key` (string or
binary), `topic` (string; falls back to the `topic` option), `partition` (int; null lets the
partitioner choose) and `headers` (array<struct<key: string, value: binary>>). Other columns are
ignored, as Spark's sink ignores them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from bridge.errors import BridgeError, ConfigError

Header = tuple[str, bytes | str | None]
# topic, value, key, partition (-1: any), headers
KafkaRow = tuple[str, bytes | str | None, bytes | str | None, int, list[Header]]

_TEXT = (StringType, BinaryType)
_INTEGER = (IntegerType, LongType, ShortType)


class RowError(BridgeError):
    """A row that cannot become a Kafka record; the message names the row and the field."""


def check_schema(schema: StructType, *, default_topic: str | None) -> None:
    """Refuse, on the driver and before any task runs, an input the sink cannot write."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    problems: list[tuple[str, str]] = []

    def expect(name: str, allowed: tuple[type[DataType], ...], what: str) -> None:
        if name in fields and not isinstance(fields[name], allowed):
            problems.append((name, f"must be {what}, not {fields[name].simpleString()}"))

    if "value" not in fields:
        problems.append(("value", "the input needs a value column (string or binary)"))
    expect("value", _TEXT, "string or binary")
    expect("key", _TEXT, "string or binary")
    expect("topic", (StringType,), "string")
    expect("partition", _INTEGER, "an integer")
    if "headers" in fields and not _is_headers(fields["headers"]):
        problems.append(
            ("headers", "must be array<struct<key: string, value: binary>>, "
             f"not {fields['headers'].simpleString()}")
        )  # fmt: skip
    if "topic" not in fields and default_topic is None:
        problems.append(("topic", "set the topic option or give the input a topic column"))
    if problems:
        raise ConfigError(problems, source="the input of the bridge-kafka sink")


def _is_headers(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    names = {f.name: f.dataType for f in data_type.elementType.fields}
    return isinstance(names.get("key"), StringType) and isinstance(names.get("value"), _TEXT)


def kafka_rows(
    batches: Iterator[Any], *, default_topic: str | None, provenance: Sequence[Header]
) -> Iterator[KafkaRow]:
    """Each row of each Arrow record batch as (topic, value, key, partition, headers)."""
    fixed_headers = list(provenance)
    row_number = 0
    for batch in batches:
        names = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        size = batch.num_rows
        values = batch.column(names["value"]).to_pylist()
        keys = _column(batch, names, "key", size)
        topics = _column(batch, names, "topic", size)
        partitions = _column(batch, names, "partition", size)
        headers = _column(batch, names, "headers", size)
        for value, key, topic, partition, extra in zip(
            values, keys, topics, partitions, headers, strict=True
        ):
            target = topic or default_topic
            if target is None:
                raise RowError(f"row {row_number} of this task: topic is null and no topic option")
            if extra:
                row_headers = [*fixed_headers, *((h["key"], h["value"]) for h in extra)]
            else:
                row_headers = fixed_headers
            yield target, value, key, -1 if partition is None else partition, row_headers
            row_number += 1


def _column(batch: Any, names: dict[str, int], name: str, size: int) -> list[Any]:
    if name in names:
        values: list[Any] = batch.column(names[name]).to_pylist()
        return values
    return [None] * size
