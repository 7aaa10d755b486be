"""Kafka records as the applier sees them.

This is the consumer's per-record path: every record of every batch passes here, so a record
copies out of the message only what every record needs; the headers and the timestamp are read
when asked for (a dead letter, a latency sample).
"""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Message

_TIMESTAMP_NOT_AVAILABLE = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE


class Record:
    """One Kafka record, detached from the client so the applier can be tested without it.

    From a consumed message only what every record needs is copied out; the timestamp and the
    headers are read from the message when asked for (a latency sample, a dead letter)."""

    __slots__ = (
        "_headers",
        "_message",
        "_timestamp_ms",
        "key",
        "offset",
        "partition",
        "row",
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
        self.row: tuple[Any, ...] | None = None  # the decoded value, set by the applier
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
        record.row = None
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
