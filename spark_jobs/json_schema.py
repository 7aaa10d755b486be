"""A DataFrame's schema as a JSON Schema, the one a `json-schema` topic's values are written with.

The values themselves are Spark's `to_json` of the row, with `TO_JSON_OPTIONS`: timestamps with
every microsecond (Spark's default format keeps milliseconds only) and their offset, decimals as
JSON numbers with every digit, binary as base64. The schema says so (docs/typed-records.md has
the table): integers `integer`, fractions and decimals `number`, `date`/`timestamp` strings of
the `date`/`date-time` formats, binary a base64 string, arrays, maps (string keys) and structs
their JSON forms; a nullable column also allows null. Objects allow no other properties, so
that a registry's compatibility rules see a removed or renamed field.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T

from bridge.errors import ConfigError

DRAFT = "http://json-schema.org/draft-07/schema#"
# What `to_json` is given, so that the text holds what the schema says: microseconds, offsets.
TO_JSON_OPTIONS = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
    "ignoreNullFields": "false",  # a null column is written as null, not left out
}

_PRIMITIVES: tuple[tuple[type[T.DataType], dict[str, Any]], ...] = (
    (T.StringType, {"type": "string"}),
    (T.CharType, {"type": "string"}),
    (T.VarcharType, {"type": "string"}),
    (T.BinaryType, {"type": "string", "contentEncoding": "base64"}),
    (T.BooleanType, {"type": "boolean"}),
    (T.ByteType, {"type": "integer", "minimum": -(2**7), "maximum": 2**7 - 1}),
    (T.ShortType, {"type": "integer", "minimum": -(2**15), "maximum": 2**15 - 1}),
    (T.IntegerType, {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}),
    (T.LongType, {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}),
    (T.FloatType, {"type": "number"}),
    (T.DoubleType, {"type": "number"}),
    (T.DecimalType, {"type": "number"}),
    (T.DateType, {"type": "string", "format": "date"}),
    (T.TimestampType, {"type": "string", "format": "date-time"}),
    (T.TimestampNTZType, {"type": "string"}),  # no offset: not an RFC 3339 date-time
)


def json_schema(schema: T.StructType, *, title: str) -> dict[str, Any]:
    """The JSON Schema of the rows of `schema`, titled `title`."""
    problems: list[tuple[str, str]] = []
    document = {"$schema": DRAFT, "title": title, **_object(schema, "", problems)}
    if problems:
        raise ConfigError(problems, source="the DataFrame's schema as JSON Schema")
    return document


def _object(schema: T.StructType, path: str, problems: list[tuple[str, str]]) -> dict[str, Any]:
    properties = {}
    for field in schema.fields:
        where = f"{path}.{field.name}" if path else field.name
        properties[field.name] = _nullable(
            _type(field.dataType, where, problems), nullable=field.nullable
        )
    return {
        "type": "object",
        "properties": properties,
        "required": [field.name for field in schema.fields],  # to_json writes every one
        "additionalProperties": False,
    }


def _nullable(json_type: dict[str, Any], *, nullable: bool) -> dict[str, Any]:
    if not nullable:
        return json_type
    return {"oneOf": [{"type": "null"}, json_type]}


def _type(data_type: T.DataType, path: str, problems: list[tuple[str, str]]) -> dict[str, Any]:
    for spark_type, json_type in _PRIMITIVES:
        if isinstance(data_type, spark_type):
            return dict(json_type)
    if isinstance(data_type, T.ArrayType):
        items = _type(data_type.elementType, f"{path}[]", problems)
        return {"type": "array", "items": _nullable(items, nullable=data_type.containsNull)}
    if isinstance(data_type, T.MapType):
        if not isinstance(data_type.keyType, T.StringType):
            problems.append(
                (path, f"a map's keys must be strings in JSON, not {data_type.keyType}")
            )
            return {}
        values = _type(data_type.valueType, f"{path}{{}}", problems)
        nullable = data_type.valueContainsNull
        return {"type": "object", "additionalProperties": _nullable(values, nullable=nullable)}
    if isinstance(data_type, T.StructType):
        return _object(data_type, path, problems)
    problems.append((path, f"{data_type.simpleString()} has no JSON Schema form here; cast it"))
    return {}
