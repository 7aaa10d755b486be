"""A writer schema compiled into the nodes `consumers.decoding._avro_body` reads a body by.

A node is a tuple whose first item is an opcode (the table below, kept in step with the C
module's). A named type met again is the same node, so a recursive record is a cycle, which the
C reader follows like any other record. A logical type is read as such where fastavro reads it
(`fastavro.read.LOGICAL_READERS`), and as its underlying type otherwise, as the Avro
specification says of a logical type a reader does not know.

A writer schema is outside input: its numbers (a fixed's size, a decimal's precision and scale,
how many symbols and branches) and its nesting are checked here, and a schema that fails is
refused with SchemaRefused naming where. A decimal whose precision or scale is invalid is refused
rather than read as its underlying type (the specification's fallback): read as bytes, its
values would land in a numeric column as something else than the writer meant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from consumers.decoding import _avro_body

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


MAX_DECIMAL_PRECISION = 1000  # PostgreSQL's numeric(p, s) takes no more
MAX_ENUM_SYMBOLS = 65_536
MAX_UNION_BRANCHES = 1_024
MAX_FIXED_SIZE = 2**31 - 1
MAX_DEPTH = _avro_body.MAX_DEPTH  # the reader's bound on nesting, also the schema's


class SchemaRefused(ValueError):
    """A writer schema whose numbers or nesting the reader will not take; says where."""


class Program(NamedTuple):
    """A record schema read into rows of a table's columns."""

    fields: tuple[tuple[Node, int], ...]  # each field's node and its column (-1: none)
    template: tuple[Any, ...]  # a row before its fields are read: what an absent column holds
    limit: int  # the decoded bytes a value may take (consumer.max_decoded_record_bytes)

    def rows(self, values: list[bytes], skip: int) -> list[tuple[Any, ...]]:
        """Each value's body after `skip` bytes as a row; ValueError names what does not read."""
        return _avro_body.decode_rows(values, skip, self.fields, self.template, self.limit)


def compile_record(
    schema: dict[str, Any], columns: Sequence[str], absent: Sequence[Any], *, limit: int
) -> Program:
    """`schema` (a record, as fastavro parses it) read into rows of `columns`: each column a
    field of that name, else `absent[i]`. SchemaRefused names what the reader will not take."""
    record = node(schema, {})
    names, fields = record[1], record[2]
    position = {column: i for i, column in enumerate(columns)}
    return Program(
        fields=tuple(
            (field, position.get(name, -1)) for name, field in zip(names, fields, strict=True)
        ),
        template=tuple(absent),
        limit=limit,
    )


def check(schema: Any) -> None:
    """SchemaRefused when `schema` (as fastavro parses it) carries a number the reader will not
    take: fastavro accepts a fixed of negative or fractional size and decimals of any scale."""
    node(schema, {})


def node(schema: Any, named: dict[str, Node], depth: int = 0, at: str = "") -> Node:
    """The node that reads `schema`; `named` holds the named types defined so far. `depth`
    counts the unions, arrays, maps and records around it; `at` is its path, for errors."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return (_PRIMITIVES[schema],)
        if schema not in named:
            raise SchemaRefused(f"{_where(at)}the type {schema!r} is not defined before it")
        return named[schema]
    nested = isinstance(schema, list) or (
        isinstance(schema, dict) and schema.get("type") in ("record", "error", "array", "map")
    )
    if nested and at and depth >= MAX_DEPTH:  # the top record's fields are read at depth 0
        raise SchemaRefused(f"{_where(at)}types nested deeper than {MAX_DEPTH} levels")
    inner = depth + 1 if at else depth
    if isinstance(schema, list):
        if len(schema) > MAX_UNION_BRANCHES:
            raise SchemaRefused(
                f"{_where(at)}a union of {len(schema)} branches (at most {MAX_UNION_BRANCHES})"
            )
        return (UNION, tuple(node(b, named, inner, f"{at}[{i}]") for i, b in enumerate(schema)))
    if not isinstance(schema, dict):
        raise SchemaRefused(f"{_where(at)}{schema!r} is not an Avro type")
    kind: Any = schema.get("type")
    if kind in ("record", "error"):
        fields: list[Node] = []  # filled after the record is named: a field may refer to it
        record = (RECORD, tuple(f["name"] for f in schema["fields"]), fields)
        named[schema["name"]] = record
        fields.extend(
            node(f["type"], named, inner, f"{at}.{f['name']}" if at else str(f["name"]))
            for f in schema["fields"]
        )
        return record
    if kind == "enum":
        symbols = schema.get("symbols")
        if not isinstance(symbols, list) or not 0 < len(symbols) <= MAX_ENUM_SYMBOLS:
            raise SchemaRefused(
                f"{_where(at)}an enum needs 1 to {MAX_ENUM_SYMBOLS} symbols, has "
                f"{len(symbols) if isinstance(symbols, list) else repr(symbols)}"
            )
        named[schema["name"]] = (ENUM, tuple(symbols))
        return named[schema["name"]]
    if kind == "fixed":
        size = _whole(schema.get("size"), 0, MAX_FIXED_SIZE, f"{_where(at)}a fixed's size")
        if schema.get("logicalType") == "decimal":
            precision, scale = _precision_and_scale(schema, at)
            if precision > _fixed_digits(size):
                raise SchemaRefused(
                    f"{_where(at)}a decimal of precision {precision} does not fit a fixed of "
                    f"{size} bytes"
                )
            fixed: Node = (DECIMAL_FIXED, size, scale)
        else:
            fixed = (FIXED, size)
        named[schema["name"]] = fixed
        return fixed
    if kind == "array":
        return (ARRAY, node(schema["items"], named, inner, f"{at}[]"))
    if kind == "map":
        return (MAP, node(schema["values"], named, inner, f"{at}{{}}"))
    logical: Any = schema.get("logicalType")
    if kind == "bytes" and logical == "decimal":
        return (DECIMAL_BYTES, _precision_and_scale(schema, at)[1])
    if (kind, logical) in _LOGICAL:
        return (_LOGICAL[kind, logical],)
    return node(kind, named, depth, at)  # a primitive in its long form, or a named type's name


def _precision_and_scale(schema: dict[str, Any], at: str) -> tuple[int, int]:
    where = _where(at)
    precision = _whole(
        schema.get("precision"), 1, MAX_DECIMAL_PRECISION, f"{where}a decimal's precision"
    )
    scale = _whole(schema.get("scale", 0), 0, precision, f"{where}a decimal's scale")
    return precision, scale


def _whole(value: Any, low: int, high: int, what: str) -> int:
    if type(value) is not int or not low <= value <= high:
        raise SchemaRefused(f"{what} is {value!r}, not a whole number from {low} to {high}")
    return value


def _fixed_digits(size: int) -> int:
    """The most decimal digits a signed `size`-byte two's-complement value always holds."""
    if size == 0:
        return 0
    if size * 8 > 4 * MAX_DECIMAL_PRECISION:  # far more digits than any precision allowed
        return MAX_DECIMAL_PRECISION
    return len(str(2 ** (8 * size - 1) - 1)) - 1


def _where(at: str) -> str:
    return f"at {at}: " if at else ""
