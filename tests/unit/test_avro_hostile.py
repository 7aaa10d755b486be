"""Writer schemas and bodies an attacker would send the C Avro reader, each found by fuzzing it
against fastavro under AddressSanitizer and UndefinedBehaviorSanitizer. fastavro's
`parse_schema` accepts every schema here, so the reader checks them itself: each is refused
when compiled, or each body with ValueError, within a bound on memory, and never another error.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import fastavro
import pytest

from bridge.settings import SchemaRegistrySettings
from consumers.decoding import _avro_body
from consumers.decoding.avro_program import (
    DECIMAL_BYTES,
    DECIMAL_FIXED,
    FIXED,
    SchemaRefused,
    check,
    compile_record,
)
from consumers.decoding.avro_rows import AvroRowDecoder
from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import SchemaCache
from tests.kafka_helpers import avro_long

LIMIT = 1024**2


def _record(field_type: Any) -> dict[str, Any]:
    parsed: dict[str, Any] = fastavro.parse_schema(  # type: ignore[assignment]
        {"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}
    )
    return parsed


def _read_node(node: tuple[Any, ...], body: bytes, limit: int = LIMIT) -> list[tuple[Any, ...]]:
    """The C reader alone, given a node as a schema that slipped past the compiler would make."""
    return _avro_body.decode_rows([body], 0, ((node, 0),), (None,), limit)


# -- the schema's numbers --------------------------------------------------------------------


@pytest.mark.parametrize("size", [-35, -(2**40)])
def test_a_fixed_decimal_of_negative_size_is_refused_not_read_backwards(size: int) -> None:
    """It moved the cursor back: the row held 35 bytes from before the body (an object's
    address among them), ASan's heap-buffer-overflow; at -2**40 a SIGSEGV."""
    schema = _record({"type": "fixed", "name": "D", "size": size, "logicalType": "decimal"})
    with pytest.raises(SchemaRefused, match=f"at f: a fixed's size is {size}, not a whole"):
        check(schema)
    with pytest.raises(ValueError, match="negative size"):
        _read_node((DECIMAL_FIXED, size, 0), b"\x01" * 8)


@pytest.mark.parametrize("size", [-4, 3.5, 2**70])
def test_a_fixed_of_a_size_that_is_no_size_is_refused_with_value_error(size: Any) -> None:
    """These raised SystemError."""
    schema = _record({"type": "fixed", "name": "F", "size": size})
    with pytest.raises(SchemaRefused, match=r"at f: a fixed's size is"):
        check(schema)
    if isinstance(size, int):
        with pytest.raises(ValueError):
            _read_node((FIXED, size), b"\x00" * 8)


@pytest.mark.parametrize(
    ("decimal", "why"),
    [
        ({"scale": 10**9}, "precision is None"),
        ({"precision": 0}, "precision is 0"),
        ({"precision": 10**6}, "precision is 1000000"),
    ],
)
def test_a_decimal_of_impossible_precision_or_scale_is_refused(
    decimal: dict[str, Any], why: str
) -> None:
    with pytest.raises(SchemaRefused, match=why):
        check(_record({"type": "bytes", "logicalType": "decimal", **decimal}))


def test_what_fastavro_refuses_the_reader_refuses_too() -> None:
    """Checked again here, for a schema that did not come through fastavro."""
    fixed = {"type": "fixed", "name": "D", "size": 2, "logicalType": "decimal", "precision": 5}
    with pytest.raises(SchemaRefused, match="precision 5 does not fit a fixed of 2 bytes"):
        check(fixed)
    check({**fixed, "precision": 4})  # 32767 has 5 digits, but not every 5-digit value fits
    with pytest.raises(SchemaRefused, match="scale is 6, not a whole number from 0 to 5"):
        check({"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 6})
    with pytest.raises(SchemaRefused, match=r"scale is 2\.5"):
        check({"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2.5})


def test_a_decimal_of_huge_scale_is_refused_within_the_budget_not_after_it() -> None:
    """Scale 1e9 took 6 s and 1.9 GB for one value."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="more than 1048576 bytes"):
            _read_node((DECIMAL_BYTES, 10**9), b"\x02\x01")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * LIMIT


def test_an_enum_and_a_union_are_bounded() -> None:
    with pytest.raises(SchemaRefused, match="an enum needs 1 to 65536 symbols, has 0"):
        check({"type": "enum", "name": "E", "symbols": []})
    with pytest.raises(SchemaRefused, match="a union of 1025 branches"):
        check(_record([{"type": "fixed", "name": f"F{i}", "size": 1} for i in range(1025)]))


# -- nesting ---------------------------------------------------------------------------------


def test_a_body_nested_past_the_bound_is_refused_with_value_error_not_recursion_error() -> None:
    """A recursive schema with a body 500 levels deep raised RecursionError, which escaped the
    decoder's `decode` and `decode_all`."""
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]},
    ]}  # fmt: skip
    schema = _record(node)
    program = compile_record(schema, ["f"], [None], limit=LIMIT)
    body = b"\x02" * 500 + b"\x00"  # 500 times the Node branch, then null
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        program.rows([body], 0)
    shallow = b"\x02" * 30 + b"\x00"
    assert program.rows([shallow], 0)[0][0] is not None


def test_a_schema_nested_past_the_bound_is_refused() -> None:
    deep: Any = "long"
    for _ in range(70):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaRefused, match="nested deeper than 64 levels"):
        check(_record(deep))


# -- bodies that expand ----------------------------------------------------------------------


def _expands(program_rows: Any) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="decodes to more than 1048576 bytes"):
            program_rows()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * LIMIT, peak


def test_an_array_of_nulls_is_bounded_by_the_decoded_size() -> None:
    """1,361 bytes made 356 million items (about 2.9 GB)."""
    body = (avro_long(2**20) * 340) + b"\x00"
    program = compile_record(
        _record({"type": "array", "items": "null"}), ["f"], [None], limit=LIMIT
    )
    _expands(lambda: program.rows([body], 0))


def test_arrays_of_empty_records_are_bounded_by_the_decoded_size() -> None:
    """5,972 bytes made 5.9 million dicts."""
    empty = {"type": "record", "name": "E", "fields": []}
    schema = _record({"type": "array", "items": {"type": "array", "items": empty}})
    inner = avro_long(100_000) + b"\x00"
    body = avro_long(2_000) + inner * 2_000 + b"\x00"
    program = compile_record(schema, ["f"], [None], limit=LIMIT)
    _expands(lambda: program.rows([body], 0))


def test_a_record_past_the_limit_is_a_record_error_naming_the_limit() -> None:
    """Through the route's decoder, as the consumer reads it: a dead letter, never a crash."""
    cache = SchemaCache(
        SchemaRegistrySettings(url="http://127.0.0.1:9/apis/ccompat/v7"), max_decoded_bytes=LIMIT
    )
    cache.schemas[7] = _record({"type": "array", "items": "null"})
    cache.types[7] = "AVRO"
    decoder = AvroRowDecoder(["f"], schemas=cache)
    value = b"\x00" + (7).to_bytes(4, "big") + avro_long(2**20) * 340 + b"\x00"
    with pytest.raises(RecordError, match=r"consumer\.max_decoded_record_bytes"):
        decoder.decode(value)
    assert decoder.decode_all([value]) is None
    cache.close()
