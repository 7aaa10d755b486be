"""The one place that knows an Avro record's fields as PostgreSQL columns.

Each field maps to the column type its values land in exactly (docs/table-evolution.md has the
table), and to that type's kind: PostgreSQL's own type category (`pg_type.typcategory`: S text,
N numeric, D date and time, B boolean, A array, U the rest). A table's column and a schema's
field go together when they are of one kind, and, where the kind is U or A, of one type (bytea,
uuid, jsonb, an array of one element kind); a narrower column than the field's type (a varchar,
an integer for a long) is the table owner's choice, which PostgreSQL checks value by value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from consumers.decoding.debezium_time import DEBEZIUM_TEXT_TYPES


@dataclass(frozen=True)
class FieldColumn:
    name: str
    sql_type: str  # as PostgreSQL's format_type() spells it: `numeric(12,2)`, `text[]`
    kind: str  # pg_type.typcategory of sql_type
    nullable: bool  # a union with null
    has_default: bool  # the field has a default in the schema

    @property
    def required(self) -> bool:
        """A table cannot gain it as a column of its existing rows: not null, no default."""
        return not self.nullable and not self.has_default


_PRIMITIVE = {
    "boolean": ("boolean", "B"),
    "int": ("integer", "N"),
    "long": ("bigint", "N"),
    "float": ("real", "N"),
    "double": ("double precision", "N"),
    "string": ("text", "S"),
    "bytes": ("bytea", "U"),
    "null": ("text", "S"),
}
_LOGICAL = {
    ("int", "date"): ("date", "D"),
    ("int", "time-millis"): ("time without time zone", "D"),
    ("long", "time-micros"): ("time without time zone", "D"),
    ("long", "timestamp-millis"): ("timestamp with time zone", "D"),
    ("long", "timestamp-micros"): ("timestamp with time zone", "D"),
    ("long", "local-timestamp-millis"): ("timestamp without time zone", "D"),
    ("long", "local-timestamp-micros"): ("timestamp without time zone", "D"),
    ("string", "uuid"): ("uuid", "U"),
}
_JSON = ("jsonb", "U")
_TEXT = ("text", "S")  # a union of several kinds: each value as its text


def field_columns(schema: dict[str, Any]) -> list[FieldColumn]:
    """The columns of a record schema (as fastavro parses it), in field order."""
    named: dict[str, Any] = {}
    _collect(schema, named)
    columns = []
    for f in schema["fields"]:
        nullable, (sql_type, kind) = _column_type(f["type"], named)
        columns.append(FieldColumn(f["name"], sql_type, kind, nullable, "default" in f))
    return columns


def _collect(schema: Any, named: dict[str, Any]) -> None:
    """Every named type defined in `schema`, by full name (fastavro's parsed form names them)."""
    if isinstance(schema, list):
        for branch in schema:
            _collect(branch, named)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "error", "enum", "fixed") and "name" in schema:
            named.setdefault(schema["name"], schema)
        for f in schema.get("fields", ()):
            _collect(f["type"], named)
        for key in ("items", "values"):
            if key in schema:
                _collect(schema[key], named)


def _column_type(avro: Any, named: dict[str, Any]) -> tuple[bool, tuple[str, str]]:
    """Whether the field may be null, and its column type and kind."""
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        nullable = len(branches) < len(avro)
        if len(branches) == 1:
            return nullable, _value_type(branches[0], named)
        return nullable, _TEXT
    return avro == "null", _value_type(avro, named)


def _value_type(avro: Any, named: dict[str, Any]) -> tuple[str, str]:
    if isinstance(avro, str):
        if avro in _PRIMITIVE:
            return _PRIMITIVE[avro]
        return _value_type(named[avro], named)
    kind = avro["type"]
    if isinstance(kind, list | dict) or (kind not in _PRIMITIVE and kind in named):
        return _value_type(kind, named)  # {"type": <a type>}: that type
    if kind == "string" and avro.get("connect.name") in DEBEZIUM_TEXT_TYPES:
        return DEBEZIUM_TEXT_TYPES[avro["connect.name"]]
    logical = avro.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return f"numeric({avro['precision']},{avro.get('scale', 0)})", "N"
    if (kind, logical) in _LOGICAL:
        return _LOGICAL[kind, logical]
    if kind in ("record", "error", "map"):
        return _JSON
    if kind == "enum":
        return _TEXT
    if kind == "fixed":
        return "bytea", "U"
    if kind == "array":
        _, (item_type, item_kind) = _column_type(avro["items"], named)
        # A PostgreSQL array holds scalars; arrays of arrays, records or mixed unions are JSON.
        items = avro["items"]
        scalar = not (isinstance(items, list) and len([b for b in items if b != "null"]) > 1)
        if scalar and item_kind != "A" and (item_type, item_kind) != _JSON:
            return f"{item_type}[]", "A"
        return _JSON
    return _PRIMITIVE[kind]
