"""Kafka records as the applier sees them, and their decoding into rows or dead letters."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message


@dataclass(frozen=True, kw_only=True)
class Record:
    """One Kafka record, detached from the client so the applier can be tested without it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None

    @classmethod
    def from_message(cls, message: Message) -> Record:
        timestamp_type, timestamp = message.timestamp()
        return cls(
            topic=message.topic() or "",
            partition=message.partition() or 0,
            offset=message.offset() or 0,
            key=_as_bytes(message.key()),
            value=_as_bytes(message.value()),
            headers=tuple((str(h[0]), _as_bytes(h[1])) for h in (message.headers() or [])),
            timestamp_ms=timestamp if timestamp_type != 0 else None,
        )

    def headers_json(self) -> str:
        return json.dumps(
            [
                [k, None if v is None else v.decode("utf-8", "backslashreplace")]
                for k, v in self.headers
            ]
        )


def _as_bytes(value: str | bytes | None) -> bytes | None:
    if isinstance(value, str):
        return value.encode()
    return value


class RecordError(ValueError):
    """Why a record cannot become a row; the message goes to the dead-letter table."""


def decode_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"value is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RecordError(f"value is JSON {type(value).__name__}, not an object")
    return value


def decode_key(raw: bytes | None, key_columns: tuple[str, ...]) -> tuple[Any, ...]:
    """The key columns of a record's key: a JSON object with them, or for one key column a
    bare JSON scalar or plain text."""
    if raw is None:
        raise RecordError("tombstone without a key")
    try:
        parsed: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
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
    if isinstance(value, dict | list):
        return json.dumps(value)
    return value
