"""A DataFrame's schema as an Avro schema, the one a typed topic's records are written with.

The mapping (docs/typed-records.md holds its table): strings, bytes, booleans and numbers to their
Avro types; `decimal(p, s)` to bytes with the `decimal` logical type (every digit kept);
`date` to `date`; `timestamp` to `timestamp-micros` and `timestamp_ntz` to
`local-timestamp-micros` (Spark keeps microseconds); arrays, maps with string keys and structs to
their Avro forms, a struct a record named after its path. A nullable column is a union with null
first and a null default, so that a later schema adding a nullable column stays compatible in
the registry's default (backward) mode.

A type Avro cannot hold (intervals, variants, spatial types, a map with keys that are not
strings) or a name Avro refuses is a `ConfigError` naming the column's path, raised before the
query writes anything.
"""

from __future__ import annotations

import re
from typing import Any

from pyspark.sql import types as T

from bridge.errors import ConfigError

AvroSchema = dict[str, Any] | str
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_PRIMITIVES: tuple[tuple[type[T.DataType], AvroSchema], ...] = (
    (T.StringType, "string"),
    (T.CharType, "string"),
    (T.VarcharType, "string"),
    (T.BinaryType, "bytes"),
    (T.BooleanType, "boolean"),
    (T.ByteType, "int"),
    (T.ShortType, "int"),
    (T.IntegerType, "int"),
    (T.LongType, "long"),
    (T.FloatType, "float"),
    (T.DoubleType, "double"),
    (T.DateType, {"type": "int", "logicalType": "date"}),
    (T.TimestampType, {"type": "long", "logicalType": "timestamp-micros"}),
    (T.TimestampNTZType, {"type": "long", "logicalType": "local-timestamp-micros"}),
)


def avro_schema(schema: T.StructType, *, name: str, namespace: str = "") -> dict[str, Any]:
    """The Avro record schema of the rows of `schema`, named `name` (in `namespace`)."""
    problems: list[tuple[str, str]] = []
    if not _NAME.match(name):
        problems.append(("record name", f"{name!r} is not an Avro name"))
    record = _record(schema, name=name, namespace=namespace, path="", problems=problems)
    if problems:
        raise ConfigError(problems, source="the DataFrame's schema as Avro")
    return record


def _record(
    schema: T.StructType, *, name: str, namespace: str, path: str, problems: list[tuple[str, str]]
) -> dict[str, Any]:
    fields: list[dict[str, Any]] = []
    for field in schema.fields:
        where = f"{path}.{field.name}" if path else field.name
        if not _NAME.match(field.name):
            problems.append((where, f"{field.name!r} is not an Avro name (letters, digits, _)"))
            continue
        inner = namespace + "." + name if namespace else name
        avro = _type(
            field.dataType, name=field.name, namespace=inner, path=where, problems=problems
        )
        if field.nullable:
            fields.append({"name": field.name, "type": ["null", avro], "default": None})
        else:
            fields.append({"name": field.name, "type": avro})
    record: dict[str, Any] = {"type": "record", "name": name, "fields": fields}
    if namespace:
        record["namespace"] = namespace
    return record


def _type(
    data_type: T.DataType,
    *,
    name: str,
    namespace: str,
    path: str,
    problems: list[tuple[str, str]],
) -> AvroSchema:
    for spark_type, avro in _PRIMITIVES:
        if isinstance(data_type, spark_type):
            return avro
    if isinstance(data_type, T.DecimalType):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": data_type.precision,
            "scale": data_type.scale,
        }
    if isinstance(data_type, T.ArrayType):
        items = _type(data_type.elementType, name=name, namespace=namespace, path=f"{path}[]",
                      problems=problems)  # fmt: skip
        return {"type": "array", "items": ["null", items] if data_type.containsNull else items}
    if isinstance(data_type, T.MapType):
        if not isinstance(data_type.keyType, T.StringType):
            problems.append(
                (path, f"a map's keys must be strings in Avro, not {data_type.keyType}")
            )
            return "null"
        values = _type(data_type.valueType, name=name, namespace=namespace, path=f"{path}{{}}",
                       problems=problems)  # fmt: skip
        nullable = data_type.valueContainsNull
        return {"type": "map", "values": ["null", values] if nullable else values}
    if isinstance(data_type, T.StructType):
        return _record(data_type, name=name, namespace=namespace, path=path, problems=problems)
    problems.append((path, f"{data_type.simpleString()} has no Avro form; cast it or leave it out"))
    return "null"
