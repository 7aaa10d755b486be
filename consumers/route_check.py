"""`bridge consume --check`: what each route will do, and every problem, before anything runs.

Kafka Connect validates a connector's configuration before it starts it; this does the same
for the consumer, and says what the service would do. It reads the configuration (a bad one is
refused with all its problems by `bridge.settings`), then, without joining the group, creating
the state schema or writing a row:

- asks Kafka for its topics: each named topic must exist; each pattern lists what it matches;
- connects to PostgreSQL and reflects each route's table, as the service's start does
  (`consumers.tables.routing`: every route's problems, not the first one);
- asks the schema registry for its subjects, when a route needs one.

For each route it gives the topic or pattern, the table, the columns it fills and from what,
the key columns and their source, the mode, what a tombstone does and what a bad record does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from bridge.errors import BridgeError, ConfigError, PermissionMissing
from bridge.kafka_client_log import ClientLog
from bridge.settings import BridgeSettings, ConsumerSettings, RouteSettings
from bridge.topic_patterns import matches
from consumers.database.state import sqlalchemy_engine
from consumers.decoding.registry_schemas import SchemaCache
from consumers.tables.routing import Router
from consumers.tables.targets import Target

_TIMEOUT_S = 10.0
_KAFKA_SOURCES = ("topic", "partition", "offset")  # key_source kafka: the three key columns'


@dataclass
class Checked:
    """The routes' plans, and every problem found: (where, what)."""

    plans: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)


def check(settings: BridgeSettings) -> Checked:
    consumer = settings.consumer
    done = Checked()
    if consumer is None or not consumer.routes:
        done.problems.append(("consumer.routes", "no routes: the consumer would read nothing"))
        return done
    topics = _kafka_topics(settings, done)
    typed = any(r.needs_registry for r in consumer.routes)
    schemas = None
    if typed and settings.schema_registry is not None:
        schemas = SchemaCache(settings.schema_registry)
        _registry(schemas, done)
    try:
        settings.consumer_to_run()  # routes in the registry's format without one: said here
    except ConfigError as exc:
        done.problems += exc.problems
    try:
        dsn = settings.postgres.dsn.get_secret_value()
        # Typed routes are planned with their registry; without it, only the problem is said.
        if _postgres(dsn, done) and (schemas is not None or not typed):
            _routes(consumer, dsn, schemas, topics, done)
    finally:
        if schemas is not None:
            schemas.close()
    return done


def _kafka_topics(settings: BridgeSettings, done: Checked) -> set[str] | None:
    log = ClientLog()
    admin = AdminClient({**settings.kafka.client_config(), "logger": log.logger})  # type: ignore[dict-item]
    try:
        found = set(admin.list_topics(timeout=_TIMEOUT_S).topics)
    except KafkaException as exc:
        done.problems.append(("kafka", f"unreachable: {exc.args[0].str()}{log.cause(admin)}"))
        return None
    assert settings.consumer is not None  # noqa: S101 - checked by the caller
    for index, route in enumerate(settings.consumer.routes):
        if route.topic is not None and route.topic not in found:
            done.problems.append(
                (f"consumer.routes.{index}.topic", f"topic {route.topic!r} does not exist in Kafka")
            )
    return found


def _registry(schemas: SchemaCache, done: Checked) -> None:
    try:
        schemas.answers()
    except BridgeError as exc:
        done.problems.append(("schema_registry.url", str(exc)))


def _postgres(dsn: str, done: Checked) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=int(_TIMEOUT_S)):
            return True
    except psycopg.OperationalError as exc:
        done.problems.append(("postgres.dsn", f"unreachable: {str(exc).strip()}"))
        return False


def _routes(
    consumer: ConsumerSettings,
    dsn: str,
    schemas: SchemaCache | None,
    topics: set[str] | None,
    done: Checked,
) -> None:
    router = Router(dsn=dsn, config=consumer, schemas=schemas)
    engine = sqlalchemy_engine(dsn)
    try:
        try:
            named = router.named(engine)
        except ConfigError as exc:
            done.problems += exc.problems
            named = {}
        except PermissionMissing as exc:
            done.problems.append(("consumer.routes", str(exc)))
            named = {}
        for index, route in enumerate(consumer.routes):
            if route.topic is not None:
                routed = named.get(route.topic)
                if routed is not None:
                    done.plans.append(_plan(index, route, route.topic, routed[0], routed[1]))
                continue
            matched = sorted(t for t in topics or () if matches(str(route.topic_pattern), t))
            done.plans.append(
                f"route {index}: pattern {route.topic_pattern!r} matches "
                f"{', '.join(matched) or 'no topic yet'} (topics made later are read too)"
            )
            try:
                for topic, (target, follower) in router.matched(matched).items():
                    done.plans.append(_plan(index, route.for_topic(topic), topic, target, follower))
            except ConfigError as exc:
                done.problems += exc.problems
    finally:
        engine.dispose()


def _plan(index: int, route: RouteSettings, topic: str, target: Target, follower: Any) -> str:
    lines = [f"route {index}: topic {topic} -> {route.table} ({route.mode}, values "
             f"{route.value_format})"]  # fmt: skip
    if follower is not None and follower.target is None:
        lines.append("  table: not there yet; created from the first record's writer schema "
                     "(auto_create), its key columns the primary key")  # fmt: skip
    else:
        for column in target.columns:
            lines.append(f"  {column} <- {_source(route, target, column)}")
        if route.auto_evolve:
            lines.append(
                "  a field a new writer schema adds becomes a nullable column (auto_evolve)"
            )
    keys = ", ".join(route.key_columns)
    source = {
        "value": "the value's fields",
        "record_key": f"the record key ({route.key_format})",
        "kafka": "the record's topic, partition and offset",
    }[route.key_source]
    lines.append(f"  key: {keys}, from {source}" if keys else "  key: none (each record a row)")
    lines.append(f"  a tombstone: {_tombstone(route)}")
    stops = route.on_record_error == "stop"
    bad = "stops its partition until it fits" if stops else "a dead letter, with where and why"
    lines.append(f"  a bad record: {bad}")
    if route.epochs == "whole":
        named = "" if "epochs" in route.model_fields_set else ", the default"
        lines.append(
            "  visible by whole Spark epochs of bridge's sink, other producers' records as their "
            f"batches commit (epochs: whole{named})"
        )
    return "\n".join(lines)


def _source(route: RouteSettings, target: Target, column: str) -> str:
    if column in target.generated:
        return "nothing: the table computes it (GENERATED)"
    if column in route.metadata:
        return f"the record's {route.metadata[column]}"
    if column in route.key_columns and route.key_source == "kafka":
        return f"the record's {_KAFKA_SOURCES[route.key_columns.index(column)]} (key)"
    if column in route.key_columns and route.key_source == "record_key":
        return "the record key (key)"
    renamed = {c: f for f, c in route.fields.rename.items()}
    name = renamed.get(column, column)
    if not route.fields.takes(name):
        return "nothing: fields leaves it out; " + _absent(target, column)
    key = " (key)" if column in route.key_columns else ""
    return f"the value's field {name}{key}; when absent, {_absent(target, column)}"


def _absent(target: Target, column: str) -> str:
    if column in target.required:
        return "a dead letter (NOT NULL, no default)"
    if column in target.defaulted:
        return "its default"
    return "NULL"


def _tombstone(route: RouteSettings) -> str:
    if not route.key_columns:
        return "a dead letter: the route has no key columns to delete by"
    if route.key_source == "kafka":
        return "a dead letter: no row is keyed by its own coordinates"
    return f"deletes the row of its record key ({route.key_format})"
