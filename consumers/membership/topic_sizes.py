"""How many partitions each whole-epoch topic has, and whether this member holds them all: what
lets the assembly (`consumers.epochs.assembly`) hold an epoch's records in memory.

Kafka is asked between batches, from the poll loop (`refresh`), never from inside a batch: the
assembly's question (`held_in_full`) reads only what the last answer said, and a topic it has no
answer for yet counts as not held in full (its epochs are staged, as any member's may be) and is
asked about before the next poll. Topics grow, so each count is asked again after `ttl_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaException

from consumers.partitions import PartitionTable

_TTL_S = 30.0
_TIMEOUT_S = 2.0  # a broker that does not answer soon: the topic's epochs are staged meanwhile


class TopicSizes:
    def __init__(
        self,
        partitions: PartitionTable,
        topics: Iterable[str] = (),
        *,
        ttl_s: float = _TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._partitions = partitions
        self._ttl_s = ttl_s
        self._clock = clock
        self._sizes: dict[str, tuple[float, int | None]] = {}  # topic: (asked at, count)
        self._wanted: set[str] = set(topics)  # the routes' named topics, asked before a poll

    def held_in_full(self, topic: str) -> bool:
        """Whether this member holds every partition of `topic`, by the last count Kafka gave;
        no I/O. A topic never counted, or counted too long ago, is asked about next."""
        asked = self._sizes.get(topic)
        if asked is None or self._clock() - asked[0] >= self._ttl_s:
            self._wanted.add(topic)
        count = None if asked is None else asked[1]
        held = sum(1 for lease in self._partitions.leases() if lease.topic == topic)
        return count is not None and held >= count

    def wanted(self) -> bool:
        return bool(self._wanted)

    def refresh(self, consumer: Consumer) -> None:
        """Between batches: Kafka's partition count of each topic asked about since."""
        wanted, self._wanted = sorted(self._wanted), set()
        for topic in wanted:
            count = None
            try:
                found = consumer.list_topics(topic, timeout=_TIMEOUT_S).topics
                if topic in found and found[topic].error is None:
                    count = len(found[topic].partitions)
            except KafkaException:
                pass  # not known now: its epochs are staged, and it is asked again after ttl_s
            self._sizes[topic] = (self._clock(), count)
