"""Kafka records as the applier sees them: the client's own messages.

This is the consumer's per-record path, and every record of every batch passes here. A record
stays the `confluent_kafka.Message` that `consume()` made: copying it into an object of our own
cost more than decoding its value. Batches are handled with C loops over the messages (`map`
with the `Message` methods, `groupby`); the headers and the timestamp are read only when asked
for (a dead letter, a latency sample). Tests build records with `Message`'s own constructor.
"""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message

from bridge.errors import BridgeError

Record = Message

_TIMESTAMP_NOT_AVAILABLE = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE


def offset_of(record: Record) -> int:
    return cast(int, record.offset())  # a consumed record always has one


def timestamp_ms(record: Record) -> int | None:
    kind, timestamp = record.timestamp()
    return timestamp if kind != _TIMESTAMP_NOT_AVAILABLE else None


class RecordStopped(BridgeError):
    """A bad record of a route whose `on_record_error` is `stop`: its partition is not written
    from it on until it is let through (the table or the route fixed, or the offset reset)."""

    def __init__(self, record: Message, error: str) -> None:
        self.topic = cast(str, record.topic())
        self.partition = cast(int, record.partition())
        self.offset = cast(int, record.offset())
        self.error = error
        super().__init__(f"record {self.topic}[{self.partition}]@{self.offset}: {error}")


class RecordError(BridgeError):
    """Why a record cannot become a row; the message goes to the dead-letter table."""
