"""The consumer's per-record decoding: fast, and never loses a digit or a poison record."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from bridge.settings import RouteSettings
from consumers.records import RecordError, decode_key, decode_object, to_cell
from consumers.targets import Target, cells


@pytest.mark.parametrize(
    ("raw", "field", "exact"),
    [
        (b'{"a": 123456789012345678901234567890}', "a", 123456789012345678901234567890),
        (b'{"a": 18446744073709551616}', "a", 18446744073709551616),  # 2**64: past orjson's ints
        (b'{"a": 12345678901234.567}', "a", Decimal("12345678901234.567")),
        (b'{"a": 0.12345678901234567890}', "a", Decimal("0.12345678901234567890")),
        (b'{"a": 1e400, "note": "overflows a double"}', "a", Decimal("1e400")),
        (b'{"a": 1e-400}', "a", Decimal("1e-400")),
        (b'{"a": 19.99, "b": "EUR"}', "a", 19.99),  # within a double's 15 digits: the fast path
        (b'{"a": -42}', "a", -42),
        (b'{"a": 2.5e-320}', "a", Decimal("2.5e-320")),  # a subnormal double keeps 2 digits
        (b'{"a": 1.5e300, "b": "x1e"}', "a", 1.5e300),  # in range: exact as a double
        (b'{"a": 1234567890123456789, "b": 0.5}', "a", 1234567890123456789),
    ],
)
def test_numbers_are_decoded_without_losing_digits(raw: bytes, field: str, exact: Any) -> None:
    value = decode_object(raw)
    assert value[field] == exact
    assert str(to_cell(value[field])) in {str(exact), repr(exact)}


def test_nested_values_keep_their_digits_as_json_text() -> None:
    value = decode_object(b'{"n": {"big": 123456789012345678901234567890.5, "l": [1, "x"]}}')
    assert to_cell(value["n"]) == '{"big":123456789012345678901234567890.5,"l":[1,"x"]}'
    assert to_cell(decode_object(b'{"n": [1, 2.5]}')["n"]) == "[1,2.5]"
    # An exponent alone sends a nested value to the exact decoder: it may hide an underflow.
    assert to_cell(decode_object(b'{"n": [0.1, {"b": 1e-400}]}')["n"]) == '[0.1,{"b":1E-400}]'


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"not json", "value is not JSON"),
        (b"\xff\xfe", "value is not JSON"),
        (b'{"a": NaN}', "value is not JSON"),
        (b"[1, 2]", "value is JSON list, not an object"),
        (b'"text"', "value is JSON str, not an object"),
        (b"12345678901234567890", "value is JSON int, not an object"),
    ],
)
def test_values_that_are_not_json_objects_are_refused_by_name(raw: bytes, error: str) -> None:
    with pytest.raises(RecordError, match=error):
        decode_object(raw)


def test_keys_decode_from_objects_scalars_and_text() -> None:
    assert decode_key(b'{"id": 7, "region": "eu"}', ("region", "id")) == ("eu", 7)
    assert decode_key(b"12345678901234567890123", ("id",)) == (12345678901234567890123,)
    assert decode_key(b"order-7", ("id",)) == ("order-7",)
    with pytest.raises(RecordError, match="key lacks key column"):
        decode_key(b'{"id": 7}', ("region", "id"))
    with pytest.raises(RecordError, match="tombstone without a key"):
        decode_key(None, ("id",))


def _target() -> Target:
    route = RouteSettings(topic="orders", table="public.orders")
    return Target(
        route=route,
        schema="public",
        name="orders",
        columns=("id", "amount", "meta", "note"),
        required=frozenset({"id", "amount"}),
    )


def test_a_record_without_a_required_column_is_refused_with_every_missing_name() -> None:
    target = _target()
    target.check({"id": 1, "amount": 2})
    with pytest.raises(RecordError, match="missing required column"):
        target.check({"id": 1, "amount": None})
    with pytest.raises(RecordError, match=r"column\(s\) amount, id$"):
        target.check({"note": "x"})


def test_rows_carry_the_columns_some_record_has_in_table_order() -> None:
    target = _target()
    values = [{"note": "a", "id": 1, "unknown": 5}, {"id": 2, "meta": {"k": [1]}}]
    columns = target.present(values)
    assert columns == ["id", "meta", "note"]
    assert [cells(v, columns) for v in values] == [[1, None, "a"], [2, '{"k":[1]}', None]]
