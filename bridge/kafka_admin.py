"""Kafka administration both sides and the tools share: topics, offset ranges, groups."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec, ResourceType

from bridge.errors import BridgeError
from bridge.kafka_client_log import ClientLog
from bridge.kafka_refusal import RefusalWatch


class TopicError(BridgeError):
    """A topic could not be created or described. `retriable`: the cluster did not answer in
    time or was briefly unable to; the same request may succeed later."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


def create_topic(
    bootstrap_servers: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int = -1,
    timeout: float = 30.0,
    config: Mapping[str, str | int | float | bool] | None = None,
    topic_config: Mapping[str, str] | None = None,
) -> None:
    """Create `name` and wait until it exists; an existing topic is left as it is.

    `replication_factor`: -1 takes the cluster's `default.replication.factor` (1 on a single
    node, 3 on a replicated cluster).

    `config`: extra client properties (security settings and the like).
    `topic_config`: the topic's own settings, when this call creates it."""
    admin = KafkaAdmin({**(config or {}), "bootstrap.servers": bootstrap_servers}, timeout=timeout)
    admin.create_topic(
        name,
        partitions=partitions,
        replication_factor=replication_factor,
        topic_config=topic_config,
    )


def offset_range(
    bootstrap_servers: str,
    partitions: list[tuple[str, int]],
    *,
    timeout: float = 30.0,
    config: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], tuple[int, int]]:
    """(log start offset, last stable offset) of each partition."""
    admin = KafkaAdmin({**(config or {}), "bootstrap.servers": bootstrap_servers}, timeout=timeout)
    return {
        key: (log.log_start, log.last_stable) for key, log in admin.log_ranges(partitions).items()
    }


T = TypeVar("T")
_REFUSAL_CHECK_S = 0.5  # how often a request's wait looks for a refusal of the client

PartitionKey = tuple[str, int]
"""(topic, partition)."""

# While a group rebalances, partitions are in flight between members: where the broker reports
# the members' target assignments (the consumer protocol of KIP-848), those count as held too.
_REBALANCING = {ConsumerGroupState.PREPARING_REBALANCING, ConsumerGroupState.COMPLETING_REBALANCING}


@dataclass(frozen=True)
class LogRange:
    """The offsets of one partition's log.

    `last_stable` is where a read_committed consumer stops: below the first record of the oldest
    open transaction, or the high watermark when none is open."""

    log_start: int
    last_stable: int
    high_watermark: int


class KafkaAdmin:
    """The questions the operator tools ask Kafka, each answered or refused with a TopicError."""

    def __init__(
        self, client_config: Mapping[str, str | int | float], *, timeout: float = 30.0
    ) -> None:
        self._config = dict(client_config)
        self._watch = RefusalWatch()
        self._log = ClientLog()
        config: dict[str, Any] = {
            **self._config,
            "error_cb": self._watch,
            "logger": self._log.logger,
        }
        self._admin = AdminClient(config)
        self._timeout = timeout
        self._metadata_known = False  # see `_ask_offsets`

    def _result(self, future: concurrent.futures.Future[T]) -> T:
        """The request's answer, waited for at most the timeout. A refusal of this client's
        credentials or TLS ends the wait at once: waiting does not mend it, and the request
        would only time out."""
        deadline = time.monotonic() + self._timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return future.result(timeout=max(0.0, min(_REFUSAL_CHECK_S, left)))
            except concurrent.futures.TimeoutError:
                self._admin.poll(0)  # serves the error callback
                if self._watch.refused is not None or left <= _REFUSAL_CHECK_S:
                    raise

    def _error(self, what: str, exc: BaseException) -> TopicError:
        """`what` failed with `exc`. A request that failed because the brokers refused this
        client's credentials or TLS says so and what to check, and is not worth retrying; one
        the cluster did not answer in time, or was briefly unable to, is."""
        cause = self._log.cause(self._admin)  # its poll serves the error callback too
        refused = self._watch.refused
        if refused is not None:
            return TopicError(f"{what}: the brokers refused this client: {refused}")
        if isinstance(exc, KafkaException):
            error: KafkaError = exc.args[0]
            return TopicError(f"{what}: {error.str()}{cause}", retriable=error.retriable())
        servers = self._config.get("bootstrap.servers")
        return TopicError(
            f"{what}: no answer from {servers} in {self._timeout:.0f}s{cause}", retriable=True
        )

    def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        replication_factor: int,
        topic_config: Mapping[str, str] | None = None,
    ) -> bool:
        """See `create_topic`; `topic_config`: the topic's own settings (`min.insync.replicas`,
        `retention.ms`, ...). Returns False when the topic existed already (left as it is)."""
        new = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=dict(topic_config or {}),
        )
        futures = self._admin.create_topics(
            [new], operation_timeout=self._timeout, request_timeout=self._timeout
        )
        try:
            self._result(futures[name])
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise self._error(f"cannot create topic {name!r}", exc) from exc
            return False
        except concurrent.futures.TimeoutError as exc:
            raise self._error(f"cannot create topic {name!r}", exc) from None
        return True

    def topic_configs(self, name: str) -> dict[str, str]:
        """The topic's effective settings (its own, or the brokers' defaults it takes), by
        name. Raises TopicError, naming the refusal when the principal may not describe them
        (`DescribeConfigs` on the topic)."""
        resource = ConfigResource(ResourceType.TOPIC, name)
        futures = self._admin.describe_configs([resource], request_timeout=self._timeout)
        try:
            entries = self._result(futures[resource])
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            raise self._error(f"cannot describe topic {name!r}'s settings", exc) from None
        return {key: entry.value for key, entry in entries.items() if entry.value is not None}

    def partitions(self, topic: str) -> list[int]:
        # describe_topics, unlike a metadata request, never creates the topic it asks about.
        futures = self._admin.describe_topics(
            TopicCollection([topic]), request_timeout=self._timeout
        )
        try:
            description = self._result(futures[topic])
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            raise self._error(f"topic {topic!r}", exc) from exc
        return sorted(p.id for p in description.partitions)

    def log_ranges(self, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, LogRange]:
        wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
        if not wanted:
            return {}
        earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        asked = [
            self._ask_offsets(wanted, earliest, IsolationLevel.READ_UNCOMMITTED),
            self._ask_offsets(wanted, latest, IsolationLevel.READ_COMMITTED),
            self._ask_offsets(wanted, latest, IsolationLevel.READ_UNCOMMITTED),
        ]
        starts, stable, high = (self._offsets_of(wanted, futures) for futures in asked)
        return {key: LogRange(starts[key], stable[key], high[key]) for key in starts}

    def offsets_at(
        self, partitions: Iterable[PartitionKey], timestamp_ms: int
    ) -> dict[PartitionKey, int | None]:
        """The first offset whose record timestamp is at or after `timestamp_ms`; None where
        every record is older."""
        wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
        spec = OffsetSpec.for_timestamp(timestamp_ms)
        found = self._list_offsets(wanted, spec, IsolationLevel.READ_COMMITTED)
        return {key: (offset if offset >= 0 else None) for key, offset in found.items()}

    def committed_records_from(
        self, positions: Mapping[PartitionKey, int], *, timeout: float = 5.0
    ) -> set[PartitionKey]:
        """Those partitions where a read_committed consumer starting at the given offset still
        gets a record. The offsets between a stored position and the last stable offset may be
        only transaction markers and aborted records; this tells them from real lag."""
        if not positions:
            return set()
        consumer = Consumer({**self._config, "group.id": "bridge-tools-probe",
                             "isolation.level": "read_committed", "enable.auto.commit": False,
                             "enable.partition.eof": True, "logger": self._log.logger})  # fmt: skip
        try:
            consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in positions.items()])
            pending, found = set(positions), set()
            deadline = time.monotonic() + timeout
            while pending and time.monotonic() < deadline:
                for message in consumer.consume(len(pending), 0.5):
                    key = (message.topic() or "", message.partition() or 0)
                    error = message.error()
                    if error is None:
                        found.add(key)
                    elif error.code() != KafkaError._PARTITION_EOF:
                        continue
                    pending.discard(key)
                    consumer.pause([TopicPartition(*key)])
            return found | pending  # unanswered: assume there is something to read
        finally:
            consumer.close()

    def owners(self, group: str) -> dict[PartitionKey, str]:
        """The partitions a live member of `group` holds, each with `client_id@host` of its
        member. A partition in flight during a rebalance of the classic protocol may be missing;
        that is safe for a reset: the member that claims it reads the reset offset, or is fenced
        by the reset and claims it again."""
        future = self._admin.describe_consumer_groups([group], request_timeout=self._timeout)
        try:
            description = self._result(future[group])
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            raise self._error(f"cannot describe consumer group {group!r}", exc) from exc
        held: dict[PartitionKey, str] = {}
        for member in description.members:
            who = f"{member.client_id}@{member.host.lstrip('/')}"
            for tp in member.assignment.topic_partitions:
                held[(tp.topic, tp.partition)] = who
            if description.state in _REBALANCING:
                held.update(dict.fromkeys(self._subscribed(member), f"{who} (rebalancing)"))
        return held

    def _subscribed(self, member: object) -> list[PartitionKey]:
        target = getattr(member, "target_assignment", None)
        return [(tp.topic, tp.partition) for tp in getattr(target, "topic_partitions", [])]

    def group_ids(self, prefix: str) -> list[str]:
        try:
            listing = self._result(self._admin.list_consumer_groups(request_timeout=self._timeout))
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            raise self._error("cannot list consumer groups", exc) from exc
        return sorted(g.group_id for g in listing.valid if g.group_id.startswith(prefix))

    def stable_committed(self, group: str, partitions: list[PartitionKey]) -> list[TopicPartition]:
        """The committed offsets of `group`, waiting out transactions that are still open."""
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(topic, partition) for topic, partition in partitions]
        )
        futures = self._admin.list_consumer_group_offsets(
            [request], require_stable=True, request_timeout=self._timeout
        )
        try:
            result = self._result(futures[group])
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            raise self._error(f"cannot read the offsets of group {group!r}", exc) from exc
        return list(result.topic_partitions or [])

    def _list_offsets(
        self, wanted: list[TopicPartition], spec: OffsetSpec, isolation: IsolationLevel
    ) -> dict[PartitionKey, int]:
        return self._offsets_of(wanted, self._ask_offsets(wanted, spec, isolation))

    def _ask_offsets(
        self, wanted: list[TopicPartition], spec: OffsetSpec, isolation: IsolationLevel
    ) -> dict[TopicPartition, concurrent.futures.Future[Any]]:
        if not self._metadata_known:
            # A new client's ListOffsets waits about a second for the partitions' leaders when
            # its metadata cache is empty, one request after the other (1 run in 4 of `bridge
            # status` took 3 s longer); one metadata request first fills the cache.
            self._metadata_known = True
            with contextlib.suppress(KafkaException):  # the requests below say what is wrong
                self._admin.list_topics(timeout=self._timeout)
        return self._admin.list_offsets(
            dict.fromkeys(wanted, spec), isolation_level=isolation, request_timeout=self._timeout
        )

    def _offsets_of(
        self,
        wanted: list[TopicPartition],
        futures: dict[TopicPartition, concurrent.futures.Future[Any]],
    ) -> dict[PartitionKey, int]:
        try:
            return {
                (tp.topic, tp.partition): int(self._result(future).offset)
                for tp, future in futures.items()
            }
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in wanted)
            raise self._error(f"cannot list the offsets of {names}", exc) from exc
