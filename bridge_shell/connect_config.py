"""A Kafka Connect JDBC sink configuration as bridge's consumer routes (`bridge routes
from-connect`).

The mapping is the table in docs/routes.md ("Coming from Kafka Connect"). What has no meaning
for bridge (task counts, batch sizes, the JDBC dialect) is listed as left out; what bridge would
do differently without saying so is refused, every problem in one `ConfigError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.errors import ConfigError

# Settings that tune Connect's own runtime or the JDBC connection: nothing to translate.
_RUNTIME = re.compile(
    r"^(name|connector\.class|tasks\.max|batch\.size|max\.retries|retry\.backoff\.ms|"
    r"dialect\.name|db\.timezone|connection\.(url|user|password|attempts|backoff\.ms)|"
    r"quote\.sql\.identifiers|table\.types|errors\.(log\.enable|log\.include\.messages|"
    r"deadletterqueue\.topic\.replication\.factor|deadletterqueue\.context\.headers\.enable|"
    r"retry\.timeout|retry\.delay\.max\.ms)|(key|value)\.converter\.schemas\.enable|"
    r"(key|value)\.converter\.basic\.auth\..*|delete\.enabled|pk\.mode|pk\.fields|topics|"
    r"topics\.regex|table\.name\.format|insert\.mode|auto\.create|auto\.evolve|"
    r"fields\.whitelist|errors\.tolerance|errors\.deadletterqueue\.topic\.name|"
    r"(key|value)\.converter(\.schema\.registry\.url)?|transforms(\..*)?)$"
)
_CONVERTERS = {
    "io.confluent.connect.avro.AvroConverter": "avro",
    "io.apicurio.registry.utils.converter.AvroConverter": "avro",
    "io.confluent.connect.json.JsonSchemaConverter": "json-schema",
    "org.apache.kafka.connect.json.JsonConverter": "json",
    "org.apache.kafka.connect.storage.StringConverter": "json",
}
_KAFKA_PK_DEFAULTS = ("__connect_topic", "__connect_partition", "__connect_offset")
_INSERT_FIELDS = {
    "topic.field": "topic",
    "partition.field": "partition",
    "offset.field": "offset",
    "timestamp.field": "timestamp",
}


@dataclass
class Translated:
    """The consumer section's routes and what else the configuration says, with notes."""

    consumer: dict[str, Any]
    schema_registry: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        found: dict[str, Any] = {"consumer": self.consumer}
        if self.schema_registry is not None:
            found["schema_registry"] = self.schema_registry
        return found


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


def translate(config: Mapping[str, str]) -> Translated:
    """`config`'s routes, or ConfigError with every problem."""
    problems: list[tuple[str, str]] = []
    route: dict[str, Any] = {}
    notes: list[str] = []

    mode = config.get("insert.mode", "insert")
    if mode not in ("insert", "upsert", "update"):
        problems.append(("insert.mode", f"{mode!r} is not insert, upsert or update"))
    route["mode"] = mode

    route.update(_key(config, problems))
    for name, key in (("auto.create", "auto_create"), ("auto.evolve", "auto_evolve")):
        if config.get(name, "false").lower() == "true":
            route[key] = True

    formats, registry = _formats(config, problems)
    route.update(formats)

    fields, metadata = _transforms(config, problems)
    whitelist = _list(config.get("fields.whitelist", ""))
    if whitelist:
        fields.setdefault("include", whitelist)
    if fields:
        route["fields"] = fields
    if metadata:
        route["metadata"] = metadata

    tolerance = config.get("errors.tolerance", "none")
    if tolerance == "all":
        route["on_record_error"] = "dead_letter"
        if "errors.deadletterqueue.topic.name" in config:
            notes.append(
                "errors.deadletterqueue.topic.name: dead letters go to the state schema's "
                "dead_letters table, in the batch's transaction, not to a topic"
            )
    elif tolerance == "none":
        route["on_record_error"] = "stop"
    else:
        problems.append(("errors.tolerance", f"{tolerance!r} is not all or none"))
    if config.get("delete.enabled", "false").lower() == "true" and not route.get("key_columns"):
        problems.append(("delete.enabled", "deletes by key: set pk.mode and pk.fields"))

    table = config.get("table.name.format", "${topic}")
    if "." not in table:
        table = f"public.{table}"
    routes = []
    if config.get("topics.regex"):
        routes.append({"topic_pattern": config["topics.regex"], "table": table, **route})
    for topic in _list(config.get("topics", "")):
        routes.append({"topic": topic, "table": table.replace("${topic}", topic), **route})
    if not routes:
        problems.append(("topics", "needs topics or topics.regex"))
    if _list(config.get("topics", "")) and config.get("topics.regex"):
        problems.append(("topics.regex", "topics or topics.regex, not both"))
    unknown = sorted(k for k in config if not _RUNTIME.match(k))
    problems += [(k, "no bridge setting does what this does") for k in unknown]
    if problems:
        raise ConfigError(problems, source="the Kafka Connect configuration")
    name = config.get("name", "connect")
    consumer = {"group_id": f"connect-{name}", "routes": routes}
    runtime = sorted(
        k
        for k in config
        if k.startswith(("connection.", "tasks.max", "batch.size", "dialect.", "max.retries"))
    )
    if runtime:
        notes.append(
            f"{', '.join(runtime)}: Connect's runtime and JDBC settings; the database is "
            "postgres.dsn, one consumer member is one process (run several for more)"
        )
    return Translated(consumer, registry, notes)


def _key(config: Mapping[str, str], problems: list[tuple[str, str]]) -> dict[str, Any]:
    pk_mode = config.get("pk.mode", "none")
    pk_fields = _list(config.get("pk.fields", ""))
    if pk_mode == "none":
        if config.get("insert.mode", "insert") != "insert":
            problems.append(("pk.mode", "none, but upsert and update need a key"))
        return {}
    if pk_mode == "record_value":
        if not pk_fields:
            problems.append(("pk.fields", "record_value needs the fields of the key, by name"))
        return {"key_source": "value", "key_columns": pk_fields}
    if pk_mode == "record_key":
        if not pk_fields:
            why = "record_key needs the key columns' names (for a primitive key, its one)"
            problems.append(("pk.fields", why))
        return {"key_source": "record_key", "key_columns": pk_fields}
    if pk_mode == "kafka":
        columns = pk_fields or list(_KAFKA_PK_DEFAULTS)
        if len(columns) != 3:
            problems.append(("pk.fields", "kafka needs three names: topic, partition, offset"))
        return {"key_source": "kafka", "key_columns": columns}
    problems.append(("pk.mode", f"{pk_mode!r} is not none, record_value, record_key or kafka"))
    return {}


def _formats(
    config: Mapping[str, str], problems: list[tuple[str, str]]
) -> tuple[dict[str, str], dict[str, Any] | None]:
    formats: dict[str, str] = {}
    registry: dict[str, Any] | None = None
    for side in ("key", "value"):
        converter = config.get(f"{side}.converter")
        if converter is None:
            continue
        chosen = _CONVERTERS.get(converter)
        if chosen is None:
            problems.append((f"{side}.converter", f"{converter} has no bridge format"))
            continue
        if chosen != "json":
            formats[f"{side}_format"] = chosen
            url = config.get(f"{side}.converter.schema.registry.url")
            if url is None:
                problems.append((f"{side}.converter.schema.registry.url", "required"))
            elif registry is not None and registry["url"] != url:
                problems.append((f"{side}.converter.schema.registry.url", "one registry only"))
            else:
                registry = {"url": url}
    return formats, registry


def _transforms(
    config: Mapping[str, str], problems: list[tuple[str, str]]
) -> tuple[dict[str, Any], dict[str, str]]:
    fields: dict[str, Any] = {}
    metadata: dict[str, str] = {}
    for name in _list(config.get("transforms", "")):
        prefix = f"transforms.{name}."
        kind = config.get(prefix + "type", "")
        if kind.endswith("ReplaceField$Value"):
            include = _list(config.get(prefix + "include", config.get(prefix + "whitelist", "")))
            exclude = _list(config.get(prefix + "exclude", config.get(prefix + "blacklist", "")))
            if include:
                fields["include"] = include
            if exclude:
                fields["exclude"] = exclude
            renames = _list(config.get(prefix + "renames", ""))
            if renames:
                pairs = [r.split(":", 1) for r in renames]
                bad = [r for r, p in zip(renames, pairs, strict=True) if len(p) != 2]
                if bad:
                    problems.append((prefix + "renames", f"{', '.join(bad)}: not from:to"))
                fields["rename"] = {p[0]: p[1] for p in pairs if len(p) == 2}
        elif kind.endswith("InsertField$Value"):
            for option, source in _INSERT_FIELDS.items():
                column = config.get(prefix + option)
                if column:
                    metadata[column.removesuffix("!").removesuffix("?")] = source
        else:
            problems.append((prefix + "type", f"{kind or 'missing'}: no bridge setting does it"))
    return fields, metadata


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
