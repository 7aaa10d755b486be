"""A writer schema compiled into the nodes `consumers._avro_body` reads a body by.

A node is a tuple whose first item is an opcode (the table below, kept in step with the C
module's). A named type met again is the same node, so a recursive record is a cycle, which the
C reader follows like any other record. A logical type is read as such where fastavro reads it
(`fastavro.read.LOGICAL_READERS`), and as its underlying type otherwise, as the Avro
specification says of a logical type a reader does not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from consumers import _avro_body

Node = tuple[Any, ...]

NULL, BOOLEAN, INT, LONG, FLOAT, DOUBLE, STRING, BYTES, FIXED, ENUM = range(10)
UNION, ARRAY, MAP, RECORD, DECIMAL_BYTES, DECIMAL_FIXED, DATE = range(10, 17)
TIME_MILLIS, TIME_MICROS, TIMESTAMP_MILLIS, TIMESTAMP_MICROS = range(17, 21)
LOCAL_TIMESTAMP_MILLIS, LOCAL_TIMESTAMP_MICROS = range(21, 23)

_PRIMITIVES = {"null": NULL, "boolean": BOOLEAN, "int": INT, "long": LONG, "float": FLOAT,
               "double": DOUBLE, "string": STRING, "bytes": BYTES}  # fmt: skip
_LOGICAL = {
    ("int", "date"): DATE,
    ("int", "time-millis"): TIME_MILLIS,
    ("long", "time-micros"): TIME_MICROS,
    ("long", "timestamp-millis"): TIMESTAMP_MILLIS,
    ("long", "timestamp-micros"): TIMESTAMP_MICROS,
    ("long", "local-timestamp-millis"): LOCAL_TIMESTAMP_MILLIS,
    ("long", "local-timestamp-micros"): LOCAL_TIMESTAMP_MICROS,
    ("string", "uuid"): STRING,  # the text as it is: the column's type judges it
}


class Program(NamedTuple):
    """A record schema read into rows of a table's columns."""

    fields: tuple[tuple[Node, int], ...]  # each field's node and its column (-1: none)
    template: tuple[Any, ...]  # a row before its fields are read: what an absent column holds

    def rows(self, values: list[bytes], skip: int) -> list[tuple[Any, ...]]:
        """Each value's body after `skip` bytes as a row; ValueError names what does not read."""
        return _avro_body.decode_rows(values, skip, self.fields, self.template)


def compile_record(
    schema: dict[str, Any], columns: Sequence[str], absent: Sequence[Any]
) -> Program:
    """`schema` (a record, as fastavro parses it) read into rows of `columns`: each column a
    field of that name, else `absent[i]`."""
    record = node(schema, {})
    names, fields = record[1], record[2]
    position = {column: i for i, column in enumerate(columns)}
    return Program(
        fields=tuple(
            (field, position.get(name, -1)) for name, field in zip(names, fields, strict=True)
        ),
        template=tuple(absent),
    )


def node(schema: Any, named: dict[str, Node]) -> Node:
    """The node that reads `schema`; `named` holds the named types defined so far."""
    if isinstance(schema, str):
        return (_PRIMITIVES[schema],) if schema in _PRIMITIVES else named[schema]
    if isinstance(schema, list):
        return (UNION, tuple(node(branch, named) for branch in schema))
    kind = schema["type"]
    if kind in ("record", "error"):
        fields: list[Node] = []  # filled after the record is named: a field may refer to it
        record = (RECORD, tuple(f["name"] for f in schema["fields"]), fields)
        named[schema["name"]] = record
        fields.extend(node(f["type"], named) for f in schema["fields"])
        return record
    if kind == "enum":
        named[schema["name"]] = (ENUM, tuple(schema["symbols"]))
        return named[schema["name"]]
    if kind == "fixed":
        if schema.get("logicalType") == "decimal":
            fixed: Node = (DECIMAL_FIXED, schema["size"], schema.get("scale", 0))
        else:
            fixed = (FIXED, schema["size"])
        named[schema["name"]] = fixed
        return fixed
    if kind == "array":
        return (ARRAY, node(schema["items"], named))
    if kind == "map":
        return (MAP, node(schema["values"], named))
    logical = schema.get("logicalType")
    if kind == "bytes" and logical == "decimal":
        return (DECIMAL_BYTES, schema.get("scale", 0))
    if (kind, logical) in _LOGICAL:
        return (_LOGICAL[kind, logical],)
    return node(kind, named)  # a primitive in its long form, or a named type's name
