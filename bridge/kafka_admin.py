"""Kafka administration both sides and the tools share: topics and their offset ranges."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
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
