"""Small readers and writers the integration tests share."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

Isolation = Literal["read_committed", "read_uncommitted"]


# `config` of each helper: more client settings (a secured stack's, Endpoints.properties()).


def transactional_producer(
    bootstrap: str, transactional_id: str | None = None, *, config: Mapping[str, Any] | None = None
) -> Producer:
    producer = Producer(
        {
            **(config or {}),
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id or f"test-{uuid.uuid4().hex}",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(60)
    return producer


def read_all(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    partitions: int = 1,
    timeout: float = 30.0,
    config: Mapping[str, Any] | None = None,
) -> list[bytes]:
    """Every value a consumer of `isolation` can read, from the start to the end of each partition
    (for read_committed the end is the last stable offset)."""
    values = []
    for message in read_messages(
        bootstrap,
        topic,
        isolation=isolation,
        partitions=partitions,
        timeout=timeout,
        config=config,
    ):
        value = message.value()
        assert value is not None, f"{topic}: a record without a value"
        values.append(value)
    return values


def read_messages(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    partitions: int = 1,
    timeout: float = 30.0,
    config: Mapping[str, Any] | None = None,
) -> list[Message]:
    """Every record a consumer of `isolation` can read, as in `read_all`, with key and headers."""
    consumer = Consumer(
        {
            **(config or {}),
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        messages: list[Message] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: reached the end of {sorted(at_end)} only")
            batch = consumer.consume(10_000, 0.5)
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(_partition(message))
                        continue
                    raise KafkaException(error)
                at_end.discard(_partition(message))
                messages.append(message)
        return messages
    finally:
        consumer.close()


def _partition(message: Message) -> int:
    partition = message.partition()
    assert partition is not None
    return partition


def header_map(message: Message) -> dict[str, bytes]:
    headers = message.headers() or []
    pairs = list(headers.items()) if isinstance(headers, dict) else headers
    return {name: value for name, value in pairs if isinstance(value, bytes)}


# The local stack's nodes: transaction.state.log.num.partitions and offsets.topic.num.partitions.
TRANSACTION_LOG_PARTITIONS = 4
OFFSETS_TOPIC_PARTITIONS = 4


def java_hash(text: str) -> int:
    """Java's String.hashCode, which Kafka uses to place a transactional id or a group."""
    value = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        value = (31 * value + int(unit, 16)) & 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal partition that holds `key` (a transactional id in the transaction log, a
    group in __consumer_offsets): Kafka places both by abs(hashCode) % partitions."""
    hashed = java_hash(key)
    return 0 if hashed == -(1 << 31) else abs(hashed) % partitions


def avro_long(value: int) -> bytes:
    """`value` as Avro writes a long: zigzag, then a varint of 7 bits a byte."""
    zigzag = (value << 1) ^ (value >> 63)
    body = bytearray()
    while zigzag > 0x7F:
        body.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    body.append(zigzag)
    return bytes(body)
