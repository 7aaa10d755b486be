"""Settings: one YAML file, overridden by `BRIDGE_*` environment variables, over `stack.env`.

Precedence, highest first: keyword arguments, the process environment, the YAML file named by
`--config` (or `BRIDGE_CONFIG`), then `stack.env` written by `bridge stack up`. Unknown keys and
bad values are refused with the dotted path of the offending key (`consumer.routes.0.mode`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Final, Literal, cast

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from bridge.errors import ConfigError
from bridge.java_patterns import MAX_PATTERN_CHARS, date_format, java_replacement, renamed_topic
from bridge.names import (
    DEFAULT_EPOCHS_TOPIC,
    DEFAULT_STATE_SCHEMA,
    ENV_CONFIG_FILE,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    STACK_ENV_FILE,
)
from bridge.secrets import masked, resolve_file_reference
from bridge.topic_patterns import (
    TOPIC_PLACEHOLDER,
    check_pattern,
    common_topic,
    matches,
    split_table,
    subscription,
    table_of,
)

_HOST_PORT = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")

LibrdkafkaValue = str | int | float | bool


def schema_name(value: str) -> str:
    """`value`, if it names a schema as it is; else ValueError, saying what a name may hold."""
    if not _IDENTIFIER.match(value):
        raise ValueError(
            f"{value!r} is not a schema name (letters, digits, _ and $, not starting with a digit)"
        )
    return value


class _Section(BaseModel):
    """A nested settings section: frozen, and strict about unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSettings(_Section):
    bootstrap_servers: str = "127.0.0.1:9092"
    properties: dict[str, LibrdkafkaValue] = Field(default_factory=dict)

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers:
            raise ValueError("needs at least one host:port")
        for server in servers:
            if not _HOST_PORT.match(server):
                raise ValueError(f"{server!r} is not host:port")
        return ",".join(servers)

    @field_validator("properties")
    @classmethod
    def _check_properties(cls, value: dict[str, LibrdkafkaValue]) -> dict[str, LibrdkafkaValue]:
        if "bootstrap.servers" in value:
            raise ValueError("set kafka.bootstrap_servers instead of bootstrap.servers")
        resolved: dict[str, LibrdkafkaValue] = {}
        for key, setting in value.items():
            if isinstance(setting, str):
                try:
                    setting = resolve_file_reference(setting)
                except OSError as exc:
                    # The path is not the secret; the file's content would be.
                    raise ValueError(f"{key}: cannot read {exc.filename}: {exc.strerror}") from None
            resolved[key] = setting
        return resolved

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # Secrets among the client properties (sasl.password, ...) never show in a repr.
        for name, value in super().__repr_args__():
            yield name, masked(value) if name == "properties" else value

    def client_config(
        self,
        *,
        defaults: Mapping[str, LibrdkafkaValue] | None = None,
        **overrides: LibrdkafkaValue,
    ) -> dict[str, LibrdkafkaValue]:
        """The librdkafka configuration for one client, each layer over the one before: the
        caller's `defaults` (tuning the user may change), the user's `kafka.properties`, then the
        caller's `overrides` (what correctness rests on)."""
        config: dict[str, LibrdkafkaValue] = {"bootstrap.servers": self.bootstrap_servers}
        config.update(defaults or {})
        config.update(self.properties)
        config.update(overrides)
        return config


class PostgresSettings(_Section):
    # The DSN may carry a password, so it is secret: it never shows in logs or reprs. It may
    # also name a file that holds it: `${file:/run/secrets/dsn}`.
    dsn: SecretStr = SecretStr("postgresql://bridge@127.0.0.1:5432/bridge")

    @field_validator("dsn")
    @classmethod
    def _check_dsn(cls, value: SecretStr) -> SecretStr:
        try:
            raw = resolve_file_reference(value.get_secret_value()).strip()
        except OSError as exc:
            raise ValueError(f"cannot read {exc.filename}: {exc.strerror}") from None
        if not raw:
            raise ValueError("must not be empty")
        is_url = raw.startswith(("postgresql://", "postgres://"))
        is_keywords = "=" in raw and "://" not in raw
        if not (is_url or is_keywords):
            raise ValueError("must be a postgresql:// URL or a key=value connection string")
        return SecretStr(raw)


# What a route does with a record's fields that its table has no column for.
UnknownFields = Literal["refuse", "ignore"]
# The formats of a record's value or key that the schema registry has no part in.
UNREGISTERED_FORMATS: Final = ("json", "string")


class SchemaRegistrySettings(_Section):
    """A registry with the Confluent-compatible API (Confluent Schema Registry, Apicurio's
    `/apis/ccompat/v7`, Karapace): its base URL, and any setting of confluent-kafka's registry
    client (`basic.auth.user.info`, `ssl.ca.location`, ...), which may name a file that holds
    it (`${file:/run/secrets/registry}`)."""

    url: str
    # Text, or a number for the client's numeric settings (`timeout`, `max.retries`, ...).
    properties: dict[str, str | int | float] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not _REGISTRY_URL.match(value):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("properties")
    @classmethod
    def _check_properties(
        cls, value: dict[str, str | int | float], info: ValidationInfo
    ) -> dict[str, str | int | float]:
        if "url" in value:
            raise ValueError("set schema_registry.url instead of url")
        resolved: dict[str, Any] = {}
        for key, setting in value.items():
            try:
                resolved[key] = (
                    resolve_file_reference(setting) if isinstance(setting, str) else setting
                )
            except OSError as exc:
                raise ValueError(f"{key}: cannot read {exc.filename}: {exc.strerror}") from None
        url = info.data.get("url")
        if url is None:
            return resolved
        # Here, not at the top: the registry's client costs every process that loads settings
        # half a second of imports (httpx and the rest), and most configure no registry.
        from bridge.registry_properties import client_properties

        # Kafka Connect's spellings become the client's, and the client itself checks the rest.
        return client_properties(url, resolved)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # A URL may carry credentials, and so may the client settings: neither shows.
        for name, value in super().__repr_args__():
            yield name, masked(value) if name == "properties" else value

    def client_config(self) -> dict[str, Any]:
        """confluent-kafka's `SchemaRegistryClient` configuration."""
        return {"url": self.url, **self.properties}


_UNWRAP_FIELD = re.compile(r"^(op|ts_ms|ts_us|ts_ns|(source|transaction)\.[A-Za-z_][A-Za-z0-9_]*)$")
_REGISTRY_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")
_SPARK_MASTER = re.compile(r"^(local(\[[0-9*]+(,\s*[0-9]+)?\])?|spark://\S+|yarn|k8s://\S+)$")


class SparkSettings(_Section):
    """Where the producer job runs. `master`: a Spark master URL (local[...] when not set);
    `executor_python`: the interpreter the executors of a cluster run (see
    bridge_shell/spark/executor_env.py), by default the one this Python was made from."""

    master: str | None = None
    executor_python: str | None = None

    @field_validator("master")
    @classmethod
    def _check_master(cls, value: str | None) -> str | None:
        if value is not None and not _SPARK_MASTER.match(value.strip()):
            raise ValueError(
                f"{value!r} is not a Spark master: local[N], spark://host:port, yarn or k8s://..."
            )
        return value.strip() if value else None


# Where a metadata column's value comes from (besides header:<name>); the spark.* ones are the
# sink's provenance headers.
METADATA_SOURCES: Final = ("topic", "partition", "offset", "timestamp", "key", "spark.query",
                           "spark.partition", "spark.epoch")  # fmt: skip


# Kafka Connect's Cast types: what `fields.cast` makes a field's value.
CastType = Literal["int8", "int16", "int32", "int64", "float32", "float64", "boolean", "string"]


class TimestampSettings(_Section):
    """Kafka Connect's TimestampConverter for one field: its value (epoch units, text in
    `format`, or a date, time or timestamp) made a `type`: a timestamp (an instant), a date or a
    time of day (in UTC), epoch units (`unix`), or text in `format` (in UTC)."""

    type: Literal["timestamp", "date", "time", "unix", "string"]
    # A java.text.SimpleDateFormat pattern, as Connect's (`yyyy-MM-dd'T'HH:mm:ss.SSSX`): how
    # text is read, and written with type string.
    format: str | None = None
    # What an epoch number counts from 1970, read and written.
    unix_precision: Literal["seconds", "milliseconds", "microseconds", "nanoseconds"] = (
        "milliseconds"
    )

    @field_validator("format")
    @classmethod
    def _check_format(cls, value: str | None) -> str | None:
        if value is not None:
            date_format(value)  # raises, naming what it does not read
        return value

    @model_validator(mode="after")
    def _text_needs_format(self) -> TimestampSettings:
        if self.type == "string" and self.format is None:
            raise ValueError("type string needs format")
        return self


class FieldSettings(_Section):
    """Which of a value's fields land, and in which columns, as Kafka Connect's ReplaceField:
    `include` or `exclude` name the value's fields; `rename` maps a field to its column.
    `cast` and `timestamps` convert a field's value, as Connect's Cast and TimestampConverter
    (docs/routes.md, "Converting fields")."""

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    rename: dict[str, str] = Field(default_factory=dict)
    cast: dict[str, CastType] = Field(default_factory=dict)
    timestamps: dict[str, TimestampSettings] = Field(default_factory=dict)

    @field_validator("rename")
    @classmethod
    def _check_rename(cls, value: dict[str, str]) -> dict[str, str]:
        for source, column in value.items():
            if not _IDENTIFIER.match(column):
                raise ValueError(f"{source}: {column!r} is not a column name")
        targets = list(value.values())
        twice = sorted({c for c in targets if targets.count(c) > 1})
        if twice:
            raise ValueError(f"more than one field renamed to {', '.join(twice)}")
        return value

    @model_validator(mode="after")
    def _one_of_include_or_exclude(self) -> FieldSettings:
        if self.include is not None and self.exclude:
            raise ValueError("include or exclude, not both")
        dropped = [f for f in self.rename if not self.takes(f)]
        if dropped:
            raise ValueError(f"renames field(s) it leaves out: {', '.join(sorted(dropped))}")
        for setting, named in (("cast", self.cast), ("timestamps", self.timestamps)):
            dropped = [f for f in named if not self.takes(f)]
            if dropped:
                raise ValueError(f"{setting}: field(s) it leaves out: {', '.join(sorted(dropped))}")
        both = sorted(set(self.cast) & set(self.timestamps))
        if both:
            raise ValueError(f"{', '.join(both)}: in cast and timestamps; one conversion a field")
        return self

    def takes(self, name: str) -> bool:
        """Whether the value's field `name` lands in a column."""
        return (self.include is None or name in self.include) and name not in self.exclude

    @property
    def default(self) -> bool:
        return self.include is None and not self.exclude and not self.rename

    @property
    def converts(self) -> bool:
        return bool(self.cast or self.timestamps)


class TopicRename(_Section):
    """Kafka Connect's RegexRouter before a route's `${topic}`: a topic that the whole `regex`
    matches is named by `replacement` (Java's `$1`, `${name}`); any other as it is."""

    regex: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS)
    replacement: str

    @field_validator("regex")
    @classmethod
    def _check_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value

    @field_validator("replacement")
    @classmethod
    def _check_replacement(cls, value: str) -> str:
        java_replacement(value)  # raises, saying why
        return value

    @model_validator(mode="after")
    def _groups_exist(self) -> TopicRename:
        compiled = re.compile(self.regex)
        for group in re.findall(r"\\g<([^>]*)>", java_replacement(self.replacement)):
            named = compiled.groupindex
            known = int(group) <= compiled.groups if group.isdigit() else group in named
            if not known:
                raise ValueError(f"replacement {self.replacement!r}: regex has no group {group}")
        return self

    def apply(self, topic: str) -> str:
        return renamed_topic(topic, re.compile(self.regex), java_replacement(self.replacement))


# The write modes that go by the route's key columns; those that find the row by its key
# need a primary key or unique constraint on them (ON CONFLICT, or one row a key to update).
KEYED_MODES: Final = ("upsert", "replace", "insert_if_absent", "update")
UNIQUE_KEY_MODES: Final = ("upsert", "insert_if_absent", "update")


class RouteSettings(_Section):
    # One topic by name, or every topic whose whole name a regular expression matches,
    # those created later included (bridge/topic_patterns.py, docs/routes.md).
    topic: str | None = Field(default=None, min_length=1)
    topic_pattern: str | None = Field(default=None, min_length=1)
    # With topic_pattern it may hold ${topic}: each topic's name, made a name of a table.
    table: str = Field(min_length=1)
    # Kafka Connect's RegexRouter: the topic's name as ${topic} gives it, renamed first.
    topic_rename: TopicRename | None = None
    # insert: append every record. The keyed modes go by key_columns, the last record of a key
    # in a batch winning (the first, for insert_if_absent): upsert merges it into the row;
    # replace deletes the row and inserts the record, so a column it lacks takes its default;
    # insert_if_absent writes it only where the key is absent, update only where it is present.
    mode: Literal["insert", "upsert", "replace", "insert_if_absent", "update"] = "insert"
    key_columns: tuple[str, ...] = ()
    # How record values are written: JSON objects, or in the schema registry's wire format
    # (magic byte, schema id, body) Avro decoded by the writer schema the id names, or JSON
    # whose JSON Schema the id names.
    value_format: Literal["json", "avro", "json-schema", "protobuf"] = "json"
    # JSON values only: an integer for a timestamp column is milliseconds since 1970 (UTC),
    # as Kafka Connect's and many producers' timestamps are; otherwise PostgreSQL refuses it.
    epoch_millis_timestamps: bool = False
    # Registry routes only (a JSON route's table is its contract): create the table from the
    # first record's writer schema when it does not exist, and add a nullable column for each
    # field a new writer schema adds, in the batch's own transaction (docs/table-evolution.md).
    auto_create: bool = False
    auto_evolve: bool = False
    # Columns filled from the record rather than its value: {column: source}, the source one of
    # topic, partition, offset, timestamp, key, header:<name>, or the Spark sink's provenance
    # spark.query, spark.partition, spark.epoch (its bridge.* headers). See docs/routes.md.
    metadata: dict[str, str] = Field(default_factory=dict)
    # A record that cannot be written (undecodable, the wrong shape, refused by a constraint):
    # to the dead-letter table, its offset passed; or `stop` its partition there, unwritten,
    # until the table or the route is fixed or the offset reset past it (docs/routes.md).
    on_record_error: Literal["dead_letter", "stop"] = "dead_letter"
    # A record's fields that its table has no column for: `ignore` (the default, as Spark's
    # and Flink's JSON readers and bridge before 0.3.0) leaves them out, each such record
    # counted and the fields logged by name; `refuse` makes the record a record error
    # (on_record_error says what then), as Kafka Connect's JDBC sink refuses them unless it may
    # evolve the table (`bridge routes from-connect` writes it). A record that fills none of
    # the table's columns beyond its key is refused either way.
    unknown_fields: UnknownFields = "ignore"
    # `debezium`: each value is a Debezium change event, unwrapped as Debezium's
    # ExtractNewRecordState does: a create, read or update writes its `after` image; a delete
    # (`op: d`) deletes by the record's key as a tombstone does; `unwrap_fields` adds the
    # event's fields as columns named as the SMT's `add.fields` names them (`op` -> `__op`,
    # `source.ts_ms` -> `__source_ts_ms`). A value that is no change event is read as it is.
    unwrap: Literal["none", "debezium"] = "none"
    unwrap_fields: tuple[str, ...] = ()
    # Where the key columns come from: the value's fields; the record's key (a JSON object of
    # the key columns, or for one key column its text or JSON scalar); or the record's Kafka
    # coordinates, key_columns then naming the topic, partition and offset columns in order.
    key_source: Literal["value", "record_key", "kafka"] = "value"
    # How record keys are written, where they are read (record_key, a tombstone's delete): JSON
    # or text; `string`, UTF-8 text as it is, for one key column of type text (Kafka Connect's
    # StringConverter); or framed by the schema registry as values are (value_format).
    key_format: Literal["json", "string", "avro", "json-schema", "protobuf"] = "json"
    fields: FieldSettings = Field(default_factory=FieldSettings)
    # whole (the default): the records of a Spark epoch (those with the sink's provenance
    # headers) become visible in one transaction once the epoch manifest shows the epoch whole,
    # so that a reader never sees part of one (docs/architecture.md, "Whole epochs"); records
    # without them (another producer's) are visible once their batch commits, as with
    # per-partition, where every batch's records are, partition by partition.
    epochs: Literal["per-partition", "whole"] = "whole"
    # Kafka Connect's db.timezone: the zone whose local time an instant (a timestamp of Avro,
    # Protobuf, a conversion, epoch_millis_timestamps) is written as into a timestamp column
    # without time zone. A timestamptz column keeps the instant whatever the zone; text is read
    # by PostgreSQL as it is.
    timestamp_zone: str = "UTC"
    # Whole routes: an epoch of their topics open longer than this many seconds is taken as one
    # whose query is gone for good (a retired or killed Spark job) and discarded, its records to
    # the dead letters, by policy; unset, such an epoch holds until an operator settles it
    # (`bridge epochs discard|publish`). docs/operations.md, "Operator tools".
    epochs_hold_s: float | None = Field(default=None, gt=0, le=30 * 86_400)

    @field_validator("timestamp_zone")
    @classmethod
    def _check_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"{value!r} is not a time zone (an IANA name: UTC, Europe/Paris)"
            ) from None
        return value

    @property
    def needs_registry(self) -> bool:
        """Whether its values or its keys are read by writer schemas from the registry."""
        return not {self.value_format, self.key_format} <= set(UNREGISTERED_FORMATS)

    @field_validator("table")
    @classmethod
    def _check_table(cls, value: str) -> str:
        split_table(value.replace(TOPIC_PLACEHOLDER, "topic"))  # raises, saying why
        return value

    @field_validator("topic_pattern")
    @classmethod
    def _check_topic_pattern(cls, value: str | None) -> str | None:
        return None if value is None else check_pattern(value)

    @model_validator(mode="after")
    def _one_topic_or_a_pattern(self) -> RouteSettings:
        if (self.topic is None) == (self.topic_pattern is None):
            raise ValueError("needs topic or topic_pattern, not both")
        if self.topic is not None and TOPIC_PLACEHOLDER in self.table:
            raise ValueError(f"a table with {TOPIC_PLACEHOLDER} needs topic_pattern")
        if self.topic_rename is not None and TOPIC_PLACEHOLDER not in self.table:
            raise ValueError(f"topic_rename renames {TOPIC_PLACEHOLDER}, which table lacks")
        return self

    @property
    def source(self) -> str:
        """The topic, or the pattern, as the logs and errors name it."""
        return self.topic or f"topic_pattern {self.topic_pattern!r}"

    def for_topic(self, topic: str) -> RouteSettings:
        """This route as it applies to one topic: a pattern's, with its table's name made."""
        if self.topic is not None:
            return self
        named = topic if self.topic_rename is None else self.topic_rename.apply(topic)
        table = table_of(self.table, named)
        return self.model_copy(update={"topic": topic, "topic_pattern": None, "table": table})

    @field_validator("key_columns")
    @classmethod
    def _check_key_columns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for column in value:
            if not _IDENTIFIER.match(column):
                raise ValueError(f"{column!r} is not a column name")
        if len(set(value)) != len(value):
            raise ValueError("lists a column twice")
        return value

    @model_validator(mode="after")
    def _keyed_modes_need_keys(self) -> RouteSettings:
        if self.mode in KEYED_MODES and not self.key_columns:
            raise ValueError(f"mode '{self.mode}' needs key_columns")
        if self.key_source != "value" and not self.key_columns:
            raise ValueError(f"key_source '{self.key_source}' needs key_columns")
        if self.key_source == "kafka" and len(self.key_columns) != 3:
            raise ValueError(
                "key_source 'kafka' needs three key_columns: the topic's, the partition's and "
                "the offset's, in that order"
            )
        if self.unwrap_fields and self.unwrap == "none":
            raise ValueError("unwrap_fields needs unwrap: debezium")
        if self.unwrap != "none" and self.value_format != "json":
            raise ValueError(
                "unwrap: debezium reads JSON change events (JsonConverter with "
                "schemas.enable=false); a registry format's events are not unwrapped here yet: "
                "unwrap them on the source connector (io.debezium.transforms."
                "ExtractNewRecordState)"
            )
        bad = [f for f in self.unwrap_fields if not _UNWRAP_FIELD.match(f)]
        if bad:
            raise ValueError(
                f"unwrap_fields: {', '.join(map(repr, bad))}: a change event's field (op, ts_ms, "
                "ts_us, ts_ns) or its source's (source.ts_ms, source.table, ...)"
            )
        overlap = sorted(set(self.metadata) & set(self.key_columns))
        if self.key_source != "value" and overlap:
            raise ValueError(
                f"{', '.join(overlap)}: a key column from the {self.key_source.replace('_', ' ')}"
                " cannot also be a metadata column"
            )
        return self

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, str]) -> dict[str, str]:
        for column, source in value.items():
            if not _IDENTIFIER.match(column):
                raise ValueError(f"{column!r} is not a column name")
            if source not in METADATA_SOURCES and not (
                source.startswith("header:") and len(source) > len("header:")
            ):
                raise ValueError(
                    f"{column}: {source!r} is not one of {', '.join(METADATA_SOURCES)} or "
                    "header:<name>"
                )
        return value

    @model_validator(mode="after")
    def _following_needs_a_schema(self) -> RouteSettings:
        if self.value_format == "json" and (self.auto_create or self.auto_evolve):
            raise ValueError(
                "auto_create and auto_evolve need value_format avro, json-schema or protobuf: "
                "the table follows the records' writer schemas (a plain JSON route's table is "
                "its contract)"
            )
        if self.auto_create and self.key_source == "kafka":
            raise ValueError(
                "key_source 'kafka' needs a table that has the key columns: create it by "
                "hand, not with auto_create"
            )
        if self.auto_create and self.key_source == "record_key" and self.key_format == "json":
            raise ValueError(
                "key_source 'record_key' with auto_create needs key_format string, avro, "
                "json-schema or protobuf: the key columns' types come from the keys' writer "
                "schemas, or are text for a string key (a JSON key has none)"
            )
        if self.key_format == "string" and len(self.key_columns) > 1:
            raise ValueError("key_format 'string' fills one key column: name one in key_columns")
        if self.auto_create and self.metadata:
            raise ValueError(
                "metadata columns need a table that has them: create it by hand, not with "
                "auto_create"
            )
        return self


class ConsumerSettings(_Section):
    group_id: str = Field(min_length=1)
    routes: tuple[RouteSettings, ...] = Field(min_length=1)
    state_schema: str = DEFAULT_STATE_SCHEMA
    start_policy: Literal["earliest", "latest"] = "earliest"
    batch_max_records: int = Field(default=5000, ge=1, le=1_000_000)
    batch_max_wait_ms: int = Field(default=100, ge=1, le=60_000)
    # What one Avro record may decode to in memory: a few body bytes can describe millions of
    # values (an array of nulls), so past this the record is a dead letter naming the limit.
    max_decoded_record_bytes: int = Field(default=64 * 1024**2, ge=64 * 1024, le=2**40)
    # Longest a database statement, or a pause inside a transaction, may last before PostgreSQL
    # ends the session: bounds how long a paused member's locks block the member that takes over.
    db_session_timeout_ms: int = Field(default=30_000, ge=1_000, le=3_600_000)
    # /metrics, /healthz, /readyz; off unless a port is set (0: any free port).
    http_port: int | None = Field(default=None, ge=0, le=65_535)
    http_host: str = "0.0.0.0"  # noqa: S104 - a metrics endpoint is scraped from elsewhere
    # After each database commit, also commit the same offsets to the Kafka group (asynchronously)
    # so that Kafka's own lag tools see the group. They are never read back: positions come
    # from the database only.
    mirror_offsets_to_kafka: bool = False
    # Every broker unreachable for this long ends the service with an error (and a non-zero
    # exit), rather than a member that waits forever without a word.
    kafka_unavailable_timeout_ms: int = Field(default=300_000, ge=5_000, le=86_400_000)
    # Kafka's group protocol: `classic` (cooperative-sticky assignment on the client), or
    # `consumer` (KIP-848: the broker assigns; its session and heartbeat settings rule).
    group_protocol: Literal["classic", "consumer"] = "classic"
    # The sink's epoch manifest, read by the group when a route wants whole epochs.
    epochs_topic: str = Field(default=DEFAULT_EPOCHS_TOPIC, pattern=r"^[A-Za-z0-9._-]{1,249}$")
    # An epoch incomplete for this long makes the member not ready, naming what is missing
    # (its age is a metric all along): a query stopped for good, a manifest that never came.
    epochs_incomplete_after_ms: int = Field(default=300_000, ge=1_000, le=7 * 86_400_000)
    # Where a group that never read the manifest starts reading it: this long before the first
    # record it reads of its whole topics (consumers/membership/manifest_start.py). Longer than
    # an epoch's tasks run apart; 0 reads the manifest's whole history, from its log start.
    epochs_manifest_lookback_ms: int = Field(default=3_600_000, ge=0, le=30 * 86_400_000)
    # A member holding every partition an epoch wrote to holds its records in memory, their
    # offsets not advanced, until the epoch is whole, and writes them once, in the batch that
    # completes it; at most this many records, each epoch for at most this long. Beyond either,
    # and in a group whose members share the partitions, records are staged in the ledger.
    epochs_hold_records: int = Field(default=50_000, ge=0, le=10_000_000)
    epochs_hold_ms: int = Field(default=2_000, ge=0, le=600_000)
    # Which members read the whole routes' topics. `one`: one member per unit of the group's
    # Spark queries (those that write a common topic), the units spread over the members
    # through PostgreSQL (locks of their sessions); a unit's member holds every partition of
    # its topics and publishes each epoch in the batch that completes it; topics no query's
    # manifest names are shared by all the members, as per-partition routes are. `all`:
    # every member, sharing the partitions, each epoch staged in the ledger until one member
    # publishes it. With whole epochs by default only (no route says `epochs: whole`), `one`
    # begins once the group's ledger knows an epoch: until then the members share every
    # route, as a group whose producers are not bridge's sink always has (`elects_at_start`).
    epochs_members: Literal["one", "all"] = "one"

    @field_validator("state_schema")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        return schema_name(value)

    @field_validator("routes")
    @classmethod
    def _routes_apart(cls, value: tuple[RouteSettings, ...]) -> tuple[RouteSettings, ...]:
        """No topic that two routes could both read: the same name twice, a name a pattern
        matches, or two patterns that match one name."""
        topics = [route.topic for route in value if route.topic is not None]
        duplicated = sorted({t for t in topics if topics.count(t) > 1})
        if duplicated:
            raise ValueError(f"topic routed twice: {', '.join(duplicated)}")
        for i, first in enumerate(value):
            for j, second in enumerate(value[i + 1 :], start=i + 1):
                common = _common_topic(first, second)
                if common is not None:
                    raise ValueError(
                        f"routes {i} ({first.source}) and {j} ({second.source}) could both "
                        f"read topic {common!r}: a topic goes to one route"
                    )
        return value

    @model_validator(mode="after")
    def _manifest_apart(self) -> ConsumerSettings:
        """A route naming the manifest is refused; a pattern that matches it never reads it
        (`route_for`: the group reads the manifest as its own)."""
        found = self.route_for(self.epochs_topic)
        if self.whole_epochs and found is not None:
            raise ValueError(
                f"routes.{found[0]} reads {self.epochs_topic!r}, the epoch manifest "
                "(epochs_topic): the manifest is the group's own, never a table's"
            )
        return self

    @property
    def whole_epochs(self) -> bool:
        """Whether a route wants whole epochs: the group then reads the epoch manifest."""
        return any(route.epochs == "whole" for route in self.routes)

    @property
    def elects_at_start(self) -> bool:
        """Whether a member tries for the whole routes as it starts (`epochs_members: one`):
        when a route says `epochs: whole`. With whole epochs by default only, a member tries
        once the group's ledger knows an epoch, which it may never do for a group whose topics
        no bridge sink writes: such a group keeps sharing its partitions among its members."""
        return self.epochs_members == "one" and any(
            route.epochs == "whole" and "epochs" in route.model_fields_set for route in self.routes
        )

    def whole_topic(self, topic: str) -> bool:
        """Whether `topic`'s records wait for their whole epoch."""
        found = self.route_for(topic)
        return found is not None and found[1].epochs == "whole"

    def epochs_hold_s(self, topic: str) -> float | None:
        """How long an epoch with records of `topic` may stay open before it is discarded by
        policy (its route's `epochs_hold_s`); None: until an operator settles it."""
        found = self.route_for(topic)
        return None if found is None or found[1].epochs != "whole" else found[1].epochs_hold_s

    def route_for(self, topic: str) -> tuple[int, RouteSettings] | None:
        """The route that reads `topic` (at most one: `_routes_apart`), as it applies to it.
        A pattern never reads the epoch manifest when the group reads it as its own."""
        for index, route in enumerate(self.routes):
            if route.topic == topic or (
                route.topic_pattern is not None
                and matches(route.topic_pattern, topic)
                and not (topic == self.epochs_topic and self.whole_epochs)
            ):
                return index, route.for_topic(topic)
        return None

    def subscription(
        self,
        reads: Callable[[str], bool] | None = None,
        named: Collection[str] = (),
        listed: Iterable[str] = (),
    ) -> list[str]:
        """What the consumer subscribes to: each named topic, and each pattern as a regex, and
        the manifest when a route wants whole epochs. With `reads` (the group's units of
        queries spread over its members, `epochs_members: one`), a whole route's topic only
        when this member reads it, and a whole route's pattern as the topics of `listed` (what
        Kafka has) it matches and this member reads, once a topic of `named` (a unit's)
        matches it."""
        topics: list[str] = []
        for index, route in enumerate(self.routes):
            pattern = route.topic_pattern
            if reads is None or route.epochs != "whole":
                topics.append(route.topic or subscription(cast(str, pattern)))
            elif route.topic is not None:
                topics += [route.topic] if reads(route.topic) else []
            elif not any(self._read_by(index, topic) for topic in named):
                topics.append(subscription(cast(str, pattern)))
            else:
                topics += sorted(t for t in listed if self._read_by(index, t) and reads(t))
        return [*topics, self.epochs_topic] if self.whole_epochs else topics

    def _read_by(self, index: int, topic: str) -> bool:
        found = self.route_for(topic)
        return found is not None and found[0] == index


def _common_topic(first: RouteSettings, second: RouteSettings) -> str | None:
    if first.topic_pattern is None and second.topic_pattern is None:
        return None  # two names: compared as names
    if first.topic_pattern is None or second.topic_pattern is None:
        topic, pattern = (first.topic, second.topic_pattern) if first.topic else (
            second.topic, first.topic_pattern)  # fmt: skip
        return topic if matches(cast(str, pattern), cast(str, topic)) else None
    return common_topic(first.topic_pattern, second.topic_pattern)


# The files a load reads: set by `load_settings`, read by `settings_customise_sources`, which
# pydantic-settings calls as a classmethod and so cannot take per-call arguments.
_config_file: ContextVar[Path | None] = ContextVar("bridge_config_file", default=None)
_BROKER_OWNED_WITH_CONSUMER_PROTOCOL = frozenset(
    {"session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy",
     "group.protocol.type"}
)  # fmt: skip

_env_files: ContextVar[tuple[Path, ...]] = ContextVar("bridge_env_files", default=())


def role_env_file(stack_env: Path, role: str) -> Path:
    """`stack.<role>.env` beside `stack.env`: a secured stack's credentials for one role."""
    return stack_env.with_name(f"{stack_env.stem}.{role}{stack_env.suffix}")


def stack_env_files(stack_dir: Path, role: str) -> tuple[Path, Path]:
    """What a command of `role` (producer, consumer, tools) reads from the local stack:
    `stack.env`, then its role's own file, which a secured stack writes (and a plain one not)."""
    stack_env = stack_dir / STACK_ENV_FILE
    return stack_env, role_env_file(stack_env, role)


class _YamlFileSource(InitSettingsSource):
    """The YAML configuration file, refused if it is not a mapping at the top.

    Not pydantic-settings' YamlConfigSettingsSource: it lets a syntax error or a list at the top
    escape as a bare ParserError or TypeError, and reads a missing file as empty."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls, _read_yaml(path) if path else {})


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([("<file>", f"cannot read: {exc.strerror}")], source=str(path)) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([("<file>", f"not valid YAML: {exc}")], source=str(path)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([("<file>", "the top level must be a mapping")], source=str(path))
    return data


class BridgeSettings(BaseSettings):
    """Everything bridge reads from its configuration. Build it with `load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    consumer: ConsumerSettings | None = None
    schema_registry: SchemaRegistrySettings | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            env_settings,
            _YamlFileSource(settings_cls, _config_file.get()),
        ]
        env_files = [path for path in _env_files.get() if path.is_file()]
        if env_files:
            # Of several files, a later one's variable wins over the same in an earlier one.
            sources.append(DotEnvSettingsSource(settings_cls, env_file=env_files))
        return tuple(sources)

    @model_validator(mode="after")
    def _group_protocol_settings(self) -> BridgeSettings:
        # Under KIP-848 the broker owns these; librdkafka refuses them when the consumer starts,
        # which is later and less clear than here.
        if self.consumer is not None and self.consumer.group_protocol == "consumer":
            owned = sorted(set(self.kafka.properties) & _BROKER_OWNED_WITH_CONSUMER_PROTOCOL)
            if owned:
                raise ValueError(
                    f"kafka.properties {', '.join(owned)}: with consumer.group_protocol "
                    "'consumer' the broker sets these (group.consumer.* in its configuration)"
                )
        return self

    def require_consumer(self) -> ConsumerSettings:
        """The consumer section, for a command that reads no record (`offsets`, `status`)."""
        if self.consumer is None:
            raise ConfigError([("consumer", "this command needs a consumer section")])
        return self.consumer

    def consumer_to_run(self) -> ConsumerSettings:
        """The consumer section, for running the consumer: its routes in the registry's
        format need the registry, which the commands that read no record do not."""
        consumer = self.require_consumer()
        typed = [
            (
                f"consumer.routes.{i}.{key}",
                "records in the registry's format need schema_registry.url",
            )
            for i, route in enumerate(consumer.routes)
            for key in ("value_format", "key_format")
            if getattr(route, key) not in UNREGISTERED_FORMATS
        ]
        if typed and self.schema_registry is None:
            raise ConfigError(typed)
        return consumer


@contextmanager
def _reading(config_file: Path | None, env_files: tuple[Path, ...]) -> Iterator[None]:
    tokens = (_config_file.set(config_file), _env_files.set(env_files))
    try:
        yield
    finally:
        _config_file.reset(tokens[0])
        _env_files.reset(tokens[1])


def load_settings(
    config_file: Path | None = None,
    *,
    env_file: Path | tuple[Path, ...] | None = None,
    **overrides: Any,
) -> BridgeSettings:
    """Load and validate the settings; raise `ConfigError` naming every offending key.

    `config_file` defaults to `$BRIDGE_CONFIG` when that is set. `env_file` is the stack's
    `stack.env`, or several such files (`stack_env_files`), a later one over an earlier one;
    each is read only when it exists.
    """
    if config_file is None and os.environ.get(ENV_CONFIG_FILE):
        config_file = Path(os.environ[ENV_CONFIG_FILE])
    if config_file is not None and not config_file.is_file():
        raise ConfigError([("<file>", "no such file")], source=str(config_file))
    source = str(config_file) if config_file else None
    env_files = (env_file,) if isinstance(env_file, Path) else (env_file or ())
    with _reading(config_file, env_files):
        try:
            return BridgeSettings(**overrides)
        except ValidationError as exc:
            raise ConfigError(_problems(exc), source=source) from None


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    errors = exc.errors(include_url=False)
    paths = [".".join(str(part) for part in error["loc"]) for error in errors]
    problems = []
    for error, path in zip(errors, paths, strict=True):
        # A list whose only item was refused is also reported "too short" once the item is
        # dropped: the item's own error says what is wrong.
        if error["type"] == "too_short" and any(p.startswith(f"{path}.") for p in paths):
            continue
        path = path or "<root>"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append((path, message))
    return problems
