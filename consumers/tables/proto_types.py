"""The one place that knows a Protobuf message's fields as PostgreSQL columns.

A `protobuf` route with `auto_create` or `auto_evolve` follows its writer schemas as an Avro
route does (`consumers.tables.table_types`): the fields of the message its records are (their
message indexes choose it) become columns, in the order the message declares them. Each type
is the column its values land in exactly, by the reader's rules
(`consumers.decoding.proto_schemas`; docs/typed-records.md has both tables):

| Protobuf | column |
|---|---|
| `int32`, `sint32`, `sfixed32` | `integer` |
| `uint32`, `fixed32`, `int64`, `sint64`, `sfixed64` | `bigint` |
| `uint64`, `fixed64` | `numeric(20,0)`: up to 2**64-1, which no bigint holds |
| `float`, `double` | `real`, `double precision` |
| `bool`, `string`, `bytes` | `boolean`, `text`, `bytea` |
| an enum | `text`: its value's name |
| `google.protobuf.Timestamp`, `Duration` | `timestamp with time zone`, `interval` |
| a wrapper (`Int64Value`, ...) | its value's column, nullable |
| `repeated` of any of the above | an array column (`text[]`, `bigint[]`, ...) |
| a nested message, a map, `Struct`/`Value`/`ListValue`, `repeated` of messages | `jsonb` |

A field that has presence (proto3 `optional`, a message, a oneof's member) may be NULL; a plain
proto3 scalar and a `repeated` field never are (absent reads as the default, or as an empty
array), so they are NOT NULL columns when a table is created, and have a default in the
schema's sense: a table can gain them (as nullable columns, rows before them NULL).

A field whose name cannot be a column (longer than PostgreSQL's 63 bytes) is left out, and the
planner reports it as a field no column takes.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from consumers.tables.table_types import FieldColumn

_MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: a longer name is cut short
_JSON = ("jsonb", "U")
_INTEGER = ("integer", "N")
_BIGINT = ("bigint", "N")
_UNSIGNED_64 = ("numeric(20,0)", "N")
_SCALARS = {
    FieldDescriptor.TYPE_INT32: _INTEGER,
    FieldDescriptor.TYPE_SINT32: _INTEGER,
    FieldDescriptor.TYPE_SFIXED32: _INTEGER,
    FieldDescriptor.TYPE_UINT32: _BIGINT,
    FieldDescriptor.TYPE_FIXED32: _BIGINT,
    FieldDescriptor.TYPE_INT64: _BIGINT,
    FieldDescriptor.TYPE_SINT64: _BIGINT,
    FieldDescriptor.TYPE_SFIXED64: _BIGINT,
    FieldDescriptor.TYPE_UINT64: _UNSIGNED_64,
    FieldDescriptor.TYPE_FIXED64: _UNSIGNED_64,
    FieldDescriptor.TYPE_FLOAT: ("real", "N"),
    FieldDescriptor.TYPE_DOUBLE: ("double precision", "N"),
    FieldDescriptor.TYPE_BOOL: ("boolean", "B"),
    FieldDescriptor.TYPE_STRING: ("text", "S"),
    FieldDescriptor.TYPE_BYTES: ("bytea", "U"),
    FieldDescriptor.TYPE_ENUM: ("text", "S"),
}
_WELL_KNOWN = {
    "google.protobuf.Timestamp": ("timestamp with time zone", "D"),
    "google.protobuf.Duration": ("interval", "T"),
    "google.protobuf.DoubleValue": ("double precision", "N"),
    "google.protobuf.FloatValue": ("real", "N"),
    "google.protobuf.Int64Value": _BIGINT,
    "google.protobuf.UInt64Value": _UNSIGNED_64,
    "google.protobuf.Int32Value": _INTEGER,
    "google.protobuf.UInt32Value": _BIGINT,
    "google.protobuf.BoolValue": ("boolean", "B"),
    "google.protobuf.StringValue": ("text", "S"),
    "google.protobuf.BytesValue": ("bytea", "U"),
}


def proto_columns(message: Descriptor) -> list[FieldColumn]:
    """The columns of `message`'s fields, in the order it declares them."""
    columns = []
    for field in message.fields:
        if len(field.name.encode()) > _MAX_IDENTIFIER_BYTES:
            continue
        sql_type, kind = _column_type(field)
        nullable = field.has_presence and not field.is_repeated
        columns.append(FieldColumn(field.name, sql_type, kind, nullable, has_default=True))
    return columns


def _column_type(field: FieldDescriptor) -> tuple[str, str]:
    single = _single_type(field)
    if not field.is_repeated or (field.message_type is not None and _is_map(field.message_type)):
        return single
    if single == _JSON:
        return _JSON
    return f"{single[0]}[]", "A"


def _single_type(field: FieldDescriptor) -> tuple[str, str]:
    message = field.message_type
    if message is None:
        return _SCALARS[field.type]
    return _WELL_KNOWN.get(message.full_name, _JSON)


def _is_map(message: Descriptor) -> bool:
    return bool(message.GetOptions().map_entry)
