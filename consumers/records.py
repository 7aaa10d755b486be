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
# number (a digit run of 16 or more, or an underflowed exponent) is decoded again by the
# standard library, with integers exact and fractions as Decimal, which PostgreSQL reads exactly.
# Anything that only looks like one (a long digit string) merely takes that slower path.
_DIGIT_CLASS = bytes.maketrans(b"0123456789.", b"0" * 11)
_LONG_RUN = b"0" * 16
_SMALLEST_NORMAL_DOUBLE = 2.2250738585072014e-308


class Record:
    """One Kafka record, detached from the client so the applier can be tested without it."""

    __slots__ = ("_headers", "key", "offset", "partition", "timestamp_ms", "topic", "value")

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
        self.timestamp_ms = timestamp_ms
        self._headers = headers

    @classmethod
    def from_message(cls, message: Message) -> Record:
        # The consumer has no deserializers: key and value are bytes or None as Kafka holds them.
        timestamp_type, timestamp = message.timestamp()
        record = cls.__new__(cls)
        record.topic = message.topic()  # type: ignore[assignment]
        record.partition = message.partition()  # type: ignore[assignment]
        record.offset = message.offset()  # type: ignore[assignment]
        record.key = message.key()
        record.value = message.value()
        record.timestamp_ms = timestamp if timestamp_type != _TIMESTAMP_NOT_AVAILABLE else None
        record._headers = message.headers()  # type: ignore[assignment]
        return record

    @property
    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers or []

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
    kinds = set(map(type, value.values()))
    if (float in kinds or dict in kinds or list in kinds) and _may_lose_digits(raw, value):
        value = _exact_loads(raw)
    return value  # type: ignore[no-any-return]


def _may_lose_digits(raw: bytes, value: dict[str, Any]) -> bool:
    if _LONG_RUN in raw.translate(_DIGIT_CLASS):
        return True
    if b"e" not in raw and b"E" not in raw:
        return False
    return any(
        type(v) is not float or abs(v) < _SMALLEST_NORMAL_DOUBLE
        for v in value.values()
        if type(v) in _NESTED or type(v) is float
    )


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
