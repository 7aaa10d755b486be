"""Kafka records as the applier sees them, and their decoding into rows or dead letters.

This is the consumer's per-record path: every record of every batch passes here, so it avoids
work a record does not need (headers are read only for a dead letter) and decodes with orjson.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson
from confluent_kafka import Message

_TIMESTAMP_NOT_AVAILABLE = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE
_NESTED = (dict, list)
# Exact numbers. orjson decodes every number that is not a 64-bit integer through a double, so
# an integer beyond 64 bits, a number with more significant digits than a double holds, or an
# exponent below a double's range would lose digits silently. A value that may hold such a
# number is decoded again by the standard library, with integers exact and fractions as
# Decimal, which PostgreSQL reads exactly. The test runs on the raw bytes at C speed, with digits
# and '.' mapped to '0' and exponent letters to 'e': a run of 16 such characters may be a long
# number, and "0e" may be an exponent. Only then are the decoded values looked at, and only
# floats and nested values can hide a lost digit (64-bit integers are exact). Text that merely
# looks like a number costs that second look, never a wrong value.
_NUMBER_SHAPE = bytes.maketrans(b"0123456789.eE", b"00000000000ee")
_LONG_RUN = b"0" * 16
_EXPONENT = b"0e"
_SMALLEST_NORMAL_DOUBLE = 2.2250738585072014e-308


class Record:
    """One Kafka record, detached from the client so the applier can be tested without it.

    From a consumed message only what every record needs is copied out; the timestamp and the
    headers are read from the message when asked for (a latency sample, a dead letter)."""

    __slots__ = (
        "_headers",
        "_message",
        "_timestamp_ms",
        "fields",
        "key",
        "offset",
        "partition",
        "topic",
        "value",
    )

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.fields: dict[str, Any] | None = None  # the decoded JSON object, set by the applier
        self._headers = headers
        self._timestamp_ms = timestamp_ms
        self._message: Message | None = None

    @classmethod
    def from_message(cls, message: Message) -> Record:
        # The consumer has no deserializers: key and value are bytes or None as Kafka holds them.
        record = cls.__new__(cls)
        record.topic = message.topic()  # type: ignore[assignment]
        record.partition = message.partition()  # type: ignore[assignment]
        record.offset = message.offset()  # type: ignore[assignment]
        record.key = message.key()
        record.value = message.value()
        record.fields = None
        record._message = message
        return record

    @property
    def timestamp_ms(self) -> int | None:
        if self._message is None:
            return self._timestamp_ms
        kind, timestamp = self._message.timestamp()
        return timestamp if kind != _TIMESTAMP_NOT_AVAILABLE else None

    @property
    def headers(self) -> list[tuple[str, str | bytes | None]]:
        headers = self._message.headers() if self._message is not None else self._headers
        if isinstance(headers, dict):
            return list(headers.items())
        return list(headers or [])

    def headers_json(self) -> str:
        return json.dumps(
            [
                [str(k), None if v is None else _as_bytes(v).decode("utf-8", "backslashreplace")]
                for k, v in self.headers
            ]
        )

    def __repr__(self) -> str:
        return f"Record({self.topic}[{self.partition}]@{self.offset})"


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


class RecordError(ValueError):
    """Why a record cannot become a row; the message goes to the dead-letter table."""


def decode_object(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        value = _exact_or_none(raw)  # a number beyond a double's range is valid JSON
        if value is None:
            raise RecordError(f"value is not JSON: {exc}") from None
    if type(value) is not dict:
        raise RecordError(f"value is JSON {type(value).__name__}, not an object")
    shape = raw.translate(_NUMBER_SHAPE)
    long_run = _LONG_RUN in shape
    if (long_run or _EXPONENT in shape) and _may_lose_digits(value, long_run=long_run):
        value = _exact_loads(raw)
    return value  # type: ignore[no-any-return]


def _may_lose_digits(value: dict[str, Any], *, long_run: bool) -> bool:
    """Whether a float or a nested value may have lost digits: with a long digit run anywhere,
    any of them may; with only an exponent, a float that underflowed or a nested value may."""
    for item in value.values():
        kind = type(item)
        if kind is dict or kind is list:
            return True
        if kind is float and (long_run or abs(item) < _SMALLEST_NORMAL_DOUBLE):
            return True
    return False


def _exact_loads(raw: bytes) -> Any:
    return json.loads(raw, parse_float=Decimal, parse_constant=_refuse_constant)


def _exact_or_none(raw: bytes) -> Any:
    try:
        return _exact_loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _refuse_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


def decode_key(raw: bytes | None, key_columns: tuple[str, ...]) -> tuple[Any, ...]:
    """The key columns of a record's key: a JSON object with them, or for one key column a
    bare JSON scalar or plain text."""
    if raw is None:
        raise RecordError("tombstone without a key")
    parsed: Any = _exact_or_none(raw)  # keys are few and short: always the exact decoder
    if parsed is None:
        parsed = raw.decode("utf-8", "replace")
    if isinstance(parsed, dict):
        missing = [c for c in key_columns if c not in parsed]
        if missing:
            raise RecordError(f"key lacks key column(s) {', '.join(missing)}")
        return tuple(to_cell(parsed[c]) for c in key_columns)
    if len(key_columns) == 1 and not isinstance(parsed, list):
        return (to_cell(parsed),)
    raise RecordError(f"key must be a JSON object with {', '.join(key_columns)}")


def to_cell(value: Any) -> Any:
    """A JSON value as COPY's text format wants it: nested values as JSON text."""
    if isinstance(value, _NESTED):
        try:
            return orjson.dumps(value).decode()
        except TypeError:  # holds a Decimal from the exact decoder
            return _exact_dumps(value)
    return value


def _exact_dumps(value: Any) -> str:
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{json.dumps(str(k))}:{_exact_dumps(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list):
        return "[" + ",".join(_exact_dumps(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value)
