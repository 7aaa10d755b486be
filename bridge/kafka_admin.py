"""Kafka administration both sides and the tools share: topics and their offset ranges."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewTopic

from bridge.errors import BridgeError


class TopicError(BridgeError):
    """A topic could not be created or described."""


def create_topic(
    bootstrap_servers: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    timeout: float = 30.0,
    config: Mapping[str, str] | None = None,
) -> None:
    """Create `name` and wait until it exists; an existing topic is left as it is.

    `config`: extra client properties (security settings and the like)."""
    admin = AdminClient({**(config or {}), "bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise TopicError(f"cannot create topic {name!r}: {error.str()}") from exc


def offset_range(
    bootstrap_servers: str,
    partitions: list[tuple[str, int]],
    *,
    timeout: float = 30.0,
    config: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], tuple[int, int]]:
    """(log start offset, last stable offset) of each partition.

    The last stable offset is where a read_committed consumer stops: below the first record of
    the oldest open transaction, or the high watermark when none is open."""
    admin = AdminClient({**(config or {}), "bootstrap.servers": bootstrap_servers})
    wanted = [TopicPartition(topic, partition) for topic, partition in partitions]

    def ask(spec: OffsetSpec, isolation: IsolationLevel) -> dict[tuple[str, int], int]:
        futures = admin.list_offsets(
            dict.fromkeys(wanted, spec), isolation_level=isolation, request_timeout=timeout
        )
        try:
            return {
                (tp.topic, tp.partition): int(future.result(timeout).offset)
                for tp, future in futures.items()
            }
        except KafkaException as exc:
            raise TopicError(f"cannot list the offsets of {partitions}: {exc}") from exc

    starts = ask(OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED)  # type: ignore[no-untyped-call]
    stable = ask(OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)  # type: ignore[no-untyped-call]
    return {key: (starts[key], stable[key]) for key in starts}
