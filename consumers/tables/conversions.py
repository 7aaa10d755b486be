"""A route's conversions of a decoded row's values, as Kafka Connect's Cast and
TimestampConverter SMTs and its JDBC sink's `db.timezone` do them (`fields.cast`,
`fields.timestamps`, `timestamp_zone`; docs/routes.md, "Converting fields").

They apply to a row of any format once decoded, before it is written; a value that cannot be
converted is a RecordError naming its field and why, which the route dead-letters or stops at.
Where Connect's Cast wraps a number silently (a long cast to int8), this refuses it: a ledger's
value is never changed to another number.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from bridge.java_patterns import date_format
from bridge.settings import CastType, RouteSettings, TimestampSettings
from consumers.decoding.records import RecordError
from consumers.decoding.rows import UNSET, Row, json_text

Convert = Callable[[Any], Any]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
# Per second, what an epoch number counts.
_UNITS = {"seconds": 1, "milliseconds": 1_000, "microseconds": 1_000_000,
          "nanoseconds": 1_000_000_000}  # fmt: skip
# The column types a conversion makes, for a table created from the records (auto_create), as
# Connect's PostgreSQL dialect creates them; with their pg_type.typcategory.
CAST_COLUMNS: Mapping[str, tuple[str, str]] = {
    "int8": ("smallint", "N"),  # PostgreSQL has no one-byte integer
    "int16": ("smallint", "N"),
    "int32": ("integer", "N"),
    "int64": ("bigint", "N"),
    "float32": ("real", "N"),
    "float64": ("double precision", "N"),
    "boolean": ("boolean", "B"),
    "string": ("text", "S"),
}
TIMESTAMP_COLUMNS: Mapping[str, tuple[str, str]] = {
    "timestamp": ("timestamp with time zone", "D"),
    "date": ("date", "D"),
    "time": ("time without time zone", "D"),
    "unix": ("bigint", "N"),
    "string": ("text", "S"),
}


def field_conversions(
    route: RouteSettings, columns: Sequence[str], field_of: Mapping[str, str]
) -> Callable[[Row], Row] | None:
    """Each of `columns` whose field (`field_of`: a column's field) the route converts
    (`fields.cast`, `fields.timestamps`), converted; None when the route converts none."""
    steps: list[tuple[int, Convert]] = []
    for i, column in enumerate(columns):
        name = field_of.get(column)
        if name is None:
            continue
        if name in route.fields.cast:
            steps.append((i, _guarded(name, cast_to(route.fields.cast[name]))))
        elif name in route.fields.timestamps:
            steps.append((i, _guarded(name, timestamp_to(route.fields.timestamps[name]))))
    return _stepper(steps)


def zone_conversion(
    route: RouteSettings, columns: Sequence[str], local_timestamps: frozenset[str]
) -> Callable[[Row], Row] | None:
    """An instant bound for one of the `local_timestamps` columns (timestamp without time
    zone) as `timestamp_zone`'s local time; None in UTC, which PostgreSQL's own reading of an
    instant into such a column gives."""
    if route.timestamp_zone == "UTC":
        return None
    local = _local(ZoneInfo(route.timestamp_zone))
    return _stepper([(i, local) for i, c in enumerate(columns) if c in local_timestamps])


def _stepper(steps: list[tuple[int, Convert]]) -> Callable[[Row], Row] | None:
    if not steps:
        return None

    def convert(row: Row) -> Row:
        values = list(row)
        for i, step in steps:
            value = values[i]
            if value is not None and value is not UNSET:
                values[i] = step(value)
        return tuple(values)

    return convert


def _guarded(name: str, convert: Convert) -> Convert:
    def guarded(value: Any) -> Any:
        try:
            return convert(value)
        except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
            raise RecordError(f"field {name}: {exc}") from None

    return guarded


def _local(zone: ZoneInfo) -> Convert:
    def local(value: Any) -> Any:
        if isinstance(value, datetime) and value.tzinfo is not None:
            return value.astimezone(zone).replace(tzinfo=None)
        return value  # a local time already, or text PostgreSQL reads

    return local


def cast_to(kind: CastType) -> Convert:
    """Connect's Cast of a value to `kind`; ValueError or TypeError saying why it cannot be."""
    if kind in _BITS:
        return _integer(kind, _BITS[kind])
    if kind in ("float32", "float64"):
        return _floating(kind == "float32")
    if kind == "boolean":
        return _boolean
    return _text


def _integer(kind: str, bits: int) -> Convert:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def integer(value: Any) -> int:
        if isinstance(value, bool):
            found = int(value)
        elif isinstance(value, int):
            found = value
        elif isinstance(value, float | Decimal):
            if not math.isfinite(value):
                raise ValueError(f"{value} is not a number {kind} holds")
            found = int(value)  # toward zero, as Java's longValue()
        elif isinstance(value, str):
            found = _integer_text(value)
        elif isinstance(value, datetime):
            since = (value if value.tzinfo else value.replace(tzinfo=UTC)) - _EPOCH
            found = since // timedelta(milliseconds=1)  # Connect casts a Date by its ms
        else:
            raise TypeError(f"a {_kind(value)} cannot be cast to {kind}")
        if not low <= found <= high:
            raise ValueError(f"{found} is out of {kind}'s range")
        return found

    return integer


def _integer_text(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        try:
            found = Decimal(text.strip())
        except ArithmeticError:
            raise ValueError(f"{text[:40]!r} is not a number") from None
        if not found.is_finite():
            raise ValueError(f"{text[:40]!r} is not a finite number") from None
        return int(found)


def _floating(single: bool) -> Convert:
    def floating(value: Any) -> float:
        if isinstance(value, int | float | Decimal):  # a bool too: 1.0 or 0.0
            found = float(value)
        elif isinstance(value, str):
            found = float(value.strip())
        else:
            raise TypeError(f"a {_kind(value)} cannot be cast to a float")
        if single and math.isfinite(found):
            found = struct.unpack("f", struct.pack("f", found))[0]
            if math.isinf(found):
                raise ValueError(f"{value} is out of float32's range")
        return found

    return floating


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float | Decimal):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ValueError(f"{value[:40]!r} is not true or false")
    raise TypeError(f"a {_kind(value)} cannot be cast to boolean")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode()  # as Connect's Cast writes bytes
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json_text(value)
    return str(value)


def timestamp_to(settings: TimestampSettings) -> Convert:
    """Connect's TimestampConverter of a value to `settings.type`."""
    unit = _UNITS[settings.unix_precision]
    pattern = date_format(settings.format) if settings.format is not None else None

    def instant(value: Any) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        if isinstance(value, date):
            return datetime(value.year, value.month, value.day, tzinfo=UTC)
        if isinstance(value, time):
            return datetime.combine(date(1970, 1, 1), value, tzinfo=UTC)
        if isinstance(value, int | Decimal | float) and not isinstance(value, bool):
            whole = Decimal(value) if isinstance(value, float) else value
            micros = int(Decimal(whole) * 1_000_000 / unit)
            return _EPOCH + timedelta(microseconds=micros)
        if isinstance(value, str):
            if pattern is None:
                raise ValueError("text needs the conversion's format")
            try:
                return pattern.parse(value)
            except ValueError:
                raise ValueError(
                    f"{value[:60]!r} does not match format {pattern.pattern!r}"
                ) from None
        raise TypeError(f"a {_kind(value)} is not a timestamp")

    target = settings.type

    def convert(value: Any) -> Any:
        when = instant(value)
        if target == "timestamp":
            return when
        if target == "date":
            return when.astimezone(UTC).date()
        if target == "time":
            return when.astimezone(UTC).time()
        if target == "unix":
            since = when - _EPOCH
            micros = (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds
            return micros * unit // 1_000_000
        assert pattern is not None  # noqa: S101 - the settings refuse string without format
        return pattern.format(when)

    return convert


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "record"
    return type(value).__name__
