"""The options of the exactly-once Kafka sink, read and checked once, on the driver.

Spark hands a Python data source its options in a case-insensitive map with lower-cased keys;
librdkafka property names are lower case too, so `kafka.*` options pass through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from bridge.errors import ConfigError
from bridge.names import DEFAULT_MARKER_TOPIC

KAFKA_PREFIX = "kafka."
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
# The broker's default `transaction.max.timeout.ms`; a larger client value fails init fatally.
BROKER_DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000

# librdkafka properties the sink owns: a user value would break the transaction protocol.
_RESERVED_KAFKA = {
    "transactional.id": "derived from transactional.id.prefix, the partition and the epoch",
    "enable.idempotence": "always on for transactional producers",
    "transaction.timeout.ms": "set the sink option transaction.timeout.ms instead",
}
_KNOWN = {
    "topic",
    "transactional.id.prefix",
    "transactional.id.naming",
    "transaction.timeout.ms",
    "marker.topic",
    "progress.path",
    "checkpointlocation",  # Spark passes the query's own options through as well
    "path",
}
# Kafka's legal characters for ids and topic names.
_LEGAL_NAME = re.compile(r"^[A-Za-z0-9._\-]+$")


class IdNaming(StrEnum):
    """How a write task's transactional id is named.

    `per-epoch`: `<prefix>-p<P>-e<E>`, a new id for every (partition, epoch). A replay of an epoch
    uses exactly the id of the attempt it replaces, so it fences that attempt whatever happened.
    The broker keeps every id for `transactional.id.expiration.ms` (7 days by default), so the
    state grows with partitions x epochs.

    `per-partition`: `<prefix>-p<P>`, one id per partition for the whole life of the query; the
    epoch lives only in the marker. Bounded broker state, for many partitions and short triggers.
    """

    PER_EPOCH = "per-epoch"
    PER_PARTITION = "per-partition"


@dataclass(frozen=True, kw_only=True)
class SinkOptions:
    kafka: dict[str, str] = field(repr=False)  # may hold secrets (sasl.password, ...)
    topic: str | None
    prefix: str | None  # None: derived from the query id in each task
    naming: IdNaming = IdNaming.PER_EPOCH
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    marker_topic: str = DEFAULT_MARKER_TOPIC
    progress_path: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka["bootstrap.servers"]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Check every option; refuse with the name of each offending one, all at once."""
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        problems: list[tuple[str, str]] = []
        kafka = {
            k[len(KAFKA_PREFIX) :]: v for k, v in lowered.items() if k.startswith(KAFKA_PREFIX)
        }
        for key, why in _RESERVED_KAFKA.items():
            if key in kafka:
                problems.append((KAFKA_PREFIX + key, f"not allowed: {why}"))
        if not kafka.get("bootstrap.servers", "").strip():
            problems.append(("kafka.bootstrap.servers", "required"))
        unknown = sorted(k for k in lowered if not k.startswith(KAFKA_PREFIX) and k not in _KNOWN)
        problems.extend((k, "unknown option") for k in unknown)

        topic = lowered.get("topic") or None
        prefix = lowered.get("transactional.id.prefix") or None
        marker_topic = lowered.get("marker.topic", DEFAULT_MARKER_TOPIC)
        for name, value in (("topic", topic), ("transactional.id.prefix", prefix)):
            if value is not None and not _LEGAL_NAME.match(value):
                problems.append((name, f"{value!r} may only hold letters, digits, '.', '_', '-'"))
        if not _LEGAL_NAME.match(marker_topic):
            problems.append(("marker.topic", f"{marker_topic!r} is not a legal topic name"))

        naming = IdNaming.PER_EPOCH
        raw_naming = lowered.get("transactional.id.naming", IdNaming.PER_EPOCH.value)
        try:
            naming = IdNaming(raw_naming)
        except ValueError:
            choices = ", ".join(n.value for n in IdNaming)
            problems.append(("transactional.id.naming", f"{raw_naming!r} is not one of {choices}"))

        timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS
        raw_timeout = lowered.get("transaction.timeout.ms")
        if raw_timeout is not None:
            try:
                timeout_ms = int(raw_timeout)
            except ValueError:
                problems.append(("transaction.timeout.ms", f"{raw_timeout!r} is not an integer"))
            else:
                if not 1_000 <= timeout_ms <= BROKER_DEFAULT_MAX_TRANSACTION_TIMEOUT_MS:
                    problems.append(
                        (
                            "transaction.timeout.ms",
                            f"{timeout_ms} must be between 1000 and the broker's"
                            " transaction.max.timeout.ms"
                            f" ({BROKER_DEFAULT_MAX_TRANSACTION_TIMEOUT_MS} by default),"
                            " and above the longest write task",
                        )
                    )
        if problems:
            raise ConfigError(problems, source="the bridge-kafka sink options")
        return cls(
            kafka=kafka,
            topic=topic,
            prefix=prefix,
            naming=naming,
            transaction_timeout_ms=timeout_ms,
            marker_topic=marker_topic,
            progress_path=lowered.get("progress.path") or None,
        )
