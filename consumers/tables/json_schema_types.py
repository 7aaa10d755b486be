"""The one place that knows a JSON Schema's properties as PostgreSQL columns.

A `json-schema` route with `auto_create` or `auto_evolve` follows its writer schemas as an Avro
route does (`consumers.tables.table_types`): an object schema's properties become columns, in
the order the schema lists them. The types agree with what bridge's sink writes
(`spark_jobs.json_schema`: Spark's `to_json` of each row) and with how the JSON reader lands a
value (docs/typed-records.md):

| JSON Schema | column |
|---|---|
| `boolean` | `boolean` |
| `integer` (its `minimum`/`maximum` within 16, 32 or 64 bits) | `smallint` / `integer` / `bigint` |
| `integer` without bounds | `bigint`, as Kafka Connect's JSON Schema converter reads it |
| `number` | `numeric`: every digit the text has (a decimal's as well as a double's) |
| `string` | `text` |
| `string`, `format` `date` / `date-time` / `uuid` | `date` / `timestamptz` / `uuid` |
| `string`, `contentEncoding` `base64` | `bytea` |
| `array` of one scalar type | an array column (`text[]`, `bigint[]`, ...) |
| `object`, an array of anything else | `jsonb` |
| several types, or no type at all | `text`: each value as its text |

A property may be null when its type allows `null` (`["string", "null"]`, a `oneOf`/`anyOf`
with a `{"type": "null"}` branch) or when `required` does not list it. Local references
(`#/definitions/...`, `#/$defs/...`) are followed.

A registry's schema is outside input: `json_schema_columns` never raises. It reads no deeper
than `_MAX_DEPTH` (a deeper property, or a reference that loops, is `jsonb`), and leaves out a
property whose name cannot be a column (empty, longer than PostgreSQL's 63 bytes, holding a
NUL), which the planner then reports as a field no column takes.
"""

from __future__ import annotations

from typing import Any

from consumers.tables.table_types import FieldColumn

_MAX_DEPTH = 32
_MAX_NODES = 10_000  # schema nodes looked at, in all: branches that refer to each other twice
_MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: a longer name is cut short
_JSON = ("jsonb", "U")
_TEXT = ("text", "S")
_FORMATS = {
    "date": ("date", "D"),
    "date-time": ("timestamp with time zone", "D"),
    "uuid": ("uuid", "U"),
}
_INTEGERS = (
    (-(2**15), 2**15 - 1, ("smallint", "N")),
    (-(2**31), 2**31 - 1, ("integer", "N")),
    (-(2**63), 2**63 - 1, ("bigint", "N")),
)


def json_schema_columns(schema: Any) -> list[FieldColumn] | None:
    """The columns of an object schema, in property order; None for a schema that is not an
    object with properties (its records cannot be rows of a followed table)."""
    return _Reader(schema).columns()


class _Reader:
    def __init__(self, root: Any) -> None:
        self._root = root
        self._left = _MAX_NODES

    def columns(self) -> list[FieldColumn] | None:
        top = self._resolved(self._root, 0)
        if not isinstance(top, dict):
            return None
        properties = top.get("properties")
        if not isinstance(properties, dict) or self._types(top, 0) not in ({"object"}, set()):
            return None
        required = top.get("required")
        listed = {r for r in required if isinstance(r, str)} if isinstance(required, list) else ()
        columns = []
        for name, spec in properties.items():
            if not _usable(name):
                continue
            may_be_null, (sql_type, kind) = self._column_type(spec, 1)
            has_default = isinstance(spec, dict) and "default" in spec
            columns.append(
                FieldColumn(name, sql_type, kind, may_be_null or name not in listed, has_default)
            )
        return columns

    def _spent(self, depth: int) -> bool:
        """One more node looked at; whether the bounds are passed."""
        self._left -= 1
        return self._left < 0 or depth > _MAX_DEPTH

    def _resolved(self, spec: Any, depth: int) -> Any:
        """`spec`, or what its local `$ref` points at (None past the bounds, or when it points
        nowhere)."""
        while isinstance(spec, dict) and isinstance(spec.get("$ref"), str):
            if self._spent(depth):
                return None
            spec = _pointed(spec["$ref"], self._root)
            depth += 1
        return spec

    def _branches(self, spec: dict[str, Any], depth: int) -> list[Any]:
        found = []
        for key in ("oneOf", "anyOf"):
            branches = spec.get(key)
            if isinstance(branches, list):
                found += [self._resolved(branch, depth + 1) for branch in branches]
        return found

    def _types(self, spec: dict[str, Any], depth: int) -> set[str]:
        """The JSON types `spec` allows, from `type` or its `oneOf`/`anyOf` branches; empty or
        with "any": any."""
        declared = spec.get("type")
        if isinstance(declared, str):
            return {declared}
        if isinstance(declared, list):
            return {t for t in declared if isinstance(t, str)}
        found: set[str] = set()
        for branch in self._branches(spec, depth):
            if not isinstance(branch, dict) or self._spent(depth):
                return {"any"}
            found |= self._types(branch, depth + 1) or {"any"}
        return found

    def _column_type(self, spec: Any, depth: int) -> tuple[bool, tuple[str, str]]:
        """Whether a property may be null, and its column type and kind."""
        spec = self._resolved(spec, depth)
        if not isinstance(spec, dict) or self._spent(depth):
            return True, _JSON
        types = self._types(spec, depth)
        may_be_null = "null" in types
        kinds = types - {"null"}
        if len(kinds) != 1 or "any" in kinds:
            return may_be_null, _TEXT
        (kind,) = kinds
        return may_be_null, self._value_type(kind, self._branch(spec, kind, depth), depth)

    def _branch(self, spec: dict[str, Any], kind: str, depth: int) -> dict[str, Any]:
        """The part of `spec` that describes values of `kind`: a `oneOf`/`anyOf` branch (Spark's
        nullable columns are `{"oneOf": [{"type": "null"}, <the type>]}`), or `spec` itself."""
        if spec.get("type") is not None:
            return spec
        for branch in self._branches(spec, depth):
            if isinstance(branch, dict) and kind in self._types(branch, depth + 1):
                return branch
        return spec

    def _value_type(self, kind: str, spec: dict[str, Any], depth: int) -> tuple[str, str]:
        if kind == "boolean":
            return "boolean", "B"
        if kind == "integer":
            return _integer(spec.get("minimum"), spec.get("maximum"))
        if kind == "number":
            return "numeric", "N"
        if kind == "string":
            if spec.get("contentEncoding") == "base64":
                return "bytea", "U"
            return _FORMATS.get(str(spec.get("format")), _TEXT)
        if kind == "array":
            _, (item_type, item_kind) = self._column_type(spec.get("items", {}), depth + 1)
            # A PostgreSQL array holds scalars; arrays of arrays, objects or base64 are JSON.
            if item_kind != "A" and item_type not in ("jsonb", "bytea"):
                return f"{item_type}[]", "A"
            return _JSON
        if kind == "object":
            return _JSON
        return _TEXT  # "null" alone, or a type JSON Schema does not have


def _usable(name: str) -> bool:
    return 0 < len(name.encode("utf-8", "replace")) <= _MAX_IDENTIFIER_BYTES and "\0" not in name


def _pointed(ref: str, root: Any) -> Any:
    if not ref.startswith("#"):
        return None  # another document's: not followed
    node = root
    for token in ref[1:].split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or token not in node:
            return None
        node = node[token]
    return node


def _integer(low: Any, high: Any) -> tuple[str, str]:
    if not all(isinstance(b, int | float) and not isinstance(b, bool) for b in (low, high)):
        return "bigint", "N"
    for smallest, largest, column in _INTEGERS:
        if smallest <= low and high <= largest:
            return column
    return "numeric", "N"  # beyond 64 bits, or bounds that are not numbers (NaN)
