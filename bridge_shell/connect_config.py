"""A Kafka Connect JDBC sink configuration as bridge's consumer configuration (`bridge routes
from-connect`): Confluent's JDBC sink (`io.confluent.connect.jdbc.JdbcSinkConnector`) and
Debezium's (`io.debezium.connector.jdbc.JdbcSinkConnector`).

The mapping is the table in docs/routes.md ("Coming from Kafka Connect"). Every key of the input
meets one fate, and none is dropped in silence (`Translated.fates`):

- **translated** into the routes, the database's DSN or the registry's settings;
- **left out**, named in a note with why: what tunes Connect's own runtime or JDBC connection
  (task counts, batch sizes, retries, pools), which bridge does its own way;
- **refused**, every problem in one `ConfigError`: what bridge would do differently without
  saying so.

Credentials are never copied into the output: a password becomes a `${file:...}` reference, and
a note says what to put in that file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from bridge.errors import ConfigError
from bridge.java_patterns import date_format, java_replacement, renamed_topic
from bridge.settings import UNREGISTERED_FORMATS

CONFLUENT = "io.confluent.connect.jdbc.JdbcSinkConnector"
DEBEZIUM = "io.debezium.connector.jdbc.JdbcSinkConnector"
_CONVERTERS = {
    "io.confluent.connect.avro.AvroConverter": "avro",
    "io.apicurio.registry.utils.converter.AvroConverter": "avro",
    "io.confluent.connect.json.JsonSchemaConverter": "json-schema",
    "io.confluent.connect.protobuf.ProtobufConverter": "protobuf",
    "org.apache.kafka.connect.json.JsonConverter": "json",
    "org.apache.kafka.connect.storage.StringConverter": "string",
}
_KAFKA_PK_DEFAULTS = ("__connect_topic", "__connect_partition", "__connect_offset")
_INSERT_FIELDS = {
    "topic.field": "topic",
    "partition.field": "partition",
    "offset.field": "offset",
    "timestamp.field": "timestamp",
}
_LOWER_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_$]*$")
_UNWRAP_FIELD = re.compile(r"^(op|ts_ms|ts_us|ts_ns|source\.[A-Za-z_][A-Za-z0-9_]*)$")
# Where the secrets the output names by `${file:...}` are kept: Kubernetes' and Docker's place,
# unless `bridge routes from-connect --secrets-dir` names another.
SECRETS_DIR = Path("/run/secrets")
DSN_FILE = "postgres-dsn"
REGISTRY_USER_INFO_FILE = "registry-user-info"

# Why a key has no bridge setting and is left out, by the keys it covers.
_RETRIES = (
    "bridge retries a database, registry or broker fault itself, with growing waits, saying so "
    "on /readyz; a record's own fault is never retried (on_record_error)"
)
_LEFT_OUT: dict[str, str] = {
    "tasks.max": "one consumer member is one process: run several in one group for more "
    "(deploy/kubernetes/consumer.yaml's replicas)",
    "batch.size": "the consumer sizes its batches itself (consumer.batch_max_records)",
    "use.reduction.buffer": "a batch writes each key once already (upserts sorted by key)",
    "max.retries": _RETRIES,
    "retry.backoff.ms": _RETRIES,
    "connection.attempts": _RETRIES,
    "connection.backoff.ms": _RETRIES,
    "errors.retry.timeout": _RETRIES,
    "errors.retry.delay.max.ms": _RETRIES,
    "flush.max.retries": _RETRIES,
    "flush.retry.delay.ms": _RETRIES,
    "flush.failure.max.retries": _RETRIES,
    "flush.failure.retries.wait.ms": _RETRIES,
    "connection.restart.on.errors": _RETRIES,
    "timestamp.precision.mode": "bridge keeps a timestamp's microseconds",
    "dialect.sqlserver.identity.insert": "SQL Server only",
    "errors.log.enable": "each dead letter is logged once committed, with its coordinates and "
    "why; the record itself is kept in the dead_letters table",
    "errors.log.include.messages": "the record is kept in the dead_letters table, not logged",
    "errors.deadletterqueue.topic.replication.factor": "dead letters go to a table",
    "errors.deadletterqueue.context.headers.enable": "a dead letter keeps its topic, partition, "
    "offset, headers and error in its row",
    "header.converter": "headers are read as bytes (a metadata column `header:<name>`)",
    "config.action.reload": "Connect's runtime",
    "trim.sensitive.log": "secrets never show in bridge's logs",
    "mssql.use.merge.holdlock": "SQL Server only",
    "connection.provider": "Connect's connection pool: one consumer member holds one session",
    "dialect.postgres.postgis.schema": "PostGIS types have no bridge column type",
    "hibernate.c3p0.ignore_unresolvable_transactions": "Connect's connection pool",
}
_LEFT_OUT_PREFIXES: dict[str, str] = {
    "connection.pool.": "Connect's connection pool: one consumer member holds one session",
    "connection.": "a JDBC driver setting: give libpq's own in postgres.dsn (connect_timeout, "
    "sslmode, ...)",
    "hibernate.": "Debezium's Hibernate runtime",
    "consumer.override.": "Connect's Kafka consumer: bridge's Kafka client settings are "
    "kafka.properties (librdkafka's names)",
}


class ConnectConfigRefused(ConfigError):
    """Keys of the configuration refused, with what became of every key."""

    def __init__(self, problems: list[tuple[str, str]], fates: dict[str, str]) -> None:
        super().__init__(problems, source="the Kafka Connect configuration")
        self.fates = fates


@dataclass
class Translated:
    """The consumer configuration, and what became of every key of the input."""

    consumer: dict[str, Any]
    schema_registry: dict[str, Any] | None = None
    postgres: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # Each key of the input: "translated", or "left out: <why>".
    fates: dict[str, str] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self.postgres is not None:
            found["postgres"] = self.postgres
        if self.schema_registry is not None:
            found["schema_registry"] = self.schema_registry
        found["consumer"] = self.consumer
        return found

    def yaml(self) -> str:
        """The document as YAML, every value written out where it stands (no `&id001` anchors
        for values two routes share)."""
        return yaml.dump(self.document(), Dumper=_PlainDumper, sort_keys=False)


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


class _Keys:
    """The input's keys, each given its fate once."""

    def __init__(self, config: Mapping[str, str], secrets_dir: Path) -> None:
        self.config = config
        self.secrets_dir = secrets_dir
        self.fates: dict[str, str] = {}
        self.problems: list[tuple[str, str]] = []

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of `key`, which the caller translates."""
        if key in self.config:
            self.fates.setdefault(key, "translated")
        return self.config.get(key, default)

    def left_out(self, key: str, why: str) -> None:
        """`key` has no bridge setting, for `why`; a refusal stands."""
        if key in self.config and not self.fates.get(key, "").startswith("refused"):
            self.fates[key] = f"left out: {why}"

    def secret(self, name: str) -> str:
        """Where the output says the secret `name` is kept."""
        return str(self.secrets_dir / name)

    def refuse(self, key: str, why: str) -> None:
        self.problems.append((key, why))
        self.fates[key] = f"refused: {why}"


def read_connect_config(path: Path) -> dict[str, str]:
    """A properties file (`key=value`, `#` comments), or the JSON Connect's REST API takes
    (`{"name": ..., "config": {...}}` or the config object itself)."""
    text = path.read_text()
    if text.lstrip().startswith("{"):
        document = json.loads(text)
        config = document.get("config", document)
        if "name" in document and "name" not in config:
            config = {**config, "name": document["name"]}
        return {str(k): str(v) for k, v in config.items()}
    found = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, _, value = line.partition("=")
        found[key.strip()] = value.strip()
    return found


def translate(config: Mapping[str, str], *, secrets_dir: Path = SECRETS_DIR) -> Translated:
    """`config` as bridge's consumer configuration, or ConfigError with every problem; the
    secrets it names are files of `secrets_dir`."""
    keys = _Keys(config, secrets_dir)
    notes: list[str] = []
    connector = keys.get("connector.class", CONFLUENT) or CONFLUENT
    if connector not in (CONFLUENT, DEBEZIUM):
        keys.refuse("connector.class", f"{connector}: bridge translates {CONFLUENT} and {DEBEZIUM}")
    debezium = connector == DEBEZIUM
    # Connect's topics come from other producers, with no Spark epoch to wait for: per
    # partition, the group's members share them, as Connect's tasks did (whole epochs, the
    # default, have one member read a whole route's topics).
    route: dict[str, Any] = {"epochs": "per-partition"}

    mode = keys.get("insert.mode", "insert") or "insert"
    if mode not in ("insert", "upsert", "update"):
        keys.refuse("insert.mode", f"{mode!r} is not insert, upsert or update")
    route["mode"] = mode
    route.update(_key(keys, debezium, mode))

    formats, registry = _formats(keys, notes)
    route.update(formats)
    if formats.get("key_format") == "string" and len(route.get("key_columns", ())) > 1:
        why = (
            "a StringConverter key is one text column: name one key field, or write the key "
            "as a record (AvroConverter, JsonSchemaConverter)"
        )
        keys.refuse("key.converter", why)
    follows = _evolution(keys, debezium, formats)
    route.update(follows)

    fields, metadata, unwrapping, renaming = _transforms(keys)
    if renaming is not None and (
        route.get("key_source") == "kafka" or "topic" in metadata.values()
    ):
        where = "pk.mode" if route.get("key_source") == "kafka" else "transforms"
        keys.refuse(where, "a column of the topic as RegexRouter renamed it has no bridge "
                    "setting: a column holds the topic as read")  # fmt: skip
    if debezium and formats.get("value_format", "json") == "json":
        # Debezium's JDBC sink reads its change events as they are: so does the route.
        unwrapping = {"unwrap": "debezium", **unwrapping}
    if unwrapping and formats.get("value_format", "json") != "json":
        where = next((k for k in keys.config if k.endswith(".type") and "ExtractNewRecordState"
                      in keys.config[k]), "value.converter")  # fmt: skip
        keys.refuse(where, "unwrap: debezium reads JSON change events only (JsonConverter, "
                    "schemas.enable=false): unwrap on the source connector instead")  # fmt: skip
    route.update(unwrapping)
    fields.update(_field_lists(keys, debezium))
    if fields:
        route["fields"] = fields
    if metadata:
        route["metadata"] = metadata

    # Connect's JDBC sink refuses a record whose fields its table lacks, unless it may evolve
    # the table (which then has them): the route refuses them too.
    route["unknown_fields"] = "refuse"
    route.update(_errors(keys, notes))
    deletes = (keys.get("delete.enabled", "false") or "false").lower() == "true"
    if deletes and not route.get("key_columns"):
        keys.refuse("delete.enabled", "deletes by key: set the key's mode and fields")
    if debezium and (keys.config.get("truncate.enabled", "false")).lower() == "true":
        keys.refuse("truncate.enabled", "a truncate event has no bridge meaning: set it false")
    keys.left_out("truncate.enabled", "false: truncate events are not applied")

    route.update(_zone(keys, debezium))
    routes = _routes(keys, route, debezium, notes, renaming)
    postgres = _database(keys, notes)
    _settings_left_out(keys, debezium, notes)  # after every key translated above

    name = keys.get("name", "connect") or "connect"
    unknown = sorted(k for k in config if k not in keys.fates)
    for key in unknown:
        keys.refuse(key, "no bridge setting does what this does")
    if keys.problems:
        raise ConnectConfigRefused(keys.problems, dict(keys.fates))
    group = f"connect-{name}"
    left = {k: f[len("left out: ") :] for k, f in keys.fates.items() if f.startswith("left out")}
    for why in dict.fromkeys(left.values()):
        notes.append(f"{', '.join(k for k, w in left.items() if w == why)}: left out: {why}")
    notes.append(
        f"offsets: Connect's committed offsets are not carried over; group {group} starts each "
        "partition at consumer.start_policy (earliest). To go on where Connect stopped, stop the "
        f"connector, read its group's offsets (kafka-consumer-groups --describe --group "
        f"connect-{name}), and set each partition's with `bridge offsets reset --group {group} "
        "--topic T --partition P --to OFFSET --execute` before the consumer's first start "
        '(docs/routes.md, "Coming from Kafka Connect")'
    )
    if debezium and "unwrap" not in route:
        notes.append(
            "Debezium change events (before/after/op) in a registry format must reach bridge "
            "flattened: set transforms=unwrap (io.debezium.transforms.ExtractNewRecordState, "
            "with delete.tombstone.handling.mode=tombstone for deletes) on the source "
            "connector; an envelope is a dead letter that says so"
        )
    return Translated({"group_id": group, "routes": routes}, registry, postgres, notes,
                      dict(keys.fates))  # fmt: skip


def _key(keys: _Keys, debezium: bool, mode: str) -> dict[str, Any]:
    mode_key, fields_key = (
        ("primary.key.mode", "primary.key.fields") if debezium else ("pk.mode", "pk.fields")
    )
    pk_mode = keys.get(mode_key, "none") or "none"
    pk_fields = _list(keys.get(fields_key, "") or "")
    if pk_mode == "none":
        if pk_fields:
            keys.left_out(fields_key, f"{mode_key} is none: the records have no key")
        if mode != "insert":
            where = mode_key if mode_key in keys.config else "insert.mode"
            keys.refuse(where, f"{mode} needs a key: set {mode_key} and {fields_key}")
        return {}
    if pk_mode == "record_value":
        if not pk_fields:
            keys.refuse(fields_key, "record_value needs the fields of the key, by name")
        return {"key_source": "value", "key_columns": pk_fields}
    if pk_mode == "record_key":
        if not pk_fields:
            keys.refuse(fields_key, "record_key needs the key columns' names (a primitive "
                        "key's one)")  # fmt: skip
        return {"key_source": "record_key", "key_columns": pk_fields}
    if pk_mode == "kafka":
        columns = pk_fields or list(_KAFKA_PK_DEFAULTS)
        if len(columns) != 3:
            keys.refuse(fields_key, "kafka needs three names: topic, partition, offset")
        return {"key_source": "kafka", "key_columns": columns}
    keys.refuse(mode_key, f"{pk_mode!r} is not none, record_value, record_key or kafka")
    return {}


def _formats(keys: _Keys, notes: list[str]) -> tuple[dict[str, str], dict[str, Any] | None]:
    formats: dict[str, str] = {}
    registry: dict[str, Any] | None = None
    for side in ("key", "value"):
        prefix = f"{side}.converter"
        converter = keys.get(prefix)
        if converter is None:
            for key in [k for k in keys.config if k.startswith(f"{prefix}.")]:
                keys.refuse(key, f"{prefix} is the worker's, not in this configuration: name it "
                            "here, so that the records' format is known")  # fmt: skip
            continue
        chosen = _CONVERTERS.get(converter)
        if chosen is None:
            keys.refuse(prefix, f"{converter} has no bridge format")
            continue
        if chosen == "string" and side == "value":
            chosen = "json"  # a value is read as a JSON object (or is a dead letter)
        if converter.endswith("JsonConverter"):
            enabled = (keys.get(f"{prefix}.schemas.enable", "true") or "true").lower()
            if enabled == "true":
                keys.refuse(f"{prefix}.schemas.enable", "JSON with its schema embedded "
                            "({schema, payload}) has no bridge format: produce plain JSON "
                            "(schemas.enable=false), or JSON Schema through the registry "
                            "(JsonSchemaConverter)")  # fmt: skip
        if chosen != "json":
            formats[f"{side}_format"] = chosen
        if chosen not in UNREGISTERED_FORMATS:
            registry = _registry(keys, prefix, registry, notes)
        for key in [k for k in keys.config if k.startswith(f"{prefix}.") and k not in keys.fates]:
            if key.startswith(f"{prefix}.schema.registry.ssl."):
                why = (
                    "a Java keystore or truststore: give the registry's client PEM files in "
                    "schema_registry.properties (ssl.ca.location, ...)"
                )
                keys.refuse(key, why)
            else:
                keys.left_out(key, "a setting of Connect's converter; bridge reads the records' "
                              "bytes as the producer framed them")  # fmt: skip
    return formats, registry


def _registry(
    keys: _Keys, prefix: str, registry: dict[str, Any] | None, notes: list[str]
) -> dict[str, Any] | None:
    url = keys.get(f"{prefix}.schema.registry.url")
    if url is None:
        keys.refuse(f"{prefix}.schema.registry.url", "required")
        return registry
    if registry is not None and registry["url"] != url:
        keys.refuse(f"{prefix}.schema.registry.url", "one registry only")
        return registry
    found: dict[str, Any] = registry or {"url": url}
    source = keys.get(f"{prefix}.basic.auth.credentials.source")
    info = keys.get(f"{prefix}.basic.auth.user.info")
    if source is not None and source != "USER_INFO":
        keys.refuse(f"{prefix}.basic.auth.credentials.source",
                    f"{source}: bridge's registry client takes USER_INFO")  # fmt: skip
    elif info is not None or source == "USER_INFO":
        # The registry's client takes user:password as basic.auth.user.info alone.
        properties = found.setdefault("properties", {})
        where = keys.secret(REGISTRY_USER_INFO_FILE)
        properties["basic.auth.user.info"] = f"${{file:{where}}}"
        if not any(where in note for note in notes):
            notes.append(f"{prefix}.basic.auth.user.info: not copied; write the registry's "
                         f"user:password into {where}")  # fmt: skip
    return found


def _evolution(keys: _Keys, debezium: bool, formats: dict[str, str]) -> dict[str, Any]:
    if debezium:
        evolution = keys.get("schema.evolution", "none") or "none"
        if evolution not in ("none", "basic"):
            keys.refuse("schema.evolution", f"{evolution!r} is not none or basic")
        wanted = {"auto_create": True, "auto_evolve": True} if evolution == "basic" else {}
        where = "schema.evolution"
    else:
        wanted = {
            key: True
            for name, key in (("auto.create", "auto_create"), ("auto.evolve", "auto_evolve"))
            if (keys.get(name, "false") or "false").lower() == "true"
        }
        where = "auto.create" if "auto_create" in wanted else "auto.evolve"
    if wanted and formats.get("value_format") not in ("avro", "json-schema", "protobuf"):
        keys.refuse(where, "a table that follows its records needs their writer schemas: "
                    "AvroConverter, JsonSchemaConverter or ProtobufConverter through a "
                    "registry")  # fmt: skip
    return wanted


def _errors(keys: _Keys, notes: list[str]) -> dict[str, Any]:
    tolerance = keys.get("errors.tolerance", "none") or "none"
    if tolerance == "all":
        if keys.get("errors.deadletterqueue.topic.name") is not None:
            notes.append(
                "errors.deadletterqueue.topic.name: dead letters go to the state schema's "
                "dead_letters table, in the batch's transaction, not to a topic"
            )
        return {"on_record_error": "dead_letter"}
    if tolerance == "none":
        keys.left_out("errors.deadletterqueue.topic.name", "errors.tolerance is none")
        return {"on_record_error": "stop"}
    keys.refuse("errors.tolerance", f"{tolerance!r} is not all or none")
    return {}


def _settings_left_out(keys: _Keys, debezium: bool, notes: list[str]) -> None:
    """Keys with no bridge setting, each left out with why, or refused where bridge would
    write otherwise than Connect did."""
    for key, why in _LEFT_OUT.items():
        keys.left_out(key, why)
    for key in keys.config:
        for prefix, why in _LEFT_OUT_PREFIXES.items():
            if key.startswith(prefix) and key not in keys.fates:
                keys.left_out(key, why)
    if "consumer.override.auto.offset.reset" in keys.config:
        notes.append("consumer.override.auto.offset.reset: bridge's is consumer.start_policy")
    dialect = keys.config.get("dialect.name", "")
    if dialect and dialect != "PostgreSqlDatabaseDialect":
        keys.refuse("dialect.name", f"{dialect}: bridge writes PostgreSQL only")
    else:
        keys.left_out("dialect.name", "bridge writes PostgreSQL")
    dates = keys.config.get("date.timezone")
    if dates is not None:
        zone = keys.config.get("db.timezone", "UTC") if dates == "DB_TIMEZONE" else dates
        if _is_utc(zone):
            keys.left_out("date.timezone", "a date is written as the date it is")
        else:
            keys.refuse("date.timezone", f"{dates}: Connect writes a date as its midnight in "
                        f"{zone}; bridge writes a date as the date it is (set it UTC)")  # fmt: skip
    types = keys.config.get("table.types")
    if types is not None and types.upper() != "TABLE":
        keys.refuse("table.types", f"{types}: bridge writes tables only")
    keys.left_out("table.types", "bridge writes tables")
    for strategy in ("table.naming.strategy", "column.naming.strategy",
                     "collection.naming.strategy"):  # fmt: skip
        chosen = keys.config.get(strategy)
        if chosen is not None and "Default" not in chosen:
            keys.refuse(strategy, f"{chosen}: bridge names tables and columns by its routes")
        keys.left_out(strategy, "the default naming: the routes' table and column names")
    provider = keys.config.get("jdbc.credentials.provider.class")
    if provider is not None and not provider.endswith("DefaultJdbcCredentialsProvider"):
        keys.refuse("jdbc.credentials.provider.class", f"{provider}: the database's password "
                    "comes with postgres.dsn, which may name a file (${file:...})")  # fmt: skip
    keys.left_out("jdbc.credentials.provider.class", "the password comes with postgres.dsn")
    calendar = keys.config.get("date.calendar.system")
    if calendar is not None:
        keys.left_out("date.calendar.system", "bridge's dates are proleptic Gregorian"
                      + ("" if calendar == "PROLEPTIC_GREGORIAN" else
                         ": dates before 1582-10-15 differ from LEGACY's"))  # fmt: skip
    if (keys.config.get("replace.null.with.default", "false")).lower() == "true":
        keys.refuse("replace.null.with.default", "bridge writes a null field as NULL, not as its "
                    "schema's default (set it false)")  # fmt: skip
    keys.left_out("replace.null.with.default", "a null field is written as NULL, as here")
    if "string.output.value.column.name" in keys.config:
        why = (
            "a plain string value as one column has no bridge setting: bridge reads values "
            "as JSON, Avro or JSON Schema"
        )
        keys.refuse("string.output.value.column.name", why)
    if keys.config.get("timestamp.fields.list"):
        keys.refuse("timestamp.fields.list", "no per-field setting: epoch_millis_timestamps "
                    "reads an integer as milliseconds for every timestamp column of a JSON "
                    "route")  # fmt: skip
    keys.left_out("timestamp.fields.list", "empty")
    zone_setting = keys.config.get("use.time.zone")
    if zone_setting is not None:
        keys.left_out("use.time.zone", "timestamps are written as instants, in UTC")


def _zone(keys: _Keys, debezium: bool) -> dict[str, str]:
    """Connect's `db.timezone` (Debezium's `database.time_zone`): the zone whose local time an
    instant is written as into a timestamp column without time zone, as `timestamp_zone`."""
    zone_key = "database.time_zone" if debezium else "db.timezone"
    zone = keys.get(zone_key)
    if zone is None or _is_utc(zone):
        return {}
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        keys.refuse(zone_key, f"{zone}: not a time zone bridge knows (an IANA name)")
        return {}
    return {"timestamp_zone": zone}


def _is_utc(zone: str) -> bool:
    return zone.upper() in ("UTC", "Z", "ETC/UTC", "GMT")


def _routes(
    keys: _Keys,
    route: dict[str, Any],
    debezium: bool,
    notes: list[str],
    renaming: dict[str, str] | None,
) -> list[dict[str, Any]]:
    format_key = (
        "collection.name.format"
        if "collection.name.format" in keys.config
        else ("table.name.format")
    )  # Debezium 3 renamed it
    template = keys.get(format_key, "${topic}") or "${topic}"
    pattern = keys.get("topics.regex")
    topics = _list(keys.get("topics", "") or "")
    routes: list[dict[str, Any]] = []
    # Connect's JDBC sink quotes each part of a table's name unless told not to; Debezium's
    # does not unless told to. Unquoted, PostgreSQL folds a name to lower case.
    quoting = "quote.identifiers" if debezium else "quote.sql.identifiers"
    quote = (keys.get(quoting) or ("false" if debezium else "always")).lower() in (
        "always", "true",
    )  # fmt: skip

    if not quote:
        notes.append(
            f"{quoting}: unquoted, as Connect wrote them, table names are lower case; bridge "
            "matches columns to fields exactly, so a field whose case differs from its column's "
            "needs fields.rename"
        )

    def named(part: str) -> str | None:
        """A part of a table's name as Connect writes it, as a route names it; None when
        unquoted it is no name at all."""
        if quote:
            return _quoted(part)
        plain = part.lower()
        return plain if _LOWER_IDENTIFIER.match(plain.replace("${topic}", "t")) else None

    if pattern:
        # Connect writes each topic's name as it is, quoted: so does a quoted ${topic}.
        parts = template.split(".")
        if len(parts) > 2:
            keys.refuse(format_key, f"{template}: a bridge table is `table` or `schema.table`")
        elif None in (names := [named(p) for p in (["public"] if len(parts) == 1 else []) + parts]):
            keys.refuse(format_key, f"{template}: unquoted ({quoting}), not a table's name")
        else:
            table = ".".join(cast(list[str], names))
            renamed = {} if renaming is None else {"topic_rename": renaming}
            routes.append({"topic_pattern": pattern, "table": table, **renamed, **route})
            notes.append(
                f"topics.regex: each topic's table is named as Connect names it ({table}: "
                + ("the topic's name as it is, quoted; " if quote else "lowercased; ")
                + "docs/routes.md)"
            )
    for topic in topics:
        name = template.replace("${topic}", _renamed(topic, renaming))
        if debezium:  # Debezium's default table naming makes dots underscores
            name = name.replace(".", "_")
        parts = name.split(".")
        # Connect's JDBC sink reads `schema.table` from a name with a dot (`catalog.schema.table`
        # from two), and quotes each part as it is (quote.sql.identifiers: always).
        if len(parts) > 2:
            keys.refuse(format_key if format_key in keys.config else "topics",
                        f"topic {topic}: Connect writes table {name} as catalog.schema.table; "
                        "a bridge table is `table` or `schema.table`: give it in "
                        "table.name.format")  # fmt: skip
            continue
        qualified = [named(part) for part in (["public", *parts] if len(parts) == 1 else parts)]
        if None in qualified:
            keys.refuse(format_key if format_key in keys.config else "topics",
                        f"topic {topic}: Connect would write table {name} unquoted ({quoting}), "
                        "which is not a table's name: quote it, or name the table in "
                        "table.name.format")  # fmt: skip
            continue
        routes.append({"topic": topic, "table": ".".join(cast(list[str], qualified)), **route})
    if not routes and not keys.problems:
        keys.refuse("topics", "needs topics or topics.regex")
    if topics and pattern:
        keys.refuse("topics.regex", "topics or topics.regex, not both")
    return routes


def _renamed(topic: str, renaming: dict[str, str] | None) -> str:
    """A topic's name as RegexRouter makes it, for a table named by it."""
    if renaming is None:
        return topic
    return renamed_topic(
        topic, re.compile(renaming["regex"]), java_replacement(renaming["replacement"])
    )


def _quoted(part: str) -> str:
    """A part of a table's name as Connect writes it: a plain lowercase name as it is (the same
    table quoted or not), any other quoted, so that PostgreSQL keeps it exactly
    (`"shop-orders"`, `"Orders"`)."""
    if _LOWER_IDENTIFIER.match(part):
        return part
    return '"' + part.replace('"', '""') + '"'


def _database(keys: _Keys, notes: list[str]) -> dict[str, Any] | None:
    url = keys.get("connection.url")
    if url is None:
        return None
    if not url.startswith("jdbc:postgresql://"):
        keys.refuse("connection.url", "bridge writes PostgreSQL: jdbc:postgresql://...")
        return None
    parts = urlsplit(url.removeprefix("jdbc:"))
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    user = keys.get("connection.user") or keys.get("connection.username") or query.pop("user", "")
    password = keys.get("connection.password") or query.pop("password", None)
    options = "&".join(f"{k}={v}" for k, v in query.items())  # libpq takes most of pgjdbc's
    where = f"{parts.netloc}{parts.path}{'?' + options if options else ''}"
    if password is None:
        return {"dsn": f"postgresql://{user + '@' if user else ''}{where}"}
    key = "connection.password" if "connection.password" in keys.config else "connection.url"
    notes.append(
        f"{key}: the password is not copied; write postgresql://{user}:<password>@{where} into "
        f"{keys.secret(DSN_FILE)} (postgres.dsn names that file)"
    )
    return {"dsn": f"${{file:{keys.secret(DSN_FILE)}}}"}


def _transforms(
    keys: _Keys,
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any], dict[str, str] | None]:
    """The route's `fields`, its metadata columns, its other settings that transforms
    translate to, and its `topic_rename` (RegexRouter's), if any."""
    fields: dict[str, Any] = {}
    metadata: dict[str, str] = {}
    other: dict[str, Any] = {}
    renaming: dict[str, str] | None = None
    for name in _list(keys.get("transforms", "") or ""):
        prefix = f"transforms.{name}."
        kind = keys.get(prefix + "type", "") or ""
        options = [k for k in keys.config if k.startswith(prefix) and k != prefix + "type"]
        if kind.endswith("ReplaceField$Value"):
            include = _list(keys.get(prefix + "include") or keys.get(prefix + "whitelist") or "")
            exclude = _list(keys.get(prefix + "exclude") or keys.get(prefix + "blacklist") or "")
            if include:
                fields["include"] = include
            if exclude:
                fields["exclude"] = exclude
            renames = _list(keys.get(prefix + "renames", "") or "")
            if renames:
                pairs = [r.split(":", 1) for r in renames]
                bad = [r for r, p in zip(renames, pairs, strict=True) if len(p) != 2]
                if bad:
                    keys.refuse(prefix + "renames", f"{', '.join(bad)}: not from:to")
                fields["rename"] = {p[0]: p[1] for p in pairs if len(p) == 2}
        elif kind.endswith("InsertField$Value"):
            for option, source in _INSERT_FIELDS.items():
                column = keys.get(prefix + option)
                if column:
                    metadata[column.removesuffix("!").removesuffix("?")] = source
        elif kind == "io.debezium.transforms.ExtractNewRecordState":
            other.update(_unwrap(keys, prefix))
        elif kind == "org.apache.kafka.connect.transforms.Cast$Value":
            fields.setdefault("cast", {}).update(_cast(keys, prefix, fields.get("rename", {})))
        elif kind == "org.apache.kafka.connect.transforms.TimestampConverter$Value":
            found = _timestamp(keys, prefix)
            if found is not None:
                named = _field_before(found[0], fields.get("rename", {}))
                fields.setdefault("timestamps", {})[named] = found[1]
        elif kind == "org.apache.kafka.connect.transforms.RegexRouter":
            if renaming is not None:
                keys.refuse(prefix + "type", "one RegexRouter: give its regex every topic")
            renaming = _regex_router(keys, prefix)
        else:
            keys.refuse(prefix + "type", f"{kind or 'missing'}: no bridge setting does it")
            for option in options:
                keys.left_out(option, f"an option of transform {name}, refused")
    for key in keys.config:
        if key == "predicates" or key.startswith("predicates.") or key.endswith(".predicate"):
            keys.refuse(key, "a transform applied to some records only has no bridge setting")
        elif key.startswith("transforms.") and key not in keys.fates:
            keys.refuse(key, "an option no transform here takes")
    return fields, metadata, other, renaming


_CAST_TYPES = ("int8", "int16", "int32", "int64", "float32", "float64", "boolean", "string")
_TIMESTAMP_TYPES = {"Timestamp": "timestamp", "Date": "date", "Time": "time", "unix": "unix",
                    "string": "string"}  # fmt: skip


def _field_before(name: str, renames: dict[str, str]) -> str:
    """A field's name in the record, where a ReplaceField before this transform renamed it:
    bridge's conversions name the record's fields."""
    return next((source for source, column in renames.items() if column == name), name)


def _cast(keys: _Keys, prefix: str, renames: dict[str, str]) -> dict[str, str]:
    """Cast$Value's `spec` (`field:type,...`) as `fields.cast`."""
    spec = _list(keys.get(prefix + "spec", "") or "")
    found: dict[str, str] = {}
    for item in spec:
        name, colon, kind = item.partition(":")
        if not colon:
            keys.refuse(prefix + "spec", f"{item}: a cast of the whole value has no bridge "
                        "setting: cast its fields (field:type)")  # fmt: skip
        elif kind.strip() not in _CAST_TYPES:
            keys.refuse(prefix + "spec", f"{item}: {kind.strip()} is not one of "
                        f"{', '.join(_CAST_TYPES)}")  # fmt: skip
        else:
            found[_field_before(name.strip(), renames)] = kind.strip()
    if not spec:
        keys.refuse(prefix + "spec", "required")
    return found


def _timestamp(keys: _Keys, prefix: str) -> tuple[str, dict[str, str]] | None:
    """TimestampConverter$Value of one field as its `fields.timestamps` entry."""
    name = keys.get(prefix + "field", "") or ""
    target = keys.get(prefix + "target.type", "") or ""
    chosen: dict[str, str] = {"type": _TIMESTAMP_TYPES.get(target, "")}
    pattern = keys.get(prefix + "format")
    precision = keys.get(prefix + "unix.precision", "milliseconds") or "milliseconds"
    for option in ("format", "unix.precision"):
        keys.get(prefix + option)
    problems = len(keys.problems)
    if not name:
        keys.refuse(prefix + "field", "a conversion of the whole value has no bridge setting: "
                    "name its field")  # fmt: skip
    if not chosen["type"]:
        keys.refuse(prefix + "target.type", f"{target or 'missing'}: one of "
                    f"{', '.join(_TIMESTAMP_TYPES)}")  # fmt: skip
    if pattern:
        try:
            date_format(pattern)
        except ValueError as exc:
            keys.refuse(prefix + "format", str(exc))
        chosen["format"] = pattern
    elif chosen["type"] == "string":
        keys.refuse(prefix + "format", "target.type string needs format")
    if precision not in ("seconds", "milliseconds", "microseconds", "nanoseconds"):
        keys.refuse(prefix + "unix.precision", f"{precision}: seconds, milliseconds, "
                    "microseconds or nanoseconds")  # fmt: skip
    elif precision != "milliseconds":
        chosen["unix_precision"] = precision
    return (name, chosen) if len(keys.problems) == problems else None


def _regex_router(keys: _Keys, prefix: str) -> dict[str, str] | None:
    """RegexRouter as the routes' `topic_rename`."""
    regex = keys.get(prefix + "regex") or ""
    replacement = keys.get(prefix + "replacement")
    if not regex or replacement is None:
        keys.refuse(prefix + ("regex" if not regex else "replacement"), "required")
        return None
    try:
        re.compile(regex)
        java_replacement(replacement)
    except (re.error, ValueError) as exc:
        keys.refuse(prefix + "regex", f"{regex}: {exc}")
        return None
    return {"regex": regex, "replacement": replacement}


# ExtractNewRecordState's ways with a delete that end with the row deleted, as the route does.
# (The legacy mode's `drop` drops the event and keeps Debezium's tombstone after it; the new
# mode's `drop` drops both.)
_DELETES = {
    "delete.handling.mode": ("drop", "none"),
    "delete.tombstone.handling.mode": ("tombstone", "delete-to-tombstone"),
}


def _unwrap(keys: _Keys, prefix: str) -> dict[str, Any]:
    """Debezium's ExtractNewRecordState as `unwrap: debezium`, which writes the `after` image
    and deletes on a delete, or refused where the SMT would do otherwise."""
    found: dict[str, Any] = {"unwrap": "debezium"}
    added = _list(keys.get(prefix + "add.fields", "") or "")
    if added:
        bad = [f for f in added if not _UNWRAP_FIELD.match(f)]
        if bad:
            keys.refuse(prefix + "add.fields", f"{', '.join(bad)}: unwrap_fields takes op, ts_ms "
                        "and source.<field>")  # fmt: skip
        found["unwrap_fields"] = [f for f in added if f not in bad]
    if (keys.get(prefix + "add.fields.prefix", "__") or "__") != "__":
        keys.refuse(prefix + "add.fields.prefix", "unwrap_fields are named __<field>")
    for option, kept in _DELETES.items():
        mode = keys.get(prefix + option)
        if mode is not None and mode not in kept:
            keys.refuse(prefix + option, f"{mode}: the route deletes the row of a delete event "
                        "(by its key_columns); a row kept and marked deleted has no bridge "
                        "setting")  # fmt: skip
    if (keys.get(prefix + "drop.tombstones", "false") or "false").lower() == "true":
        keys.refuse(prefix + "drop.tombstones", "true would drop deletes; the route applies "
                    "every delete (set it false)")  # fmt: skip
    return found


def _field_lists(keys: _Keys, debezium: bool) -> dict[str, Any]:
    if not debezium:
        whitelist = _list(keys.get("fields.whitelist", "") or "")
        return {"include": whitelist} if whitelist else {}
    chosen: dict[str, Any] = {}
    for key, side in (("field.include.list", "include"), ("field.exclude.list", "exclude")):
        names = _list(keys.get(key, "") or "")
        if names:  # fully qualified as topic:field; bridge's routes name a field alone
            chosen[side] = [name.rpartition(":")[2] for name in names]
    return chosen


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
