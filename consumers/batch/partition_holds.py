"""Partitions held at a record while the member's other partitions go on.

Three faults hold partitions, not the member: a writer schema the route's followed table cannot
take (TableMismatch), a topic a pattern matched whose table cannot take its records yet
(RouteUnresolved), and a record of an `on_record_error: stop` route that cannot be written
(RecordStopped). Each is about one table or one record, so the member's other topics, and the
partitions whose records fit, have no reason to wait. So does one wait of the normal flow:
records of no epoch (another producer's) on a whole route, behind records of an epoch staged
and not yet published, which would overwrite them at its publication (woken by it).
The held partitions are paused in the
Kafka client at their records, their offsets not advanced (nothing is lost or dead-lettered),
and resumed from their stored offsets when their wait is over, so that their records come and
are tried again. A hold ends for a partition when a batch commits past its record, when an
operator moves its offset past it (`bridge offsets reset`), or when the partition leaves the
member: on an idle topic too, where no batch comes to end it.

The database refusing writes and the registry out of reach hold the member instead
(`BatchLifecycle.retry_at`): they concern every record alike.

Each (kind, topic) has one growing wait (`consumers.backoff.HoldBackoff`), its `/readyz` reason
naming the partitions and offsets it holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from consumers.backoff import HoldBackoff
from consumers.database.offsets import PartitionKey

log = logging.getLogger("bridge.consumer")


@dataclass
class _Hold:
    backoff: HoldBackoff
    at: dict[PartitionKey, int]  # each held partition's record
    paused: bool = True  # False from its resumption until its records fail or pass again


class PartitionHolds:
    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._holds: dict[tuple[str, str], _Hold] = {}  # by (kind, topic)

    def hold(
        self, kind: str, make: Callable[[], HoldBackoff], why: str, at: Mapping[PartitionKey, int]
    ) -> None:
        """Pause the partitions of `at` at their records, for `why`; their wait grows with
        each failure of the same kind on the same topic."""
        by_topic: dict[str, dict[PartitionKey, int]] = {}
        for key, offset in at.items():
            by_topic.setdefault(key[0], {})[key] = offset
        for topic, of_topic in by_topic.items():
            held = self._holds.get((kind, topic))
            if held is None:
                held = self._holds[(kind, topic)] = _Hold(make(), {})
            held.at.update(of_topic)
            held.paused = True
            held.backoff.failed(f"{why}; held: {_where(held.at)}", held.at)
        self._pause(list(at))

    def wake(self, kind: str) -> None:
        """What the holds of `kind` wait for may be over: their partitions resume now."""
        for (of_kind, _), held in self._holds.items():
            if of_kind == kind:
                held.backoff.wake()

    def held(self, key: PartitionKey) -> bool:
        """Whether `key` waits, paused: records of it that a poll still brings are dropped (and
        fetched again when it resumes)."""
        return any(h.paused and key in h.at for h in self._holds.values())

    def repause(self, key: PartitionKey) -> None:
        """A held partition delivered records (assigned again by a rebalance, which resumes
        it): pause it once more."""
        self._pause([key])

    def due(self, now: float | None = None) -> list[PartitionKey]:
        """The partitions whose wait is over: to resume from their stored offsets, now."""
        now = time.monotonic() if now is None else now
        found: list[PartitionKey] = []
        for held in self._holds.values():
            if held.paused and held.backoff.retry_at <= now:
                held.paused = False
                found += held.at
        return found

    def committed(self, advanced: Mapping[PartitionKey, int]) -> None:
        """A batch committed: partitions it advanced past their record are held no more."""
        self.release(lambda key, offset: advanced.get(key, offset) > offset)

    def release(self, moved_past: Callable[[PartitionKey, int], bool]) -> list[PartitionKey]:
        """End the hold of every partition `moved_past` says is past its record (or gone);
        returns those that were paused, for the caller to resume."""
        resumed: list[PartitionKey] = []
        for (kind, topic), held in list(self._holds.items()):
            passed = [key for key, offset in held.at.items() if moved_past(key, offset)]
            if not passed:
                continue
            if held.paused:
                resumed += passed
            for key in passed:
                del held.at[key]
            if not held.at:
                log.info("%s: no partition of topic %s is held any more", kind, topic)
                held.backoff.cleared()
                del self._holds[(kind, topic)]
        return resumed

    def reasons(self) -> list[str]:
        return [reason for held in self._holds.values() for reason in held.backoff.reasons()]

    def _pause(self, keys: list[PartitionKey]) -> None:
        try:
            self._consumer.pause([TopicPartition(topic, partition) for topic, partition in keys])
        except KafkaException as exc:  # not assigned any more: nothing to pause
            log.info("held partitions not paused: %s", exc)


def _where(at: Mapping[PartitionKey, int]) -> str:
    """`topic[partition]@offset`, for the reason to name each held record."""
    return ", ".join(f"{topic}[{part}]@{offset}" for (topic, part), offset in sorted(at.items()))
