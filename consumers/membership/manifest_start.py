"""Where a group starts reading the epoch manifest when it has never read it.

The manifest topic is shared by every query of every group and keeps `epochs.retention.ms` of
parts. Read from its log start, a new group's start grew with that history: about 5,700
manifest records a second, so a week of one query at a 1 s trigger and 8 Spark partitions (5.4
million records) took a quarter of an hour, mostly other queries' parts, and parts of epochs
whose records are long gone from the group's own topics.

What a group needs are the parts of the epochs whose records it will read: those at or after
its start on each whole topic's partitions. A part is written in its task's transaction by the
producer that writes the task's records, so its timestamp is theirs; the parts of one epoch
are written while the epoch runs. So a never-read manifest partition starts
`epochs_manifest_lookback_ms` (an hour by default) before
the earliest record the group will read (the first one at its start on each whole topic's
partition, read once by a consumer of its own), or before now when there is none yet
(topics still empty). Under `start_policy: latest` it starts at its end, as the group's
topics do: the parts of epochs written before would open epochs whose records the group never
reads. An epoch that ran for longer than the lookback
before the group's first record may have a part before that start: the group then names it on
`/readyz` with the way out, as it names a part that retention deleted. Whatever cannot be read
in its bound (a leader away, a transaction open at the start) starts the manifest at its log
start, as before: slower, never less; so does a lookback of 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from confluent_kafka import Consumer, KafkaException, TopicPartition

from consumers.database.offsets import PartitionKey

log = logging.getLogger("bridge.consumer")

# The default of `epochs_manifest_lookback_ms`: longer than an epoch's tasks run apart (seconds
# at the triggers users pick, minutes for an epoch that catches up a backlog), and a margin for
# the clocks of the producers.
LOOKBACK_S = 3600.0
# Each request's bound: `prepare` runs before the member joins, `offset` inside Kafka's
# rebalance callback, beside the log-range queries.
_ASK_S = 5.0
_PROBE_S = 5.0
_POLL_S = 0.2


class ManifestStart:
    """The start of a manifest partition the group never read: `prepare` (before the member
    joins its group, outside Kafka's callbacks) finds the first record the group will read,
    and `offset` (inside the claim, in the rebalance callback) asks where the lookback before
    it falls on the manifest."""

    def __init__(
        self,
        *,
        manifest_topic: str,
        whole_topic: Callable[[str], bool],
        earliest: bool,
        probe_config: Mapping[str, Any],
        stored: Callable[[list[PartitionKey]], Mapping[PartitionKey, int]],
        lookback_s: float = LOOKBACK_S,
    ) -> None:
        self.topic = manifest_topic
        self._whole_topic = whole_topic
        self._earliest = earliest
        self._probe_config = dict(probe_config)
        self._stored = stored  # the group's stored next offsets of those partitions that have one
        self._lookback_ms = int(lookback_s * 1000)
        self._since_ms: int | None = None  # the first record's time, once `prepare` found it
        self._why = "its first records were not looked for"

    def prepare(self) -> None:
        """Find the first record the group will read of its whole topics, when the group has
        never read the manifest and will read it from a lookback; bounded (a few seconds)."""
        if not self._earliest or self._lookback_ms == 0 or self._stored([(self.topic, 0)]):
            return
        probe = Consumer(self._probe_config)
        try:
            self._since_ms, self._why = self._first_record_ms(probe)
        except KafkaException as exc:
            self._since_ms, self._why = None, f"its first records could not be read: {exc}"
        finally:
            probe.close()

    def offset(self, consumer: Consumer, key: PartitionKey, log_range: tuple[int, int]) -> int:
        """Where the group starts reading manifest partition `key` (log start and end in
        `log_range`): the lookback before its first record on its whole topics, or the log
        start when that is not known; its end under `start_policy: latest`."""
        low, high = log_range
        if not self._earliest:
            # The group reads its topics from their end: the parts of epochs written before
            # would open epochs whose records it never reads, each held for ever.
            return high
        if self._lookback_ms == 0:
            return low  # the whole history, as asked
        if self._since_ms is None:
            log.warning("%s[%d] read from its log start: %s", *key, self._why)
            return low
        try:
            found = consumer.offsets_for_times(
                [TopicPartition(key[0], key[1], max(0, self._since_ms - self._lookback_ms))],
                timeout=_ASK_S,
            )[0]
        except KafkaException as exc:
            log.warning("%s[%d] read from its log start: %s", *key, exc.args[0])
            return low
        # No record that late: the log's end. Never below the log start (retention moved it).
        start = high if found.offset < 0 else min(max(found.offset, low), high)
        log.info(
            "%s[%d] never read by this group: read from offset %d (log %d-%d), %.0f s before "
            "%s",
            *key, start, low, high, self._lookback_ms / 1000, self._why,
        )  # fmt: skip
        return start

    def _first_record_ms(self, probe: Consumer) -> tuple[int | None, str]:
        """The timestamp of the earliest record the group will read on its whole topics (now
        when it will read none yet), and what it is; None with why when it cannot be known."""
        now_ms = int(time.time() * 1000)
        listed = probe.list_topics(timeout=_ASK_S).topics
        keys = [
            (topic, partition)
            for topic, found in listed.items()
            if topic != self.topic and self._whole_topic(topic)
            for partition in found.partitions
        ]
        stored = self._stored(keys) if keys else {}
        starts: dict[PartitionKey, int] = {}
        for key in keys:
            low, high = probe.get_watermark_offsets(
                TopicPartition(*key), timeout=_ASK_S, cached=False
            )
            start = max(stored.get(key, low), low)
            if start < high:  # a record to read there now
                starts[key] = start
        if not starts:
            return now_ms, "now (no record of its whole topics to read yet)"
        firsts = self._first_timestamps(probe, starts)
        if firsts is None:
            return None, (
                f"the first records of {len(starts)} whole-topic partition(s) could not be "
                f"read in {_PROBE_S:.0f} s"
            )
        first_ms = min([now_ms, *firsts.values()])
        return first_ms, f"the first record it reads on its whole topics ({len(starts)} partitions)"

    def _first_timestamps(
        self, probe: Consumer, starts: Mapping[PartitionKey, int]
    ) -> dict[PartitionKey, int] | None:
        """The timestamp of the first committed record at or after each start (the probe is
        assigned, never in a group); None when one is not read in time."""
        probe.assign([TopicPartition(*key, offset) for key, offset in starts.items()])
        firsts: dict[PartitionKey, int] = {}
        deadline = time.monotonic() + _PROBE_S
        while len(firsts) < len(starts) and time.monotonic() < deadline:
            message = probe.poll(_POLL_S)
            if message is None or message.error() is not None:
                continue
            key = (cast(str, message.topic()), cast(int, message.partition()))
            if key in firsts:
                continue
            firsts[key] = message.timestamp()[1]
            probe.pause([TopicPartition(*key)])
        # A record without a timestamp (-1) tells nothing: as good as none read.
        return firsts if len(firsts) == len(starts) and min(firsts.values()) >= 0 else None
