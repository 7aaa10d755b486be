"""A route's conversions of a row's values, as Kafka Connect's Cast, TimestampConverter and
`db.timezone`: what each makes of each kind of value, what it refuses (a record error naming the
field), and the columns a table created from the records gets."""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.settings import RouteSettings, TimestampSettings
from consumers.decoding.debezium_time import with_debezium_time_types
from consumers.decoding.records import RecordError
from consumers.decoding.rows import UNSET
from consumers.tables.conversions import (
    cast_to,
    field_conversions,
    timestamp_to,
    zone_conversion,
)
from consumers.tables.table_types import field_columns
from consumers.tables.targets import Target


def _route(fields: dict[str, Any]) -> RouteSettings:
    return RouteSettings.model_validate({"topic": "t", "table": "t", "fields": fields})


@pytest.mark.parametrize(("kind", "value", "cast"), [
    ("int32", 4.9, 4), ("int32", Decimal("-4.9"), -4), ("int64", "42", 42), ("int8", True, 1),
    ("int64", " 12.5 ", 12), ("int64", datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), 1000),
    ("float64", "12.50", 12.5), ("float64", 3, 3.0),
    ("float32", Decimal("0.1"), 0.10000000149011612),
    ("boolean", 0, False), ("boolean", Decimal("2.5"), True), ("boolean", "TRUE", True),
    ("string", True, "true"), ("string", 5, "5"), ("string", Decimal("1.50"), "1.50"),
    ("string", b"\x00\x01", "AAE="), ("string", {"a": 1}, '{"a":1}'),
    ("string", date(2024, 3, 1), "2024-03-01"),
])  # fmt: skip
def test_cast_makes_each_kind_of_value_what_connect_s_cast_makes_it(
    kind: Any, value: Any, cast: Any
) -> None:
    assert cast_to(kind)(value) == cast


@pytest.mark.parametrize(("kind", "value", "why"), [
    ("int8", 200, "out of int8's range"), ("int32", 2**40, "out of int32's range"),
    ("int64", "twelve", "not a number"), ("int64", float("nan"), "not a number"),
    ("boolean", "yes", "not true or false"), ("int64", [1], "list cannot be cast"),
    ("float32", 1e300, "out of float32's range"),
])  # fmt: skip
def test_cast_refuses_a_value_it_would_change_or_cannot_read(
    kind: Any, value: Any, why: str
) -> None:
    route = _route({"cast": {"n": kind}})
    convert = field_conversions(route, ("n",), {"n": "n"})
    assert convert is not None
    with pytest.raises(RecordError, match=f"field n: .*{why}"):
        convert((value,))


def test_timestamps_read_epochs_text_and_instants_and_write_each_type() -> None:
    at = datetime(2024, 3, 1, 10, 20, 30, 123000, tzinfo=UTC)
    millis = 1709288430123
    text = TimestampSettings(type="timestamp", format="yyyy-MM-dd HH:mm:ss.SSS")
    assert timestamp_to(text)("2024-03-01 10:20:30.123") == at
    assert timestamp_to(TimestampSettings(type="timestamp"))(millis) == at
    seconds = TimestampSettings(type="timestamp", unix_precision="seconds")
    assert timestamp_to(seconds)(1709288430) == at.replace(microsecond=0)
    micros = TimestampSettings(type="unix", unix_precision="microseconds")
    assert timestamp_to(micros)(at) == millis * 1000
    assert timestamp_to(TimestampSettings(type="date"))(millis) == date(2024, 3, 1)
    assert timestamp_to(TimestampSettings(type="time"))(millis) == time(10, 20, 30, 123000)
    written = TimestampSettings(type="string", format="dd/MM/yyyy")
    assert timestamp_to(written)(at) == "01/03/2024"


def test_a_timestamp_that_cannot_be_read_names_its_field_and_format() -> None:
    route = _route({"timestamps": {"placed": {"type": "timestamp", "format": "yyyy-MM-dd"}}})
    convert = field_conversions(route, ("id", "placed_at"), {"id": "id", "placed_at": "placed"})
    assert convert is not None
    assert convert((1, None)) == (1, None)  # null stays null
    assert convert((1, UNSET)) == (1, UNSET)  # absent stays absent
    with pytest.raises(RecordError, match="field placed: 'yesterday' does not match format"):
        convert((1, "yesterday"))
    with pytest.raises(RecordError, match="field placed: a bool is not a timestamp"):
        convert((1, True))


def test_the_zone_writes_an_instant_as_its_local_time_in_timestamp_columns_only() -> None:
    route = RouteSettings(topic="t", table="t", timestamp_zone="Europe/Paris")
    convert = zone_conversion(route, ("local", "instant", "text"), frozenset({"local", "text"}))
    assert convert is not None
    winter = datetime(2024, 1, 1, 10, 0, tzinfo=UTC)
    summer = datetime(2024, 7, 1, 10, 0, tzinfo=UTC)
    naive = datetime(2024, 1, 1, 10, 0)
    assert convert((winter, winter, "10:00")) == (datetime(2024, 1, 1, 11, 0), winter, "10:00")
    assert convert((summer, summer, naive)) == (datetime(2024, 7, 1, 12, 0), summer, naive)
    utc = RouteSettings(topic="t", table="t")
    assert zone_conversion(utc, ("local",), frozenset({"local"})) is None


def test_a_route_refuses_conversions_it_cannot_apply() -> None:
    from pydantic import ValidationError

    for fields, why in (
        ({"cast": {"n": "int128"}}, "Input should be"),
        ({"timestamps": {"t": {"type": "string"}}}, "type string needs format"),
        ({"timestamps": {"t": {"type": "timestamp", "format": "yyyy-QQ"}}}, "'QQ' is not read"),
        ({"include": ["a"], "cast": {"n": "int64"}}, "cast: field(s) it leaves out: n"),
        ({"cast": {"n": "int64"}, "timestamps": {"n": {"type": "unix"}}}, "one conversion"),
    ):
        with pytest.raises(ValidationError, match=re.escape(why)):
            _route(fields)


def _target(route: RouteSettings, columns: tuple[str, ...], **more: Any) -> Target:
    return Target(route=route, schema="public", name="t", columns=columns,
                  required=frozenset(), **more)  # fmt: skip


def test_a_target_converts_each_row_and_refuses_the_record_that_cannot_be() -> None:
    route = RouteSettings.model_validate({
        "topic": "t", "table": "t", "timestamp_zone": "Europe/Paris",
        "fields": {"rename": {"placed": "placed_at"}, "cast": {"qty": "int32"},
                   "timestamps": {"placed": {"type": "timestamp", "format": "yyyy-MM-dd HH:mm"}}},
    })  # fmt: skip
    target = _target(route, ("id", "qty", "placed_at"), timestamps=frozenset({"placed_at"}),
                     local_timestamps=frozenset({"placed_at"}))  # fmt: skip
    good = b'{"id": 1, "qty": 3.9, "placed": "2024-07-01 00:30"}'
    assert target.row(good) == (1, 3, datetime(2024, 7, 1, 2, 30))
    assert target.rows([good, good]) == [(1, 3, datetime(2024, 7, 1, 2, 30))] * 2
    bad = b'{"id": 2, "qty": 1e12, "placed": "2024-07-01 00:30"}'
    assert target.rows([good, bad]) is None  # then record by record, which names it
    with pytest.raises(RecordError, match="field qty: 1000000000000 is out of int32's range"):
        target.row(bad)


def test_a_table_created_from_the_records_takes_the_converted_types() -> None:
    from consumers.tables.table_follower import _converted

    route = RouteSettings.model_validate({"topic": "t", "table": "t", "fields": {
        "cast": {"amount": "float64", "qty": "int8"},
        "timestamps": {"placed": {"type": "timestamp", "format": "yyyy-MM-dd"}}}})  # fmt: skip
    schema: dict[str, Any] = {"type": "record", "name": "R", "fields": [
        {"name": "amount", "type": "string"}, {"name": "qty", "type": "long"},
        {"name": "placed", "type": "string"}, {"name": "label", "type": "string"}]}  # fmt: skip
    types = [(c.name, _converted(route.fields, c, c).sql_type) for c in field_columns(schema)]
    assert types == [("amount", "double precision"), ("qty", "smallint"),
                     ("placed", "timestamp with time zone"), ("label", "text")]  # fmt: skip


def test_debezium_time_types_are_read_and_created_as_dates_times_and_timestamps() -> None:
    import fastavro

    from consumers.decoding.avro_rows import AvroRowDecoder  # noqa: F401 - the C reader's types

    def typed(kind: str, name: str) -> dict[str, Any]:
        return {"type": kind, "connect.version": 1, "connect.name": f"io.debezium.time.{name}"}

    schema = {"type": "record", "name": "R", "fields": [
        {"name": "at", "type": typed("long", "MicroTimestamp")},
        {"name": "ms", "type": ["null", typed("long", "Timestamp")]},
        {"name": "day", "type": typed("int", "Date")},
        {"name": "clock", "type": typed("long", "MicroTime")},
        {"name": "zoned", "type": typed("string", "ZonedTimestamp")},
        {"name": "nanos", "type": typed("long", "NanoTimestamp")}]}  # fmt: skip
    parsed: dict[str, Any] = fastavro.parse_schema(with_debezium_time_types(schema))  # type: ignore[assignment]
    assert [(c.name, c.sql_type) for c in field_columns(parsed)] == [
        ("at", "timestamp without time zone"), ("ms", "timestamp without time zone"),
        ("day", "date"), ("clock", "time without time zone"),
        ("zoned", "timestamp with time zone"), ("nanos", "bigint"),
    ]  # fmt: skip
    assert with_debezium_time_types({"type": "long"}) == {"type": "long"}


@given(st.sampled_from(["int8", "int16", "int32", "int64", "float32", "float64", "boolean",
                        "string"]),
       st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
                    | st.decimals() | st.binary(max_size=4) | st.datetimes(timezones=st.just(UTC)),
                    lambda inner: st.lists(inner, max_size=2), max_leaves=4))  # fmt: skip
def test_any_value_is_cast_or_refused_as_a_record_error(kind: Any, value: Any) -> None:
    route = RouteSettings.model_validate(
        {"topic": "t", "table": "t", "fields": {"cast": {"n": kind}}}
    )
    convert = field_conversions(route, ("n",), {"n": "n"})
    assert convert is not None
    with contextlib.suppress(RecordError):
        convert((value,))
