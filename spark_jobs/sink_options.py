"""The options of the exactly-once Kafka sink, read and checked once, on the driver.

Spark hands a Python data source its options in a case-insensitive map with lower-cased keys;
librdkafka property names are lower case too, so `kafka.*` options pass through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from bridge.errors import ConfigError
from bridge.names import DEFAULT_EPOCHS_TOPIC, DEFAULT_MARKER_TOPIC

KAFKA_PREFIX = "kafka."
REGISTRY_PREFIX = "schema.registry."  # `schema.registry.url` and the registry client's settings
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
# The broker's default `transaction.max.timeout.ms`; a larger client value fails init fatally.
BROKER_DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000

# librdkafka properties the sink owns: a user value would break the transaction protocol.
_RESERVED_KAFKA = {
    "transactional.id": "derived from transactional.id.prefix, the partition and the epoch",
    "enable.idempotence": "always on for transactional producers",
    "transaction.timeout.ms": "set the sink option transaction.timeout.ms instead",
}
# The manifest's retention when the sink creates its topic: Kafka's default for every topic
# (`log.retention.hours`: 7 days), which the records' topics take unless told otherwise.
DEFAULT_EPOCHS_RETENTION_MS = 7 * 24 * 3600 * 1000
_MIN_EPOCHS_RETENTION_MS = 3600 * 1000

_KNOWN = {
    "topic",
    "topics",
    "transactional.id.prefix",
    "transactional.id.naming",
    "transaction.timeout.ms",
    "marker.topic",
    "progress.path",
    "epochs",
    "epochs.topic",
    "epochs.retention.ms",
    # Spark passes the query's own settings to its sink as options as well: refusing them would
    # refuse every query that names itself (`.queryName(...)`) or checkpoints by option.
    "checkpointlocation",
    "queryname",
    "path",
    "value.format",
    "key.format",
    "subject.name.strategy",
    "value.record.name",
    "key.record.name",
    "record.namespace",
    # A user's own Protobuf schema, instead of the one derived from the DataFrame's.
    "value.proto.file",
    "value.proto.message",
    "key.proto.file",
    "key.proto.message",
}
# Kafka's legal characters for ids and topic names.
_LEGAL_NAME = re.compile(r"^[A-Za-z0-9._\-]+$")
_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_TOPICS = 1_000  # of a `topic` column, each registered at `encode` and a branch of its CASE


class IdNaming(StrEnum):
    """How a write task's transactional id is named.

    `pooled` (the default): `<prefix>-p<P>-s<E mod ID_POOL_SIZE>`, a pool of ids per partition
    indexed by the epoch. Every attempt of one (partition, epoch) has the same id, so a retry or a
    replay fences the attempt it replaces, as with `per-epoch`; the brokers hold partitions x
    pool ids for the life of the query, whatever its age.

    `per-epoch`: `<prefix>-p<P>-e<E>`, a new id for every (partition, epoch). A replay of an epoch
    uses exactly the id of the attempt it replaces, so it fences that attempt whatever happened.
    The broker keeps every id for `transactional.id.expiration.ms` (7 days by default), so the
    state grows with partitions x epochs.

    `per-partition`: `<prefix>-p<P>`, one id per partition for the whole life of the query; the
    epoch lives only in the marker. Bounded broker state, for many partitions and short triggers.
    """

    POOLED = "pooled"
    PER_EPOCH = "per-epoch"
    PER_PARTITION = "per-partition"


# Two ids per partition, not one: consecutive epochs of a partition never share an id, so an
# epoch's task never initialises an id whose last transaction (the epoch before's, or one of
# its stragglers) may still be finishing, and `bridge txn abort --epoch E` fences only E's.
ID_POOL_SIZE = 2


class ValueFormat(StrEnum):
    """How a record's value (or key) is written. `json`: the column's text or bytes as they are
    (a JSON document, by convention). `avro`, `json-schema` and `protobuf`: a struct column as
    Avro, as JSON with a registered JSON Schema, or as Protobuf, in the schema registry's wire
    format (magic byte, schema id, Protobuf's message indexes, body), by
    `spark_jobs.registry_frames.encode`."""

    JSON = "json"
    AVRO = "avro"
    JSON_SCHEMA = "json-schema"
    PROTOBUF = "protobuf"

    @property
    def registered(self) -> bool:
        """Whether values of this format go through the schema registry."""
        return self is not ValueFormat.JSON


class Epochs(StrEnum):
    """What the sink tells readers about its epochs. `whole` (the default): each task also
    writes its part of the epoch manifest in its transaction, and the driver writes the
    epoch's record once every task succeeded (`bridge.epoch_manifest`), so that a consumer can
    publish the epoch at once. `per-partition`: nothing beyond each record's provenance
    headers; each write task's transaction stands alone."""

    PER_PARTITION = "per-partition"
    WHOLE = "whole"


class SubjectStrategy(StrEnum):
    """Under which registry subject a schema goes: `topic` (`<topic>-value`, `<topic>-key`,
    Confluent's TopicNameStrategy) or `record` (the record's full name, RecordNameStrategy)."""

    TOPIC = "topic"
    RECORD = "record"


@dataclass(frozen=True, kw_only=True)
class SinkOptions:
    kafka: dict[str, str] = field(repr=False)  # may hold secrets (sasl.password, ...)
    topic: str | None
    prefix: str | None  # None: derived from the query id in each task
    naming: IdNaming = IdNaming.POOLED
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    marker_topic: str = DEFAULT_MARKER_TOPIC
    progress_path: str | None = None
    epochs: Epochs = Epochs.WHOLE
    epochs_topic: str = DEFAULT_EPOCHS_TOPIC
    # How long the manifest keeps an epoch's parts: what a consumer group lagging, or started
    # from the earliest records, still needs of epochs whose records it reads. -1: for ever.
    epochs_retention_ms: int = DEFAULT_EPOCHS_RETENTION_MS
    value_format: ValueFormat = ValueFormat.JSON
    key_format: ValueFormat = ValueFormat.JSON
    registry: dict[str, str] = field(default_factory=dict, repr=False)  # may hold credentials
    subject_strategy: SubjectStrategy = SubjectStrategy.TOPIC
    value_record_name: str | None = None  # default: `<topic>_value`, see registry_frames
    key_record_name: str | None = None
    record_namespace: str = "bridge"
    # The topics a `topic` column may name, for the topic strategy's subjects (`<topic>-value`):
    # each registered before the query starts, since a running query never asks the registry.
    topics: tuple[str, ...] = ()
    # A `.proto` file (on the driver) and a message of it, by column ("value", "key"), that
    # `protobuf` writes with instead of deriving a schema; the message None: its first.
    proto_files: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    @property
    def typed(self) -> bool:
        """Whether any column goes through the schema registry."""
        return self.value_format.registered or self.key_format.registered

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
        registry = {
            k.removeprefix(REGISTRY_PREFIX): v
            for k, v in lowered.items()
            if k.startswith(REGISTRY_PREFIX)
        }
        unknown = sorted(
            k
            for k in lowered
            if not k.startswith((KAFKA_PREFIX, REGISTRY_PREFIX)) and k not in _KNOWN
        )
        problems.extend((k, "unknown option") for k in unknown)

        topic = lowered.get("topic") or None
        prefix = lowered.get("transactional.id.prefix") or None
        marker_topic = lowered.get("marker.topic", DEFAULT_MARKER_TOPIC)
        for name, value in (("topic", topic), ("transactional.id.prefix", prefix)):
            if value is not None and not _LEGAL_NAME.match(value):
                problems.append((name, f"{value!r} may only hold letters, digits, '.', '_', '-'"))
        epochs_topic = lowered.get("epochs.topic", DEFAULT_EPOCHS_TOPIC)
        for name, value in (("marker.topic", marker_topic), ("epochs.topic", epochs_topic)):
            if not _LEGAL_NAME.match(value):
                problems.append((name, f"{value!r} is not a legal topic name"))
        epochs = _choice(lowered, "epochs", Epochs.WHOLE, problems)
        if epochs_topic in (marker_topic, lowered.get("topic")):
            problems.append(("epochs.topic", f"{epochs_topic!r} must be a topic of its own"))

        naming = _choice(lowered, "transactional.id.naming", IdNaming.POOLED, problems)
        retention_ms = _integer(
            lowered, "epochs.retention.ms", DEFAULT_EPOCHS_RETENTION_MS, problems,
            allowed=lambda ms: ms == -1 or ms >= _MIN_EPOCHS_RETENTION_MS,
            rule=f"must be -1 (for ever) or at least {_MIN_EPOCHS_RETENTION_MS} (an hour), and "
            "at least as long as the records' topics keep theirs",
        )  # fmt: skip

        timeout_ms = _integer(
            lowered, "transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS, problems,
            allowed=lambda ms: 1_000 <= ms <= BROKER_DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
            rule="must be between 1000 and the broker's transaction.max.timeout.ms "
            f"({BROKER_DEFAULT_MAX_TRANSACTION_TIMEOUT_MS} by default), and above the longest "
            "write task",
        )  # fmt: skip
        formats = {}
        for name in ("value.format", "key.format"):
            raw_format = lowered.get(name, ValueFormat.JSON.value)
            try:
                formats[name] = ValueFormat(raw_format)
            except ValueError:
                choices = ", ".join(f.value for f in ValueFormat)
                problems.append((name, f"{raw_format!r} is not one of {choices}"))
                formats[name] = ValueFormat.JSON
        typed = any(f.registered for f in formats.values())
        if typed and not registry.get("url", "").strip():
            problems.append(("schema.registry.url", "required with avro, json-schema or protobuf"))
        elif typed:
            # Here, not at the top: the executors parse the options too, and never need it.
            from bridge.registry_properties import client_properties

            try:
                settings = {k: v for k, v in registry.items() if k != "url"}
                client_properties(registry["url"], settings)
            except ValueError as exc:
                problems.append((REGISTRY_PREFIX.rstrip("."), str(exc)))
        strategy = _choice(lowered, "subject.name.strategy", SubjectStrategy.TOPIC, problems)
        for name in ("value.record.name", "key.record.name"):
            if name in lowered and not _AVRO_NAME.match(lowered[name]):
                problems.append((name, f"{lowered[name]!r} is not an Avro name"))
        topics = tuple(dict.fromkeys(t.strip() for t in lowered.get("topics", "").split(",")
                                     if t.strip()))  # fmt: skip
        problems += _topics_problems(topics, topic=topic, typed=typed, strategy=strategy)
        proto_files: dict[str, tuple[str, str | None]] = {}
        for column in ("value", "key"):
            path = lowered.get(f"{column}.proto.file")
            message = lowered.get(f"{column}.proto.message") or None
            if path is None and message is None:
                continue
            if formats[f"{column}.format"] is not ValueFormat.PROTOBUF:
                problems.append((f"{column}.proto.file" if path else f"{column}.proto.message",
                                 f"a Protobuf schema of your own needs {column}.format "
                                 "protobuf"))  # fmt: skip
            elif not path:
                problems.append((f"{column}.proto.file", f"{column}.proto.message names a "
                                 "message of a .proto file: give the file"))  # fmt: skip
            else:
                proto_files[column] = (path, message)
        namespace = lowered.get("record.namespace", "bridge")
        if namespace and not all(_AVRO_NAME.match(part) for part in namespace.split(".")):
            problems.append(("record.namespace", f"{namespace!r} is not an Avro namespace"))
        if problems:
            raise ConfigError(problems, source="the bridge-kafka sink options")
        return cls(
            kafka=kafka,
            topic=topic,
            prefix=prefix,
            naming=naming,
            transaction_timeout_ms=timeout_ms,
            marker_topic=marker_topic,
            epochs=epochs,
            epochs_topic=epochs_topic,
            epochs_retention_ms=retention_ms,
            progress_path=lowered.get("progress.path") or None,
            value_format=formats["value.format"],
            key_format=formats["key.format"],
            registry=registry,
            subject_strategy=strategy,
            value_record_name=lowered.get("value.record.name") or None,
            key_record_name=lowered.get("key.record.name") or None,
            record_namespace=namespace,
            topics=topics,
            proto_files=proto_files,
        )


_Choice = TypeVar("_Choice", bound=StrEnum)


def _topics_problems(
    topics: tuple[str, ...], *, topic: str | None, typed: bool, strategy: SubjectStrategy
) -> list[tuple[str, str]]:
    """The `topics` option against the others: it names a `topic` column's topics, whose
    subjects the topic strategy registers (`spark_jobs.registry_frames.encode`)."""
    problems = [("topics", f"{t!r} is not a legal topic name") for t in topics
                if not _LEGAL_NAME.match(t) or len(t) > 249]  # fmt: skip
    if len(topics) > MAX_TOPICS:
        problems.append(("topics", f"{len(topics)} topics, more than {MAX_TOPICS}"))
    if topics and topic is not None:
        problems.append(("topics", "with the topic option every record goes to that topic: "
                         "name a topic column's topics only without it"))  # fmt: skip
    elif topics and not (typed and strategy is SubjectStrategy.TOPIC):
        problems.append(("topics", "names the subjects of the topic strategy: only with "
                         "value.format or key.format avro, json-schema or protobuf"))  # fmt: skip
    elif typed and strategy is SubjectStrategy.TOPIC and topic is None and not topics:
        problems.append((
            "subject.name.strategy",
            "topic (the default) registers the schema under each topic's subject, "
            "<topic>-value: without the topic option (a topic column), name the column's "
            "topics in the topics option (topics=orders,refunds), or set "
            "subject.name.strategy=record",
        ))  # fmt: skip
    return problems


def _integer(
    lowered: Mapping[str, str],
    name: str,
    default: int,
    problems: list[tuple[str, str]],
    *,
    allowed: Callable[[int], bool],
    rule: str,
) -> int:
    """Option `name` as an integer that `allowed` takes, or `default` with the problem noted
    (the value and `rule`)."""
    raw = lowered.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        problems.append((name, f"{raw!r} is not an integer"))
        return default
    if not allowed(value):
        problems.append((name, f"{value} {rule}"))
    return value


def _choice(
    lowered: Mapping[str, str], name: str, default: _Choice, problems: list[tuple[str, str]]
) -> _Choice:
    """Option `name` as one of `default`'s enum, or `default` with the problem noted."""
    raw = lowered.get(name, default.value)
    try:
        return type(default)(raw)
    except ValueError:
        choices = ", ".join(choice.value for choice in type(default))
        problems.append((name, f"{raw!r} is not one of {choices}"))
        return default
