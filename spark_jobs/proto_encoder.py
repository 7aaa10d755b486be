"""Rows of a struct column as Protobuf bodies, in Spark's Python workers, with no generated code.

Spark 4's own `to_protobuf` needs the spark-protobuf package (not served to this project's
build) and a descriptor file on every executor; so the sink encodes in Python: `encode` ships
the compiled FileDescriptorSet (bytes) with the column's Spark type in an Arrow UDF, and each
worker builds the message's class from it once (`message_factory`, parsed and serialized by the
protobuf runtime in C). A batch's struct column becomes its rows as Python values in one Arrow
call; each row is made a message by the runtime's own constructor (nested dicts, lists, maps,
datetimes for Timestamps), after the few values Protobuf holds as text are made text (decimals
with every digit, dates and local date-times in ISO 8601) and maps, which Arrow gives as pairs,
are made dicts.

A row the message cannot hold (a null element of an array or value of a map, a number out of
its field's range) fails its task with a `RowError` naming the message's field and the row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from functools import cache
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from spark_jobs.kafka_rows import RowError

Convert = Callable[[Any], Any]


@cache
def message_class(descriptor_set: bytes, full_name: str) -> Any:
    """The class of message `full_name` of the compiled schema, built once a worker."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


class ProtoEncoder:
    """Bodies of one message for the values of a struct column of type `data_type`."""

    def __init__(self, descriptor_set: bytes, full_name: str, data_type: T.StructType) -> None:
        self._descriptor_set = descriptor_set
        self._full_name = full_name
        self._convert = _converter(data_type) or _identity

    def bodies(self, column: pa.Array) -> pa.Array:
        """An Arrow binary array of the bodies of `column` (an Arrow struct array); a null row
        stays null (a tombstone). Spark reads the type hints: an Arrow UDF of arrays."""
        kind = message_class(self._descriptor_set, self._full_name)
        convert = self._convert
        out: list[bytes | None] = []
        append = out.append
        for number, row in enumerate(column.to_pylist()):
            if row is None:
                append(None)
                continue
            fields = convert(row)
            try:
                append(kind(**fields).SerializeToString())
            except (TypeError, ValueError) as exc:
                raise RowError(_why(kind, fields, number, exc)) from None
        return pa.array(out, type=pa.binary())


def _why(kind: Any, fields: dict[str, Any], number: int, exc: Exception) -> str:
    """The error of a row the message would not take, naming its first field at fault."""
    for name, value in fields.items():
        try:
            kind(**{name: value})
        except (TypeError, ValueError) as one:
            return (f"row {number} of this batch cannot be written as Protobuf "
                    f"{kind.DESCRIPTOR.full_name}: field {name}: {one}")  # fmt: skip
    name = kind.DESCRIPTOR.full_name
    return f"row {number} of this batch cannot be written as Protobuf {name}: {exc}"


def _identity(value: Any) -> Any:
    return value


def _converter(data_type: T.DataType) -> Convert | None:
    """How a value of `data_type`, as Arrow gives it to Python, becomes what the message's
    constructor takes; None when it takes it as it is."""
    if isinstance(data_type, T.DecimalType):
        return _decimal_text
    if isinstance(data_type, T.DateType | T.TimestampNTZType):
        return _iso_text
    if isinstance(data_type, T.StructType):
        parts = {f.name: _converter(f.dataType) for f in data_type.fields}
        changed = {name: part for name, part in parts.items() if part is not None}
        if not changed:
            return None
        return lambda row: None if row is None else {
            name: (changed[name](value) if name in changed and value is not None else value)
            for name, value in row.items()
        }  # fmt: skip
    if isinstance(data_type, T.ArrayType):
        element = _converter(data_type.elementType)
        if element is None:
            return None
        return lambda items: None if items is None else [
            None if item is None else element(item) for item in items
        ]  # fmt: skip
    if isinstance(data_type, T.MapType):
        value_of = _converter(data_type.valueType) or _identity
        return lambda pairs: None if pairs is None else {
            key: (None if value is None else value_of(value)) for key, value in pairs
        }  # fmt: skip
    return None


def _decimal_text(value: Decimal) -> str:
    return format(value, "f")  # every digit, never an exponent


def _iso_text(value: date | datetime) -> str:
    return value.isoformat()
