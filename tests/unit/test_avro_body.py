"""The consumer's C Avro reader against fastavro, the reference: every Avro type and logical
type read to the same values, and every malformed body refused with a ValueError that names
what is wrong, never read wrong and never a crash."""

from __future__ import annotations

import io
import random
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from consumers.decoding.avro_program import compile_record

NODE = {"type": "record", "name": "Node", "fields": [
    {"name": "value", "type": "long"},
    {"name": "next", "type": ["null", "Node"]},
]}  # fmt: skip
EVERY_TYPE: dict[str, Any] = fastavro.parse_schema(  # type: ignore[assignment]
    {
        "type": "record",
        "name": "Every",
        "namespace": "test",
        "fields": [
            {"name": "nothing", "type": "null"},
            {"name": "flag", "type": "boolean"},
            {"name": "small", "type": "int"},
            {"name": "big", "type": "long"},
            {"name": "single", "type": "float"},
            {"name": "double", "type": "double"},
            {"name": "text", "type": "string"},
            {"name": "raw", "type": "bytes"},
            {"name": "three", "type": {"type": "fixed", "name": "Three", "size": 3}},
            {"name": "suit", "type": {"type": "enum", "name": "Suit", "symbols": ["H", "S"]}},
            {"name": "either", "type": ["null", "string", "long"]},
            {"name": "longs", "type": {"type": "array", "items": "long"}},
            {"name": "doubles", "type": {"type": "map", "values": "double"}},
            {"name": "chain", "type": NODE},
            {"name": "nodes", "type": {"type": "array", "items": "test.Node"}},
            {"name": "again", "type": ["null", "Three", "Suit"]},
            {
                "name": "amount",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10},
            },
            {
                "name": "price",
                "type": {
                    "type": "fixed",
                    "name": "Price",
                    "size": 8,
                    "logicalType": "decimal",
                    "precision": 18,
                    "scale": 3,
                },
            },
            {"name": "whole", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "ms_time", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "us_time", "type": {"type": "long", "logicalType": "time-micros"}},
            {"name": "ms_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "us_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "ms_local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
            {"name": "us_local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "nanos", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
            {
                "name": "maybe_at",
                "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
            },
        ],
    }
)
NAMES = [f["name"] for f in EVERY_TYPE["fields"]]
LIMIT = 64 * 1024**2  # the default of consumer.max_decoded_record_bytes
PROGRAM = compile_record(EVERY_TYPE, NAMES, [None] * len(NAMES), limit=LIMIT)


def _record(rng: random.Random) -> dict[str, Any]:
    def pick(*choices: Any) -> Any:
        return rng.choice(choices)

    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=pick(0, -1, 1, rng.randrange(-62135596800, 253402300799) * 10**6
                          + rng.randrange(10**6), 253402300799999999, -62135596800000000)
    )  # fmt: skip
    chain: dict[str, Any] | None = None
    for value in range(rng.randrange(4)):
        chain = {"value": value, "next": chain}
    digits = rng.randrange(1, 39)
    return {
        "nothing": None,
        "flag": pick(True, False),
        "small": pick(0, -1, 2**31 - 1, -(2**31), rng.randrange(-(2**31), 2**31)),
        "big": pick(0, 2**63 - 1, -(2**63), rng.randrange(-(2**63), 2**63)),
        "single": pick(0.0, -1.5, 3.25, float("inf")),
        "double": pick(0.0, -0.1, 1e308, 5e-324, rng.random()),
        "text": pick("", "plain", "ünïcødé ✓", "x" * rng.randrange(300)),
        "raw": bytes(rng.randrange(256) for _ in range(rng.randrange(20))),
        "three": bytes(rng.randrange(256) for _ in range(3)),
        "suit": pick("H", "S"),
        "either": pick(None, "s", -7, 2**40),
        "longs": [rng.randrange(-(2**63), 2**63) for _ in range(rng.randrange(5))],
        "doubles": {f"k{i}": rng.random() for i in range(rng.randrange(4))},
        "chain": chain or {"value": -1, "next": None},
        "nodes": [{"value": i, "next": None} for i in range(rng.randrange(3))],
        "again": pick(None, b"abc", "S"),
        "amount": Decimal(rng.randrange(-(10**digits) + 1, 10**digits)).scaleb(-10),
        "price": Decimal(rng.randrange(-(10**18) + 1, 10**18)).scaleb(-3),
        "whole": Decimal(pick(0, 99999, -99999, 7)),
        "day": pick(date(1, 1, 1), date(9999, 12, 31), date(1969, 12, 31), at.date()),
        "ms_time": time(
            rng.randrange(24), rng.randrange(60), rng.randrange(60), rng.randrange(1000) * 1000
        ),
        "us_time": pick(time(0), time(23, 59, 59, 999999), at.time().replace(tzinfo=None)),
        "ms_at": at.replace(microsecond=at.microsecond // 1000 * 1000),
        "us_at": at,
        "ms_local": at.replace(microsecond=at.microsecond // 1000 * 1000, tzinfo=None),
        "us_local": at.replace(tzinfo=None),
        "id": str(uuid.UUID(int=rng.randrange(2**128))),
        "nanos": rng.randrange(-(2**63), 2**63),
        "maybe_at": pick(None, at),
    }


def _body(record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, EVERY_TYPE, record)
    return out.getvalue()


def _bodies(count: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    return [_body(_record(rng)) for _ in range(count)]


def _reference(body: bytes) -> tuple[Any, ...]:
    """fastavro's reading, as the C reader gives it: a uuid as its text."""
    read: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(body), EVERY_TYPE, None)  # type: ignore[assignment]
    read["id"] = str(read["id"])
    return tuple(read[name] for name in NAMES)


def test_every_type_reads_exactly_as_fastavro_reads_it() -> None:
    bodies = _bodies(400)
    rows = PROGRAM.rows(bodies, 0)
    for body, row in zip(bodies, rows, strict=True):
        expected = _reference(body)
        assert row == expected
        # Equal is not enough where types differ but compare equal (1 == 1.0 == True).
        assert [type(v) for v in row] == [type(v) for v in expected]
        assert [v.as_tuple() for v in row if isinstance(v, Decimal)] == [
            v.as_tuple() for v in expected if isinstance(v, Decimal)
        ]  # the same digits and exponent, not only the same number


def test_a_decimal_keeps_every_digit_and_its_scale() -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "D", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal",
                               "precision": 60, "scale": 20}}]})  # fmt: skip
    program = compile_record(schema, ["d"], [None], limit=LIMIT)  # type: ignore[arg-type]
    for text in ("0E-20", "-0.00000000000000000001", "12345678901234567890.12345678901234567890",
                 "-99999999999999999999999999999999999999.99999999999999999999",
                 "1.00000000000000000000"):  # fmt: skip
        value = Decimal(text)
        sign, digits, _ = value.as_tuple()
        unscaled = (-1) ** sign * int("".join(map(str, digits)))
        raw = unscaled.to_bytes(max(1, (unscaled.bit_length() + 8) // 8), "big", signed=True)
        body = io.BytesIO()
        fastavro.schemaless_writer(body, {"type": "bytes"}, raw)
        (row,) = program.rows([body.getvalue()], 0)
        assert row[0].as_tuple() == value.as_tuple(), text


def test_columns_take_their_fields_and_keep_the_template_elsewhere() -> None:
    program = compile_record(
        EVERY_TYPE, ["big", "absent", "text"], ["big?", "ABSENT", "text?"], limit=LIMIT
    )
    body = _bodies(1)[0]
    expected = _reference(body)
    assert program.rows([b"\x00\x00\x00\x00\x01" + body], 5) == [
        (expected[NAMES.index("big")], "ABSENT", expected[NAMES.index("text")])
    ]


def test_an_array_written_in_sized_blocks_reads_like_one_block() -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "A", "fields": [
        {"name": "a", "type": {"type": "array", "items": "long"}}]})  # fmt: skip
    program = compile_record(schema, ["a"], [None], limit=LIMIT)  # type: ignore[arg-type]
    # Two blocks: count -2 (zigzag 3) with its size in bytes (2, zigzag 4), then count 1, then 0.
    body = bytes([3, 4, 2, 4, 2, 6, 0])
    assert program.rows([body], 0) == [([1, 2, 3],)]
    assert fastavro.schemaless_reader(io.BytesIO(body), schema, None) == {"a": [1, 2, 3]}


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"\x02\x01", "after the record"),
        (b"\x02", "ends before a boolean"),
        (b"\x02\x02", "neither 0 nor 1"),
        (b"\x02\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "longer than 10 bytes"),
        (b"\x02\x01\x80\x80\x80\x80\x20", "out of 32-bit range"),
    ],
)
def test_a_malformed_body_is_refused_naming_what_is_wrong(body: bytes, names: str) -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "M", "fields": [
        {"name": "one", "type": "long"}, {"name": "flag", "type": "boolean"},
        {"name": "n", "type": "int"}]})  # fmt: skip
    program = compile_record(schema, ["one", "flag", "n"], [None] * 3, limit=LIMIT)  # type: ignore[arg-type]
    if names == "after the record":
        body += b"\x00\x07"  # a whole record, and two bytes more
    with pytest.raises(ValueError, match=names):
        program.rows([body], 0)


@pytest.mark.parametrize(
    ("field_type", "body", "names"),
    [
        ("string", b"\x03ab", "negative length"),
        ("string", b"\x08ab", "longer than the rest"),
        ("string", b"\x04\xff\xfe", "utf-8"),
        (["null", "long"], b"\x04", "union branch index out of range"),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, b"\x02", "enum index out of range"),
        ({"type": "array", "items": "long"}, b"\xfe\xff\xff\xff\x0f", "more items than"),
        ({"type": "int", "logicalType": "date"}, b"\xfe\xff\xff\xff\x0f", "date out of range"),
        ({"type": "long", "logicalType": "timestamp-micros"},
         b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01", "timestamp out of range"),
        ({"type": "long", "logicalType": "timestamp-millis"},
         b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01", "timestamp out of range"),
        ({"type": "int", "logicalType": "time-millis"}, b"\x01", "time of day out of range"),
        ({"type": "fixed", "name": "F", "size": 4}, b"abc", "ends inside a fixed"),
    ],
)  # fmt: skip
def test_each_kind_of_unreadable_value_is_named(field_type: Any, body: bytes, names: str) -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "U", "fields": [
        {"name": "f", "type": field_type}]})  # fmt: skip
    program = compile_record(schema, ["f"], [None], limit=LIMIT)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"(?i){names}"):
        program.rows([body], 0)


def test_no_cut_of_a_body_reads_and_one_byte_more_is_refused() -> None:
    for body in _bodies(30, seed=11):
        for end in range(len(body)):
            with pytest.raises(ValueError):  # any of them: each names itself
                PROGRAM.rows([body[:end]], 0)
        with pytest.raises(ValueError, match="1 byte"):
            PROGRAM.rows([body + b"\x00"], 0)


def test_corrupted_bodies_are_refused_or_read_never_a_crash() -> None:
    rng = random.Random(3)  # noqa: S311 - test data, not secrets
    bodies = _bodies(50, seed=5)
    read = refused = 0
    for _ in range(20_000):
        body = bytearray(rng.choice(bodies))
        for _ in range(rng.randrange(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        try:
            PROGRAM.rows([bytes(body)], 0)
            read += 1
        except ValueError:
            refused += 1
    assert read + refused == 20_000 and refused > 0


def test_one_bad_value_in_a_batch_refuses_the_batch() -> None:
    good = _bodies(3)
    with pytest.raises(ValueError, match="after the record"):
        PROGRAM.rows([good[0], good[1] + b"\x00", good[2]], 0)
    with pytest.raises(ValueError, match="shorter than its header"):
        PROGRAM.rows([b"\x00\x00"], 5)
