"""Rows of a struct column as Protobuf bodies, in Spark's Python workers, with no generated code.

Spark 4's own `to_protobuf` needs the spark-protobuf package (not served to this project's
build) and a descriptor file on every executor; so the sink encodes in Python: `encode` ships
the compiled FileDescriptorSet (bytes) with the column's Spark type in an Arrow UDF, and each
worker builds the message's class from it once (`message_factory`: the protobuf runtime
serializes in C). A batch's struct column becomes its rows as Python values in one Arrow call;
each row is made a message by the runtime's own constructor (nested dicts, lists, maps,
datetimes for Timestamps, timedeltas for Durations), after the values that the message holds in
another form are converted, as each field's type says (`plan`):

| message field | from the Spark column | as |
|---|---|---|
| `string` | a string; a decimal, a date, a `timestamp_ntz` | itself; text (every digit, ISO 8601) |
| an integer of any kind | an integer; a `decimal(p, 0)` (for `uint64` past 2**63) | the number |
| `float`, `double`, `bool`, `bytes` | the same kind | itself |
| an enum | a string (the value's name) or an integer | itself |
| `Timestamp` | `timestamp`, or `timestamp_ntz` (read as UTC) | itself |
| `Duration` | `interval day to second` | itself |
| a wrapper (`Int64Value`, ...) | its value's kind | the wrapper; null absent |
| `Struct`, `Value`, `ListValue` | a string of JSON | parsed |
| a message | a struct, by field name | its fields |
| `repeated`, `map<K, V>` | an array, a map | element by element |

`plan` runs on the driver first, so that a column the message has no field for, or one of a
kind its field cannot take, is a `ConfigError` naming the column's path before the query writes
anything. A row the message still cannot hold (a null element of an array or value of a map, a
number out of its field's range, an enum name it lacks, text that is not JSON) fails its task
with a `RowError` naming the message's field and the row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pyspark.sql import types as T

from bridge.errors import ConfigError
from spark_jobs.kafka_rows import RowError

Convert = Callable[[Any], Any]
_WELL_KNOWN = "google.protobuf."
_JSON_TYPES = {f"{_WELL_KNOWN}{n}" for n in ("Struct", "Value", "ListValue")}
_WRAPPERS = {
    f"{_WELL_KNOWN}{name}"
    for name in ("DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value",
                 "UInt32Value", "BoolValue", "StringValue", "BytesValue")
}  # fmt: skip
_INTEGERS = {
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64,
}  # fmt: skip
_SPARK_INTEGERS = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_STRINGS = (T.StringType, T.CharType, T.VarcharType)


def load(descriptor_set: bytes, full_name: str) -> Descriptor:
    """Message `full_name` of a compiled schema, in a pool of its own."""
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        pool.Add(file)
    return pool.FindMessageTypeByName(full_name)


class ProtoEncoder:
    """Bodies of one message for the values of a struct column of type `data_type`. Pickled
    into Spark's workers as its bytes and names; what it builds from them stays in each one."""

    def __init__(self, descriptor_set: bytes, full_name: str, data_type: T.StructType) -> None:
        self._descriptor_set = descriptor_set
        self._full_name = full_name
        self._data_type = data_type
        self._built: tuple[Any, Convert] | None = None

    def check(self) -> None:
        """ConfigError naming each column the message cannot take (on the driver)."""
        self._build()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_built": None}  # classes of a pool of its own do not pickle

    def _build(self) -> tuple[Any, Convert]:
        if self._built is None:
            message = load(self._descriptor_set, self._full_name)
            problems: list[tuple[str, str]] = []
            convert = _message_plan(message, self._data_type, "", problems)
            if problems:
                raise ConfigError(problems, source=f"the columns as Protobuf {message.full_name}")
            self._built = message_factory.GetMessageClass(message), convert
        return self._built

    def bodies(self, column: pa.Array) -> pa.Array:
        """An Arrow binary array of the bodies of `column` (an Arrow struct array); a null row
        stays null (a tombstone). Spark reads the type hints: an Arrow UDF of arrays."""
        kind, convert = self._build()
        out: list[bytes | None] = []
        append = out.append
        for number, row in enumerate(column.to_pylist()):
            if row is None:
                append(None)
                continue
            try:
                fields = convert(row)
                append(kind(**fields).SerializeToString())
            except (TypeError, ValueError, json_format.ParseError) as exc:
                raise RowError(_why(kind, convert, row, number, exc)) from None
        return pa.array(out, type=pa.binary())


def _why(kind: Any, convert: Convert, row: dict[str, Any], number: int, exc: Exception) -> str:
    """The error of a row the message would not take, naming its first field at fault."""
    name = kind.DESCRIPTOR.full_name
    for column, value in row.items():
        try:
            kind(**convert({column: value}))
        except (TypeError, ValueError, json_format.ParseError) as one:
            return (f"row {number} of this batch cannot be written as Protobuf {name}: field "
                    f"{column}: {one}")  # fmt: skip
    return f"row {number} of this batch cannot be written as Protobuf {name}: {exc}"


def _message_plan(
    message: Descriptor, data_type: T.StructType, path: str, problems: list[tuple[str, str]]
) -> Convert:
    """How a struct's row (a dict) becomes the message's constructor's keywords."""
    parts: dict[str, Convert] = {}
    for column in data_type.fields:
        where = f"{path}.{column.name}" if path else column.name
        field = message.fields_by_name.get(column.name)
        if field is None:
            problems.append((where, f"message {message.full_name} has no field {column.name}"))
            continue
        part = _field_plan(field, column.dataType, where, problems)
        if part is not None:
            parts[column.name] = part
    if not parts:
        return _identity
    return lambda row: {
        name: (parts[name](value) if value is not None and name in parts else value)
        for name, value in row.items()
    }  # fmt: skip


def _field_plan(
    field: FieldDescriptor, data_type: T.DataType, where: str, problems: list[tuple[str, str]]
) -> Convert | None:
    """How a column's non-null value becomes what the field takes; None: as it is."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        if not isinstance(data_type, T.MapType):
            return _refuse(where, f"a map field, not {data_type.simpleString()}", problems)
        key = _single_plan(entry.fields_by_name["key"], data_type.keyType, where, problems)
        value = _single_plan(entry.fields_by_name["value"], data_type.valueType, where, problems)
        key, value = key or _identity, value or _identity
        return lambda pairs: {
            key(k): (None if v is None else value(v)) for k, v in pairs
        }  # fmt: skip
    if field.is_repeated:
        if not isinstance(data_type, T.ArrayType):
            return _refuse(where, f"a repeated field, not {data_type.simpleString()}", problems)
        element = _single_plan(field, data_type.elementType, where + "[]", problems)
        if element is None:
            return None
        return lambda items: [None if item is None else element(item) for item in items]
    return _single_plan(field, data_type, where, problems)


def _single_plan(
    field: FieldDescriptor, data_type: T.DataType, where: str, problems: list[tuple[str, str]]
) -> Convert | None:
    message = field.message_type
    if message is None:
        return _scalar_plan(field, data_type, where, problems)
    name = message.full_name
    if name in _WRAPPERS:
        inner = _scalar_plan(message.fields_by_name["value"], data_type, where, problems)
        inner = inner or _identity
        return lambda value: {"value": inner(value)}
    if name == f"{_WELL_KNOWN}Timestamp":
        if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
            return None
        return _refuse(where, f"a Timestamp, not {data_type.simpleString()}", problems)
    if name == f"{_WELL_KNOWN}Duration":
        if isinstance(data_type, T.DayTimeIntervalType):
            return None
        return _refuse(where, f"a Duration (an interval day to second), not "
                       f"{data_type.simpleString()}", problems)  # fmt: skip
    if name in _JSON_TYPES:
        if not isinstance(data_type, _STRINGS):
            return _refuse(where, f"a {name[len(_WELL_KNOWN):]} (a string of JSON), not "
                           f"{data_type.simpleString()}", problems)  # fmt: skip
        return _json_plan(message)
    if not isinstance(data_type, T.StructType):
        return _refuse(where, f"message {name} (a struct), not {data_type.simpleString()}",
                       problems)  # fmt: skip
    return _message_plan(message, data_type, where, problems)


def _json_plan(message: Descriptor) -> Convert:
    """Struct, Value or ListValue from JSON text, as an instance of the schema's own class."""
    kind: list[Any] = []

    def parse(text: str) -> Any:
        if not kind:
            kind.append(message_factory.GetMessageClass(message))
        made = kind[0]()
        # A Struct takes an object, a ListValue an array, a Value any JSON.
        json_format.ParseDict(json.loads(text), made)
        return made

    return parse


def _scalar_plan(
    field: FieldDescriptor, data_type: T.DataType, where: str, problems: list[tuple[str, str]]
) -> Convert | None:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        if isinstance(data_type, T.DecimalType):
            return _decimal_text
        if isinstance(data_type, T.DateType | T.TimestampNTZType):
            return _iso_text
        if isinstance(data_type, _STRINGS):
            return None
    elif kind == FieldDescriptor.TYPE_ENUM:
        if isinstance(data_type, (*_STRINGS, *_SPARK_INTEGERS)):
            return None
    elif kind in _INTEGERS:
        if isinstance(data_type, _SPARK_INTEGERS):
            return None
        if isinstance(data_type, T.DecimalType) and data_type.scale == 0:
            return int
    elif kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        if isinstance(data_type, (T.FloatType, T.DoubleType, *_SPARK_INTEGERS)):
            return None
    elif kind == FieldDescriptor.TYPE_BOOL:
        if isinstance(data_type, T.BooleanType):
            return None
    elif kind == FieldDescriptor.TYPE_BYTES and isinstance(data_type, T.BinaryType):
        return None
    return _refuse(where, f"field {field.full_name} is {_type_name(field)}, which a "
                   f"{data_type.simpleString()} column cannot fill", problems)  # fmt: skip


def _type_name(field: FieldDescriptor) -> str:
    if field.enum_type is not None:
        return f"enum {field.enum_type.full_name}"
    names = {v: k for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
    return names[field.type].removeprefix("TYPE_").lower()


def _refuse(where: str, why: str, problems: list[tuple[str, str]]) -> Convert | None:
    """Note the problem; the plan goes on to find the others (it is never run)."""
    problems.append((where, why))
    return None


def _identity(value: Any) -> Any:
    return value


def _decimal_text(value: Decimal) -> str:
    return format(value, "f")  # every digit, never an exponent


def _iso_text(value: date | datetime) -> str:
    return value.isoformat()
