"""The input schema of the sink (that of Spark's own Kafka sink) and its rows as Kafka records.

Columns: `value` (required, string or binary; null is a tombstone), optional `key` (string or
binary), `topic` (string; falls back to the `topic` option), `partition` (int; null lets the
partitioner choose) and `headers` (array<struct<key: string, value: binary>>). Other columns are
ignored, as Spark's sink ignores them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any, NamedTuple

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
# topic, value, key, partition (-1: any), headers (pairs, or a dict when the keys are unique)
KafkaRow = tuple[
    str, bytes | str | None, bytes | str | None, int, list[Header] | dict[str, bytes | str | None]
]

_TEXT = (StringType, BinaryType)
_INTEGER = (IntegerType, LongType, ShortType)


class RowError(BridgeError):
    """A row that cannot become a Kafka record; the message names the row and the field."""


def check_schema(
    schema: StructType,
    *,
    default_topic: str | None,
    typed: tuple[str, ...] = (),
) -> None:
    """Refuse, on the driver and before any task runs, an input the sink cannot write.

    `typed`: the columns (`value`, `key`) whose format is the registry's, which must already be
    framed (`spark_jobs.registry_frames.encode`)."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    problems: list[tuple[str, str]] = []
    for name in typed:
        if isinstance(fields.get(name), StructType):
            problems.append(
                (name, f"{name}.format is the registry's: frame the struct first, with "
                 "spark_jobs.registry_frames.encode(df, options)")
            )  # fmt: skip
        elif name in fields and not isinstance(fields[name], BinaryType):
            problems.append(
                (name, f"{name}.format is the registry's: it needs the framed bytes of "
                 f"spark_jobs.registry_frames.encode, not {fields[name].simpleString()}")
            )  # fmt: skip

    def expect(name: str, allowed: tuple[type[DataType], ...], what: str) -> None:
        if name in fields and not isinstance(fields[name], allowed):
            problems.append((name, f"must be {what}, not {fields[name].simpleString()}"))

    if "value" not in fields:
        problems.append(("value", "the input needs a value column (string or binary)"))
    for name in ("value", "key"):
        if name not in typed:
            expect(name, _TEXT, "string or binary")
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


class RecordChunk(NamedTuple):
    """Records to produce, with their count and their bytes of keys and values, known before
    they are produced: one per Arrow batch, so that nothing is counted a record at a time."""

    records: Iterable[KafkaRow]
    record_count: int
    size: int
    # Records per topic; filled as `records` is read when the rows name their topics.
    topics: Counter[str]

    @classmethod
    def of(cls, records: Sequence[KafkaRow]) -> RecordChunk:
        size = sum(_size(r[1]) + _size(r[2]) for r in records)
        return cls(records, len(records), size, Counter(r[0] for r in records))


def record_chunks(
    batches: Iterator[Any], *, default_topic: str | None, provenance: Sequence[Header]
) -> Iterator[RecordChunk]:
    """Each Arrow record batch as a chunk of (topic, value, key, partition, headers) records.

    A batch with only `value` and `key` (what `bridge produce` writes) becomes its records in C
    loops, every one carrying the same provenance headers object; other batches go row by row.
    The provenance is a dict there: librdkafka takes it in about two thirds of the time of the
    same headers as a list of pairs, and its keys are unique. Extra headers keep the list form,
    whose keys may repeat."""
    fixed_list = list(provenance)
    fixed_dict: dict[str, bytes | str | None] = dict(provenance)
    first_row = 0
    for batch in batches:
        names = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        count = batch.num_rows
        value_column = batch.column(names["value"])
        values = value_column.to_pylist()
        size = _column_size(value_column)
        if "key" in names:
            key_column = batch.column(names["key"])
            keys = key_column.to_pylist()
            size += _column_size(key_column)
        else:
            keys = [None] * count
        topics: Counter[str] = Counter()
        if default_topic is not None and not names.keys() & {"topic", "partition", "headers"}:
            records: Iterable[KafkaRow] = zip(
                repeat(default_topic, count), values, keys, repeat(-1, count),
                repeat(fixed_dict, count), strict=True,
            )  # fmt: skip
            topics[default_topic] = count
        else:
            records = _row_by_row(
                topics,
                first_row,
                values,
                keys,
                _column(batch, names, "topic", count),
                _column(batch, names, "partition", count),
                _column(batch, names, "headers", count),
                default_topic=default_topic,
                fixed_headers=fixed_list,
            )
        yield RecordChunk(records, count, size, topics)
        first_row += count


def _row_by_row(
    counted: Counter[str],
    first_row: int,
    values: list[Any],
    keys: list[Any],
    topics: list[Any],
    partitions: list[Any],
    headers: list[Any],
    *,
    default_topic: str | None,
    fixed_headers: list[Header],
) -> Iterator[KafkaRow]:
    for row_number, (value, key, topic, partition, extra) in enumerate(
        zip(values, keys, topics, partitions, headers, strict=True), start=first_row
    ):
        target = topic or default_topic
        if target is None:
            raise RowError(f"row {row_number} of this task: topic is null and no topic option")
        if extra:
            row_headers = [*fixed_headers, *((h["key"], h["value"]) for h in extra)]
        else:
            row_headers = fixed_headers
        counted[target] += 1
        yield target, value, key, -1 if partition is None else partition, row_headers


def _column_size(column: Any) -> int:
    """Bytes of a string or binary column's values (UTF-8 for strings), nulls as none."""
    import pyarrow.compute as pc  # here: the driver imports this module, and needs no Arrow

    total = pc.sum(pc.binary_length(column)).as_py()
    return int(total or 0)


def _size(data: bytes | str | None) -> int:
    if data is None:
        return 0
    return len(data.encode() if isinstance(data, str) else data)


def _column(batch: Any, names: dict[str, int], name: str, size: int) -> list[Any]:
    if name in names:
        values: list[Any] = batch.column(names[name]).to_pylist()
        return values
    return [None] * size
