"""The C Avro reader fuzzed against fastavro, the reference, with random writer schemas.

- Valid bodies (fastavro-written values of random schemas) read to the values fastavro reads.
- Mutated bodies are refused with ValueError, or read to what fastavro reads from them, to
  their last byte: never another error, never a value fastavro would not give.
- Hostile schemas (fastavro accepts them: sizes, precisions and scales of any number, nesting
  of any depth) are refused when compiled, naming why, or read random bytes with ValueError as
  their only error.

`make test` runs a bounded number of examples; `make fuzz` runs the same tests many more times
against a build of the reader under AddressSanitizer and UndefinedBehaviorSanitizer
(BRIDGE_FUZZ_EXAMPLES sets how many).
"""

from __future__ import annotations

import contextlib
import io
import os
import string
from datetime import UTC, datetime
from decimal import Context, Decimal
from typing import Any

import fastavro
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.decoding.avro_program import SchemaRefused, check, compile_record

EXAMPLES = int(os.environ.get("BRIDGE_FUZZ_EXAMPLES", "1000"))
LIMIT = 4 * 1024**2  # decoded bytes a record may take here: a few MiB, so blow-ups end fast
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,  # the same examples on every machine: a failure here is seen everywhere
    derandomize=os.environ.get("BRIDGE_FUZZ_RANDOM") is None,
)
NAME = st.text(string.ascii_letters, min_size=1, max_size=6)

# -- random schemas ----------------------------------------------------------------------------

LOGICAL: list[dict[str, Any]] = [
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
]
PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "string", "bytes"]


class Names:
    """Fresh names for the named types of one schema."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"


@st.composite
def avro_types(draw: st.DrawFn, names: Names, depth: int = 0) -> Any:
    leaf = depth >= 3
    kinds = ["primitive", "logical", "decimal", "fixed", "enum"]
    kinds += [] if leaf else ["array", "map", "record", "union"]
    kind = draw(st.sampled_from(kinds))
    if kind == "primitive":
        return draw(st.sampled_from(PRIMITIVES))
    if kind == "logical":
        return dict(draw(st.sampled_from(LOGICAL)))
    if kind == "decimal":
        precision = draw(st.integers(1, 40))
        scale = draw(st.integers(0, precision))
        if draw(st.booleans()):
            return {"type": "bytes", "logicalType": "decimal", "precision": precision,
                    "scale": scale}  # fmt: skip
        size = draw(st.integers(1, 20))
        precision = min(precision, len(str(2 ** (8 * size - 1) - 1)) - 1)
        return {"type": "fixed", "name": names("Dec"), "size": size, "logicalType": "decimal",
                "precision": precision, "scale": min(scale, precision)}  # fmt: skip
    if kind == "fixed":
        return {"type": "fixed", "name": names("Fixed"), "size": draw(st.integers(0, 9))}
    if kind == "enum":
        symbols = draw(st.lists(NAME, min_size=1, max_size=5, unique=True))
        return {"type": "enum", "name": names("Enum"), "symbols": symbols}
    if kind == "array":
        return {"type": "array", "items": draw(avro_types(names, depth + 1))}
    if kind == "map":
        return {"type": "map", "values": draw(avro_types(names, depth + 1))}
    if kind == "union":  # null and one other type: a value always picks the same branch
        other = draw(avro_types(names, depth + 1).filter(lambda t: t != "null"))
        if isinstance(other, list):
            return other
        return ["null", other] if draw(st.booleans()) else [other, "null"]
    return draw(records(names, depth + 1))


@st.composite
def records(draw: st.DrawFn, names: Names, depth: int = 0) -> dict[str, Any]:
    count = draw(st.integers(0 if depth else 1, 5))
    return {
        "type": "record",
        "name": names("Rec"),
        "fields": [{"name": f"f{i}", "type": draw(avro_types(names, depth))} for i in range(count)],
    }


# -- values of a schema --------------------------------------------------------------------------


@st.composite
def values(draw: st.DrawFn, schema: Any, named: dict[str, Any]) -> Any:
    if isinstance(schema, list):
        branch = draw(st.sampled_from(schema))
        return draw(values(branch, named))
    if isinstance(schema, str):
        if schema in named:
            return draw(values(named[schema], named))
        return draw(_PRIMITIVE_VALUES[schema])
    kind, logical = schema["type"], schema.get("logicalType")
    if logical == "decimal":
        digits = 10 ** schema["precision"] - 1
        unscaled = Decimal(draw(st.integers(-digits, digits)))
        return unscaled.scaleb(-schema.get("scale", 0), _EXACT)
    if logical is not None:
        return draw(_LOGICAL_VALUES[logical])
    if kind in ("fixed", "enum", "record"):
        named[schema["name"]] = schema
    if kind == "fixed":
        return draw(st.binary(min_size=schema["size"], max_size=schema["size"]))
    if kind == "enum":
        return draw(st.sampled_from(schema["symbols"]))
    if kind == "array":
        return draw(st.lists(values(schema["items"], named), max_size=4))
    if kind == "map":
        return draw(st.dictionaries(NAME, values(schema["values"], named), max_size=4))
    if kind == "record":
        return {f["name"]: draw(values(f["type"], named)) for f in schema["fields"]}
    return draw(values(kind, named))


_EXACT = Context(prec=1000)  # the default context would round a value of 29 digits or more
_PRIMITIVE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "string": st.text(max_size=20),
    "bytes": st.binary(max_size=20),
}
_MILLIS = st.integers(0, 999).map(lambda m: m * 1000)
_LOGICAL_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "date": st.dates(),
    "time-millis": st.times().map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)),
    "time-micros": st.times(),
    "timestamp-millis": st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)),
    "timestamp-micros": st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
    "local-timestamp-millis": st.datetimes(min_value=datetime(1, 1, 2)).map(
        lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
    ),
    "local-timestamp-micros": st.datetimes(min_value=datetime(1, 1, 2)),
}


@st.composite
def schema_and_body(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    schema: dict[str, Any] = fastavro.parse_schema(draw(records(Names())))  # type: ignore[assignment]
    value = draw(values(schema, {}))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, value)
    return schema, out.getvalue()


# -- the two readers -----------------------------------------------------------------------------


def ours(schema: dict[str, Any], body: bytes) -> tuple[Any, ...]:
    names = [f["name"] for f in schema["fields"]]
    program = compile_record(schema, names, [None] * len(names), limit=LIMIT)
    (row,) = program.rows([body], 0)
    return row


def reference(schema: dict[str, Any], body: bytes) -> tuple[Any, ...] | None:
    """What fastavro reads from `body`, or None when it does not read it to its last byte."""
    stream = io.BytesIO(body)
    try:
        read: dict[str, Any] = fastavro.schemaless_reader(stream, schema, None)  # type: ignore[assignment]
    except Exception:  # noqa: BLE001 - any failure of the reference's: it does not read
        return None
    if stream.tell() != len(body):
        return None
    return tuple(read[f["name"]] for f in schema["fields"])


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 == 1.0 == True is not enough), with
    decimals of the same digits and exponent."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Decimal):
        # fastavro rounds a value of more digits than its precision (a body can hold any
        # number of digits) to that precision; the C reader keeps every digit.
        digits = len(b.as_tuple().digits)
        rounded = Context(prec=digits).create_decimal(a) if len(a.as_tuple().digits) > digits else a
        return bool(rounded.as_tuple() == b.as_tuple())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return bool(b != b)
    return bool(a == b)


# -- the properties -----------------------------------------------------------------------------


@FUZZ
@given(schema_and_body())
def test_a_valid_body_reads_as_fastavro_reads_it(case: tuple[dict[str, Any], bytes]) -> None:
    schema, body = case
    expected = reference(schema, body)
    assert expected is not None
    row = ours(schema, body)
    assert same(row, expected), (row, expected)


@FUZZ
@given(
    schema_and_body(),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    st.sampled_from(["replace", "cut", "insert"]),
)
def test_a_mutated_body_is_refused_or_read_as_fastavro_reads_it(
    case: tuple[dict[str, Any], bytes], edits: list[tuple[int, int]], how: str
) -> None:
    schema, valid = case
    body = bytearray(valid)
    for where, byte in edits:
        at = where % (len(body) + 1)
        if how == "replace" and body:
            body[at % len(body)] = byte
        elif how == "cut":
            del body[at:]
        else:
            body.insert(at, byte)
    try:
        row = ours(schema, bytes(body))
    except ValueError:
        return  # refused: the only error it may raise
    expected = reference(schema, bytes(body))
    assert expected is not None and same(row, expected), (bytes(body), row, expected)


HOSTILE_NUMBERS = st.sampled_from(
    [-(2**70), -(2**40), -35, -4, -1, 0, 1, 3.5, 17, 39, 1001, 10**9, 2**31, 2**70, "8", None]
)


@st.composite
def hostile_schemas(draw: st.DrawFn) -> Any:
    """A valid schema whose numbers are replaced by any number, or nested past any bound."""
    schema = draw(records(Names()))
    if draw(st.booleans()):
        inner: Any = "long"
        for _ in range(draw(st.integers(1, 300))):
            inner = draw(st.sampled_from([
                {"type": "array", "items": inner},
                {"type": "map", "values": inner},
                {"type": "array", "items": inner} if isinstance(inner, list) else ["null", inner],
            ]))  # fmt: skip
        schema["fields"].append({"name": "deep", "type": inner})

    def spoil(node: Any) -> None:
        if isinstance(node, list):
            for branch in node:
                spoil(branch)
        elif isinstance(node, dict):
            for key in ("size", "precision", "scale"):
                if key in node and draw(st.booleans()):
                    node[key] = draw(HOSTILE_NUMBERS)
            for child in (node.get("items"), node.get("values"), *[
                f["type"] for f in node.get("fields", [])
            ]):  # fmt: skip
                if child is not None:
                    spoil(child)

    spoil(schema)
    return schema


@FUZZ
@given(hostile_schemas(), st.binary(max_size=200))
def test_a_hostile_schema_is_refused_or_reads_with_value_error_alone(
    document: Any, body: bytes
) -> None:
    try:
        schema: dict[str, Any] = fastavro.parse_schema(document)  # type: ignore[assignment]
    except Exception:  # noqa: BLE001 - fastavro refused it: the registry cache does the same
        return
    try:
        check(schema)
    except SchemaRefused:
        return
    with contextlib.suppress(ValueError):  # the only error it may raise
        ours(schema, body)


def test_the_fuzz_reads_every_kind_of_value() -> None:
    """The strategies reach what they are meant to: each logical type, each named kind."""
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(records(Names()))
    def collect(schema: dict[str, Any]) -> None:
        def walk(node: Any) -> None:
            if isinstance(node, list):
                seen.add("union")
                for branch in node:
                    walk(branch)
            elif isinstance(node, dict):
                seen.add(node.get("logicalType") or node["type"])
                for child in (node.get("items"), node.get("values")):
                    if child is not None:
                        walk(child)
                for field in node.get("fields", []):
                    walk(field["type"])
            else:
                seen.add(node)

        walk(schema)

    collect()
    expected = {*PRIMITIVES, "union", "array", "map", "record", "enum", "fixed", "decimal"}
    expected |= {t["logicalType"] for t in LOGICAL}
    assert expected <= seen, expected - seen
