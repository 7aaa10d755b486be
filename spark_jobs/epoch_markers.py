"""Epoch markers: which epoch each Spark partition of a query last committed to Kafka.

The marker of partition P is the committed offset of a memberless consumer group
`<prefix>.marker.p<P>` on partition 0 of the marker topic, written with
`send_offsets_to_transaction` inside the very transaction that carries the data of (P, E), so
the data and the marker commit or abort together. Offset = E + 1 (offset 0 would be ambiguous
with "nothing"), metadata = a small JSON document for the operator tools.

Read back with a stable offset fetch (`committed()` of a read_committed consumer): the broker
refuses to answer while a transaction with offsets for that group is open, instead of answering
with a value the open transaction may still change. Read it only after `init_transactions`,
which has aborted or completed every earlier holder's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from bridge.names import MARKER_GROUP_INFIX

# The group's coordinator is moving or still loading (a broker just started, a fresh
# __consumer_offsets partition): librdkafka does not flag these as retriable on an offset
# fetch, but they pass like a timeout does.
_COORDINATOR_NOT_READY = {
    KafkaError._TIMED_OUT,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


def _pending(exc: BaseException) -> bool:
    """An open transaction's offsets, or a coordinator not ready yet: worth waiting for."""
    if not isinstance(exc, KafkaException):
        return False
    error: KafkaError = exc.args[0]
    return bool(error.retriable()) or error.code() in _COORDINATOR_NOT_READY


def marker_group(prefix: str, partition: int) -> str:
    return f"{prefix}{MARKER_GROUP_INFIX}{partition}"


def partition_of_marker_group(prefix: str, group: str) -> int | None:
    """The Spark partition a marker group belongs to, or None if it is not one of `prefix`."""
    head = prefix + MARKER_GROUP_INFIX
    if not group.startswith(head) or not group[len(head) :].isdigit():
        return None
    return int(group[len(head) :])


@dataclass(frozen=True, kw_only=True)
class Marker:
    epoch: int
    details: Mapping[str, object]

    @classmethod
    def from_committed(cls, tp: TopicPartition) -> Marker | None:
        if tp.offset is None or tp.offset < 1:
            return None
        try:
            details = json.loads(tp.metadata) if tp.metadata else {}
        except ValueError:
            details = {"metadata": tp.metadata}
        return cls(epoch=tp.offset - 1, details=details if isinstance(details, dict) else {})


def marker_position(
    marker_topic: str, epoch: int, details: Mapping[str, object]
) -> list[TopicPartition]:
    """The offsets that record `epoch` as committed, for `send_offsets_to_transaction`."""
    metadata = json.dumps({"epoch": epoch, **details}, separators=(",", ":"), sort_keys=True)
    return [TopicPartition(marker_topic, 0, epoch + 1, metadata=metadata)]


class MarkerReader:
    """A consumer of the marker group of one partition: it never subscribes, it only supplies the
    group metadata for the transaction and reads the committed marker."""

    def __init__(
        self, kafka: Mapping[str, str], *, prefix: str, partition: int, marker_topic: str
    ) -> None:
        config: dict[str, str | bool] = dict(kafka)
        config.update(
            {
                "group.id": marker_group(prefix, partition),
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self._consumer = Consumer(config)
        self._marker_topic = marker_topic

    def group_metadata(self) -> object:
        return self._consumer.consumer_group_metadata()

    def read(self, *, timeout: float) -> Marker | None:
        """The last committed marker, waiting out an open transaction for at most `timeout`."""
        found = Retrying(
            retry=retry_if_exception(_pending),
            stop=stop_after_delay(timeout),
            wait=wait_fixed(0.2),  # some retriable errors return at once: do not spin
            reraise=True,
        )(
            self._consumer.committed,
            [TopicPartition(self._marker_topic, 0)],
            timeout=min(10.0, timeout),
        )
        if found[0].error is not None:
            raise KafkaException(found[0].error)
        return Marker.from_committed(found[0])

    def close(self) -> None:
        self._consumer.close()
