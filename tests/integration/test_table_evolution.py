"""Tables that follow their records' writer schemas, on the real stack and registry: created from
the first record, evolved mid-stream in the batch's own transaction (also with the consumer
SIGKILLed in that transaction before its ALTER, inside it, and right after its commit, with
Avro and with Protobuf values), by two
members at once, and stopped, never dead-lettered, by a change a column cannot mend, until the
table is fixed by hand."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import psycopg
import pytest
import yaml
from pyspark.sql import types as T

from bridge.kafka_admin import create_topic
from spark_jobs.registry_frames import register
from tests.consumer_helpers import (
    dead_letters,
    drained,
    eventually,
    produce,
    running,
    sample,
    settings_for,
    sql,
)
from tests.harness import Endpoints
from tests.integration.test_consumer_faults import start_consumer
from tests.integration.test_operator_tools import bridge
from tests.kafka_helpers import transactional_producer

PARTITIONS = 2
V1: dict[str, Any] = {
    "type": "record",
    "name": "Payment",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "flag", "type": "boolean"},
        {"name": "n", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "score", "type": "double"},
        {"name": "note", "type": ["null", "string"]},
        {"name": "raw", "type": "bytes"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 20, "scale": 4}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "two", "type": {"type": "fixed", "name": "Two", "size": 2}},
        {"name": "clock", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ms_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "sub", "type": {"type": "record", "name": "Sub",
                                 "fields": [{"name": "a", "type": "int"}]}},
        {"name": "either", "type": ["null", "string", "long"]},
    ],
}  # fmt: skip
# V1 and one more field, nullable: what auto_evolve adds as a column.
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "region", "type": ["null", "string"],
                                                       "default": None}]}  # fmt: skip
COLUMNS = {
    "id": "bigint", "flag": "boolean", "n": "integer", "ratio": "real",
    "score": "double precision", "note": "text", "raw": "bytea", "amount": "numeric(20,4)",
    "day": "date", "at": "timestamp with time zone", "local": "timestamp without time zone",
    "ref": "uuid", "kind": "text", "tags": "text[]", "attrs": "jsonb", "two": "bytea",
    "clock": "time without time zone", "ms_at": "timestamp with time zone", "sub": "jsonb",
    "either": "text",
}  # fmt: skip


def _record(i: int, **more: Any) -> dict[str, Any]:
    return {
        "id": i, "flag": i % 2 == 0, "n": -i, "ratio": 0.5, "score": i / 3,
        "note": None if i % 3 else f"n{i}", "raw": bytes([i % 256]),
        "amount": Decimal(i).scaleb(-4), "day": date(2026, 1, 1 + i % 28),
        "at": datetime(2026, 11, 25, 1, 2, 3, i % 1_000_000, tzinfo=UTC),
        "local": datetime(2000, 1, 1, 0, 0, i % 60), "ref": f"00000000-0000-0000-0000-{i:012d}",
        "kind": "AB"[i % 2], "tags": [f"t{i}", "x"], "attrs": {"k": i}, "two": b"ab",
        "clock": time(1, 2, 3, i % 1_000_000),
        "ms_at": datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
        "sub": {"a": i}, "either": i if i % 2 else f"s{i}", **more,
    }  # fmt: skip


def _framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


@pytest.fixture
def table(stack: Endpoints, names: dict[str, str]) -> Iterator[str]:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    yield f"public.{names['table']}"
    sql(stack, f"DROP TABLE IF EXISTS public.{names['table']}")


def _ids(stack: Endpoints, url: str, topic: str, *schemas: dict[str, Any]) -> list[int]:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    with SchemaRegistryClient({"url": url, **stack.registry_properties}) as client:
        return [register(client, f"{topic}-value", schema) for schema in schemas]


def _produce(stack: Endpoints, topic: str, ids: range, schema_id: int, schema: dict[str, Any],
             **more: Any) -> None:  # fmt: skip
    produce(stack, topic, [({"id": i}, _framed(schema_id, schema, _record(i, **more)))
                           for i in ids])  # fmt: skip


def _columns(stack: Endpoints, table: str) -> dict[str, str]:
    return dict(
        sql(stack, f"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                   f"WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped")
    )  # fmt: skip


def test_a_table_is_created_from_the_first_record_and_gains_a_column_mid_stream(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str
) -> None:
    v1, v2 = _ids(stack, registry_url, names["topic"], V1, V2)
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            auto_create=True, auto_evolve=True, mode="upsert",
                            key_columns=["id"])  # fmt: skip
    with running(settings):
        # Before the table exists, a record no schema reads is a dead letter all the same.
        produce(stack, names["topic"], [(None, b'{"id": -1}')])
        drained(stack, names, PARTITIONS)
        assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(1,)]
        assert sql(stack, f"SELECT to_regclass('{table}')") == [(None,)]
        _produce(stack, names["topic"], range(0, 50), v1, V1)
        drained(stack, names, PARTITIONS)
        assert _columns(stack, table) == COLUMNS
        _produce(stack, names["topic"], range(50, 100), v2, V2, region="eu")
        _produce(stack, names["topic"], range(100, 110), v1, V1)  # an old writer goes on
        drained(stack, names, PARTITIONS)
    assert _columns(stack, table) == {**COLUMNS, "region": "text"}
    assert sql(stack, f"SELECT count(*), count(DISTINCT id), count(region) FROM {table}") == [
        (110, 110, 50)
    ]
    assert sql(stack, f"SELECT min(id), max(id) FROM {table} WHERE region = 'eu'") == [(50, 99)]
    primary = sql(stack, f"SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                         f"a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                         f"WHERE i.indrelid = '{table}'::regclass AND i.indisprimary")  # fmt: skip
    assert primary == [("id",)]
    stored = sql(stack, f"SELECT id, flag, n, ratio, score, note, raw, amount, day, at, local, "
                        f"ref::text, kind, tags, attrs, two, clock, ms_at, sub, either "
                        f"FROM {table} WHERE id IN (6, 7) ORDER BY id")  # fmt: skip
    six, seven = _record(6), _record(7)
    assert stored == [
        (6, True, -6, 0.5, 2.0, "n6", b"\x06", Decimal("0.0006"), date(2026, 1, 7), six["at"],
         six["local"], six["ref"], "A", ["t6", "x"], {"k": 6}, b"ab", six["clock"],
         six["ms_at"], {"a": 6}, "s6"),
        (7, False, -7, 0.5, 7 / 3, None, b"\x07", Decimal("0.0007"), date(2026, 1, 8),
         seven["at"], seven["local"], seven["ref"], "B", ["t7", "x"], {"k": 7}, b"ab",
         seven["clock"], seven["ms_at"], {"a": 7}, "7"),
    ]  # fmt: skip


def test_fields_choose_and_rename_the_columns_a_followed_table_is_made_and_evolved_with(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str
) -> None:
    """A Kafka Connect ReplaceField config with auto.create and auto.evolve, as it is written."""
    v1, v2 = _ids(stack, registry_url, names["topic"], V1, V2)
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            auto_create=True, auto_evolve=True, mode="upsert",
                            key_columns=["id"], fields={"exclude": ["raw", "two", "sub"],
                            "rename": {"note": "memo", "region": "area"}})  # fmt: skip
    with running(settings) as service:
        _produce(stack, names["topic"], range(0, 30), v1, V1)
        drained(stack, names, PARTITIONS)
        made = {k: v for k, v in COLUMNS.items() if k not in ("raw", "two", "sub", "note")}
        assert _columns(stack, table) == {**made, "memo": "text"}
        _produce(stack, names["topic"], range(30, 60), v2, V2, region="eu")
        drained(stack, names, PARTITIONS)
        assert _columns(stack, table) == {**made, "memo": "text", "area": "text"}
        # Left out on purpose: not reported as fields the table lacks.
        assert sample(service, "bridge_consumer_ignored_fields_total", topic=names["topic"]) == 0
    assert sql(stack, f"SELECT count(*), count(memo), count(area) FROM {table}") == [(60, 20, 30)]
    assert sql(stack, f"SELECT memo FROM {table} WHERE id = 3") == [("n3",)]


KEY: dict[str, Any] = {"type": "record", "name": "PaymentKey", "namespace": "test",
                       "fields": [{"name": "id", "type": "long"}]}  # fmt: skip
# The value without the key's field, as Connect's pk.mode=record_key writers often have it.
VALUE_WITHOUT_ID: dict[str, Any] = {**V1, "fields": [f for f in V1["fields"] if f["name"] != "id"]}


def test_record_key_upserts_into_a_table_created_with_the_keys_schema_as_its_primary_key(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str
) -> None:
    """Connect's pk.mode=record_key with auto.create: the key's writer schema types the key
    columns and makes them the primary key; the value fills the rest; a tombstone deletes."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    (value_id,) = _ids(stack, registry_url, names["topic"], VALUE_WITHOUT_ID)
    with SchemaRegistryClient({"url": registry_url, **stack.registry_properties}) as client:
        key_id = register(client, f"{names['topic']}-key", KEY)
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            key_format="avro", key_source="record_key", auto_create=True,
                            mode="upsert", key_columns=["id"])  # fmt: skip

    def keyed(i: int, value: bytes | None) -> tuple[bytes, bytes | None]:
        return _framed(key_id, KEY, {"id": i}), value

    def value(i: int, **more: Any) -> bytes:
        record = {k: v for k, v in _record(i, **more).items() if k != "id"}
        return _framed(value_id, VALUE_WITHOUT_ID, record)

    with running(settings):
        produce(stack, names["topic"], [keyed(i, value(i)) for i in range(20)])
        produce(stack, names["topic"], [keyed(3, value(3, n=333)), keyed(4, None)])
        drained(stack, names, PARTITIONS)
    assert _columns(stack, table) == COLUMNS
    primary = sql(stack, f"SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                         f"a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                         f"WHERE i.indrelid = '{table}'::regclass AND i.indisprimary")  # fmt: skip
    assert primary == [("id",)]
    assert sql(stack, f"SELECT count(*), min(id), max(id) FROM {table}") == [(19, 0, 19)]
    assert sql(stack, f"SELECT n FROM {table} WHERE id = 3") == [(333,)]


JSON_V1: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
        "n": {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": -(2**31),
                                           "maximum": 2**31 - 1}]},
        "amount": {"type": "number"},
        "note": {"type": ["string", "null"]},
        "raw": {"type": "string", "contentEncoding": "base64"},
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
    "required": ["id", "n", "amount", "note", "raw", "day", "at", "tags", "attrs"],
    "additionalProperties": False,
}  # fmt: skip
REGION = {"region": {"type": ["string", "null"]}}
JSON_V2: dict[str, Any] = {**JSON_V1, "properties": {**JSON_V1["properties"], **REGION}}
JSON_KEY: dict[str, Any] = {"type": "object", "properties": {"id": {"type": "integer"}},
                            "required": ["id"], "additionalProperties": False}  # fmt: skip
JSON_COLUMNS = {
    "id": "bigint", "n": "integer", "amount": "numeric", "note": "text", "raw": "bytea",
    "day": "date", "at": "timestamp with time zone", "tags": "text[]", "attrs": "jsonb",
}  # fmt: skip


def _json_value(i: int, **more: Any) -> dict[str, Any]:
    return {"id": i, "n": None if i % 5 == 0 else -i, "amount": f"{i}.0001",
            "note": None if i % 3 else f"n{i}", "raw": "AAE=",
            "day": f"2026-01-{1 + i % 28:02d}", "at": "2026-11-25T01:02:03.000004+01:00",
            "tags": [f"t{i}", "x"], "attrs": {"k": i}, **more}  # fmt: skip


def _json_framed(schema_id: int, value: dict[str, Any]) -> bytes:
    body = json.dumps(value).replace('"amount": "', '"amount": ').replace('0001"', "0001")
    return b"\x00" + schema_id.to_bytes(4, "big") + body.encode()


def test_a_json_schema_route_creates_its_table_from_the_keys_and_values_and_evolves_it(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str
) -> None:
    """Connect's JsonSchemaConverter with pk.mode=record_key, auto.create and auto.evolve: the
    key's JSON Schema types the primary key, the value's the other columns, and a later version
    of the value's schema adds a column mid-stream, in the batch's transaction."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    topic = names["topic"]
    with SchemaRegistryClient({"url": registry_url, **stack.registry_properties}) as client:
        v1, v2 = (register(client, f"{topic}-value", s, schema_type="JSON")
                  for s in (JSON_V1, JSON_V2))  # fmt: skip
        key_id = register(client, f"{topic}-key", JSON_KEY, schema_type="JSON")
    settings = settings_for(stack, names, registry_url=registry_url, value_format="json-schema",
                            key_format="json-schema", key_source="record_key", auto_create=True,
                            auto_evolve=True, mode="upsert", key_columns=["id"])  # fmt: skip

    def keyed(i: int, writer: int, **more: Any) -> tuple[bytes, bytes | None]:
        return _json_framed(key_id, {"id": i}), _json_framed(writer, _json_value(i, **more))

    with running(settings):
        produce(stack, topic, [keyed(i, v1) for i in range(30)])
        drained(stack, names, PARTITIONS)
        assert _columns(stack, table) == JSON_COLUMNS
        produce(stack, topic, [keyed(i, v2, region="eu") for i in range(30, 50)])
        produce(stack, topic, [keyed(3, v1, n=333), (_json_framed(key_id, {"id": 4}), None)])
        drained(stack, names, PARTITIONS)
    assert _columns(stack, table) == {**JSON_COLUMNS, "region": "text"}
    primary = sql(stack, f"SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                         f"a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                         f"WHERE i.indrelid = '{table}'::regclass AND i.indisprimary")  # fmt: skip
    assert primary == [("id",)]
    assert sql(stack, f"SELECT count(*), count(region), min(id), max(id) FROM {table}") == [
        (49, 20, 0, 49)
    ]
    assert sql(stack, f"SELECT n FROM {table} WHERE id = 3") == [(333,)]
    assert sql(stack, f"SELECT id, n, amount, note, raw, day, at, tags, attrs FROM {table} "
                      f"WHERE id = 6") == [
        (6, -6, Decimal("6.0001"), "n6", b"\x00\x01", date(2026, 1, 7),
         datetime(2026, 11, 25, 0, 2, 3, 4, tzinfo=UTC), ["t6", "x"], {"k": 6})
    ]  # fmt: skip
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


@pytest.mark.parametrize(
    ("change", "names_in_readyz", "fix"),
    [
        # A field's type changes: long in the table, string in the schema.
        ({"name": "n", "type": "string"}, ["field n", "text in the schema", "integer in the table"],
         "ALTER TABLE {t} ALTER COLUMN n TYPE text"),
        # A new field that is required and has no default.
        ({"name": "must", "type": "long"}, ["new field(s) must", "required"],
         "ALTER TABLE {t} ADD COLUMN must bigint"),
    ],
)  # fmt: skip
def test_a_change_a_column_cannot_mend_stops_the_records_until_the_table_is_fixed(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str,
    change: dict[str, Any], names_in_readyz: list[str], fix: str,
) -> None:  # fmt: skip
    fields = [f for f in V1["fields"] if f["name"] != change["name"]] + [change]
    changed = {**V1, "fields": fields}
    v1, bad = _ids(stack, registry_url, names["topic"], V1, changed)
    _produce(stack, names["topic"], range(0, 20), v1, V1)
    value = "text" if change["type"] == "string" else 5
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            auto_create=True, auto_evolve=True)  # fmt: skip
    with running(settings) as service:
        drained(stack, names, PARTITIONS)  # the table, created from V1
        produce(stack, names["topic"], [
            (None, _framed(bad, changed, {**_record(i), change["name"]: value}))
            for i in range(20, 30)
        ])  # fmt: skip
        mismatch = "bridge_consumer_table_schema_mismatch_total"
        eventually(lambda: sample(service, mismatch) >= 2, timeout=60)
        reasons = " ".join(service.not_ready())
        for part in names_in_readyz:
            assert part in reasons, reasons
        assert dead_letters(stack, names, names["topic"]) == 0
        sql(stack, fix.format(t=table))
        drained(stack, names, PARTITIONS, timeout=90)
        eventually(lambda: not any("does not fit" in r for r in service.not_ready()), timeout=30)
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [(30, 30)]
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


def test_a_schema_without_the_key_stops_the_records_and_names_the_key(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str
) -> None:
    keyless = {**V1, "fields": [f for f in V1["fields"] if f["name"] != "id"]}
    (bad,) = _ids(stack, registry_url, names["topic"], keyless)
    record = {k: v for k, v in _record(1).items() if k != "id"}
    produce(stack, names["topic"], [(None, _framed(bad, keyless, record))])
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            auto_create=True, mode="upsert", key_columns=["id"])  # fmt: skip
    with running(settings) as service:
        eventually(lambda: any("key column(s) id" in r for r in service.not_ready()), timeout=60)
        assert dead_letters(stack, names, names["topic"]) == 0
    assert sql(stack, f"SELECT to_regclass('{table}')") == [(None,)]


def test_two_members_meeting_the_same_new_schema_at_once_change_the_table_once(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str
) -> None:
    v1, v2 = _ids(stack, registry_url, names["topic"], V1, V2)
    _produce(stack, names["topic"], range(0, 40), v1, V1)
    # Per partition: with whole epochs (the default) the group would also share the epoch
    # manifest's partition, and a member holding only that one would meet no schema.
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            auto_create=True, auto_evolve=True,
                            epochs="per-partition")  # fmt: skip
    with running(settings) as first, running(settings) as second:
        drained(stack, names, PARTITIONS)
        # Both hold a partition, so the next records reach both members at once.
        eventually(lambda: all(_consuming(member, names["topic"]) for member in (first, second)))
        before = first.applied_total, second.applied_total
        _produce(stack, names["topic"], range(40, 400), v2, V2, region="eu")
        drained(stack, names, PARTITIONS, timeout=90)
        assert first.applied_total > before[0] and second.applied_total > before[1]
        for member in (first, second):
            assert sample(member, "bridge_consumer_table_schema_mismatch_total") == 0
            assert dead_letters(stack, names, names["topic"]) == 0
    assert sql(stack, f"SELECT count(*), count(DISTINCT id), count(region) FROM {table}") == [
        (400, 400, 360)
    ]


def _consuming(service: Any, topic: str) -> bool:
    """Whether `service` applies a partition of `topic` (the group's routes publish whole epochs
    by default, so a member may hold the epoch manifest's partition only)."""
    return any(name.rsplit("[", 1)[0] == topic for name in service.context()["partitions"])


def _config(
    path: Path, stack: Endpoints, names: dict[str, str], url: str, value_format: str = "avro"
) -> Path:
    settings = {
        # A short session lets the group drop a killed member quickly.
        "kafka": {"bootstrap_servers": stack.bootstrap_servers,
                  "properties": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                                 **stack.properties("consumer", resolved=False)}},
        "postgres": {"dsn": stack.role_dsn("consumer")},
        "schema_registry": {"url": url, "properties": dict(stack.registry_properties)},
        "consumer": {
            "group_id": names["group"], "state_schema": names["schema"],
            "batch_max_wait_ms": 50,
            "routes": [{"topic": names["topic"], "table": f"public.{names['table']}",
                        "value_format": value_format, "auto_create": True,
                        "auto_evolve": True}],
        },
    }  # fmt: skip
    path.write_text(yaml.safe_dump(settings))
    return path


# As a Spark job's columns: the sink derives the Protobuf schema from them.
PROTO_V1 = [
    T.StructField("id", T.LongType(), nullable=False),
    T.StructField("note", T.StringType()),
    T.StructField("at", T.TimestampType()),
    T.StructField("tags", T.ArrayType(T.StringType())),
]
PROTO_V2 = [*PROTO_V1, T.StructField("region", T.StringType())]  # with presence: a new column


class _Writer:
    """Version 1 and version 2 (one more nullable field, `region`) of a value schema, in one
    of the registry's formats: registered, and records of each produced. Protobuf's as the
    sink writes them: its schema derived from the columns and registered by
    `spark_jobs.registry_frames`, each body made by its encoder (`spark_jobs.proto_encoder`)
    from the rows as Arrow hands them to it, without a Spark session."""

    def __init__(self, value_format: str, stack: Endpoints, url: str, topic: str) -> None:
        self.value_format, self._stack, self._topic = value_format, stack, topic
        if value_format == "avro":
            self._ids = _ids(stack, url, topic, V1, V2)
            return
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

        from spark_jobs.proto_encoder import ProtoEncoder
        from spark_jobs.proto_files import derived

        self._types = [T.StructType(fields) for fields in (PROTO_V1, PROTO_V2)]
        writings = [derived(t, name="Payment", package="test") for t in self._types]
        with SchemaRegistryClient({"url": url, **stack.registry_properties}) as client:
            self._ids = [register(client, f"{topic}-value", Schema(w.text, "PROTOBUF"))
                         for w in writings]  # fmt: skip
        self._framing = [w.indexes for w in writings]
        self._encoders = [
            ProtoEncoder(w.descriptors, w.full_name, t)
            for w, t in zip(writings, self._types, strict=True)
        ]

    def produce(self, ids: range, version: int, **more: Any) -> None:
        schema_id = self._ids[version - 1]
        if self.value_format == "avro":
            _produce(self._stack, self._topic, ids, schema_id, (V1, V2)[version - 1], **more)
            return
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_type

        rows = [{"id": i, "note": f"n{i}", "at": datetime(2026, 11, 27, tzinfo=UTC),
                 "tags": ["a", str(i)], **more} for i in ids]  # fmt: skip
        kind = to_arrow_type(self._types[version - 1], timezone="UTC")
        bodies = self._encoders[version - 1].bodies(pa.array(rows, type=kind)).to_pylist()
        head = b"\x00" + schema_id.to_bytes(4, "big") + self._framing[version - 1]
        records = [({"id": i}, head + body) for i, body in zip(ids, bodies, strict=True)]
        produce(self._stack, self._topic, records)


def _alter_waiting(stack: Endpoints) -> bool:
    return bool(sql(stack, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND query LIKE '%ADD COLUMN IF NOT EXISTS%'"))  # fmt: skip


def _blocked_by(stack: Endpoints, holder: int) -> list[str]:
    """What the sessions that wait on a lock the test's `holder` session holds wait on."""
    query = f"SELECT wait_event FROM pg_stat_activity WHERE {holder} = ANY(pg_blocking_pids(pid))"
    return [str(row[0]) for row in sql(stack, query)]


@pytest.mark.parametrize("value_format", ["avro", "protobuf"])
def test_sigkill_before_inside_and_after_the_altering_transaction_loses_nothing(
    stack: Endpoints,
    names: dict[str, str],
    registry_url: str,
    table: str,
    tmp_path: Path,
    value_format: str,
) -> None:
    writer = _Writer(value_format, stack, registry_url, names["topic"])
    writer.produce(range(0, 100), 1)
    config = _config(tmp_path / "bridge.yaml", stack, names, registry_url, value_format)
    log = tmp_path / "consumer.log"
    consumer = start_consumer(config, log)
    try:
        drained(stack, names, PARTITIONS)
        # Before: the offsets rows locked by the test, so the batch that carries the change
        # waits on its offset advance, the first step of its transaction, before its ALTER,
        # and is killed there.
        writer.produce(range(100, 200), 2, region="eu")
        with psycopg.connect(stack.dsn) as holder:
            offsets = f"{names['schema']}.offsets"
            holder.execute(f"SELECT 1 FROM {offsets} WHERE group_id = %s FOR UPDATE",
                           [names["group"]])  # fmt: skip
            # A row's lock (its holder's transaction id), not the table's: the advance waits.
            eventually(lambda: bool(_blocked_by(stack, holder.info.backend_pid)), timeout=60)
            assert _blocked_by(stack, holder.info.backend_pid) == ["transactionid"]
            consumer.send_signal(signal.SIGKILL)
            consumer.wait(30)
            holder.rollback()
        assert "region" not in _columns(stack, table)
        assert sql(stack, f"SELECT count(*) FROM {table}") == [(100,)]
        consumer = start_consumer(config, log)
        # Inside: the table locked by the test, so the consumer's ALTER waits in its batch's
        # transaction, and is killed there.
        with psycopg.connect(stack.dsn) as holder:
            holder.execute(f"LOCK TABLE {table} IN ACCESS SHARE MODE")
            eventually(lambda: _alter_waiting(stack), timeout=60)
            consumer.send_signal(signal.SIGKILL)
            consumer.wait(30)
            holder.rollback()
        assert "region" not in _columns(stack, table)  # the change died with its transaction
        assert sql(stack, f"SELECT count(*) FROM {table}") == [(100,)]
        # After: killed as soon as the column is there, its rows committed with it.
        consumer = start_consumer(config, log)
        eventually(lambda: "region" in _columns(stack, table), timeout=60)
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(30)
        writer.produce(range(200, 300), 2, region="us")
        consumer = start_consumer(config, log)
        drained(stack, names, PARTITIONS, timeout=90)
    finally:
        consumer.send_signal(signal.SIGTERM)
        try:
            consumer.wait(30)
        except subprocess.TimeoutExpired:
            consumer.kill()
    print(log.read_text()[-3000:], file=sys.stderr)
    assert sql(stack, f"SELECT count(*), count(DISTINCT id), count(region) FROM {table}") == [
        (300, 300, 200)
    ]
    assert sql(
        stack, f"SELECT count(*) FROM {table} WHERE (id >= 100) <> (region IS NOT NULL)"
    ) == [(0,)]


def test_a_record_reset_past_on_an_idle_topic_clears_readyz_which_named_it(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str
) -> None:
    """The documented way out of a record the table cannot take: `bridge offsets reset` past
    it, with the member running. `/readyz` named the record (topic, partition, offset), and
    clears once the partition has moved past it, though no record comes after it."""
    keyless = {**V1, "fields": [f for f in V1["fields"] if f["name"] != "id"]}
    (bad,) = _ids(stack, registry_url, names["topic"], keyless)
    record = {k: v for k, v in _record(1).items() if k != "id"}
    produce(stack, names["topic"], [(None, _framed(bad, keyless, record))])
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            auto_create=True, mode="upsert", key_columns=["id"])  # fmt: skip
    with running(settings) as service:
        eventually(lambda: any("key column(s) id" in r for r in service.not_ready()), timeout=60)
        (reason,) = [r for r in service.not_ready() if "key column(s) id" in r]
        found = re.search(rf"first record: topic {names['topic']} partition (\d+) offset (\d+)",
                          reason)  # fmt: skip
        assert found is not None, reason
        partition, offset = found.groups()
        reset = bridge(stack, "offsets", "reset", "--group", names["group"], "--schema",
                       names["schema"], "--topic", names["topic"], "--partition", partition,
                       "--to", str(int(offset) + 1), "--execute", "--force")  # fmt: skip
        assert reset.returncode == 0, reset.stderr
        eventually(lambda: service.not_ready() == [], timeout=30)
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


def test_a_schema_the_table_cannot_take_holds_only_its_partition_while_the_rest_goes_on(
    stack: Endpoints, names: dict[str, str], registry_url: str, table: str
) -> None:
    """A record of partition 0 written with a schema whose field `n` the table cannot take
    (text in the schema, integer in the table): partition 0 holds at its first record not yet
    applied, `/readyz` naming it; partition 1 of the same topic and another route's topic, on
    the same member, go on, with records written after the hold too. Once the table is fixed,
    partition 0 goes on by itself: nothing lost, nothing dead-lettered."""
    changed = {**V1, "fields": [f for f in V1["fields"] if f["name"] != "n"]
               + [{"name": "n", "type": "string"}]}  # fmt: skip
    v1, bad = _ids(stack, registry_url, names["topic"], V1, changed)
    other_topic, other_table = f"{names['topic']}-other", f"public.{names['table']}_other"
    create_topic(stack.bootstrap_servers, other_topic, partitions=1)
    sql(stack, f"CREATE TABLE {other_table} (id bigint, note text)")
    stack.let_consumer_write(other_table)
    producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())

    def write(records: list[tuple[str, int, bytes]]) -> None:
        producer.begin_transaction()
        for topic, partition, value in records:
            producer.produce(topic, value=value, partition=partition)
        producer.commit_transaction(30)

    def framed(i: int, partition: int) -> tuple[str, int, bytes]:
        return names["topic"], partition, _framed(v1, V1, _record(i))

    write([framed(i, i % 2) for i in range(10)])
    routes = [
        {"topic": names["topic"], "table": table, "value_format": "avro", "auto_create": True},
        {"topic": other_topic, "table": other_table},
    ]
    settings = settings_for(stack, names, registry_url=registry_url, consumer={"routes": routes})
    with running(settings) as service:
        eventually(lambda: _count(stack, table) == 10, timeout=60)
        held_at = _next_offset(stack, names, 0)  # where partition 0 stands before the bad record
        others = [(other_topic, 0, json.dumps({"id": i, "note": "x"}).encode())
                  for i in range(100, 110)]  # fmt: skip
        write(
            [
                *(
                    (names["topic"], 0, _framed(bad, changed, {**_record(i), "n": f"n{i}"}))
                    for i in range(10, 15)
                ),  # the first, and those behind it: held with it
                *(framed(i, 1) for i in range(20, 30)),  # the same topic's other partition
                *others,
            ]
        )
        where = f"held: {names['topic']}[0]@"  # at its first record after `held_at`
        eventually(lambda: any(where in r and "does not fit" in r for r in service.not_ready()))
        eventually(lambda: _count(stack, other_table) == 10)
        eventually(lambda: _count(stack, table) == 20)  # partition 1's ten more
        # Still going on while partition 0 waits: the next records of the others land too.
        write([framed(i, 1) for i in range(30, 35)]
              + [(other_topic, 0, json.dumps({"id": 110}).encode())])  # fmt: skip
        eventually(lambda: _count(stack, table) == 25 and _count(stack, other_table) == 11)
        assert _next_offset(stack, names, 0) == held_at
        assert any(where in r for r in service.not_ready())
        sql(stack, f"ALTER TABLE {table} ALTER COLUMN n TYPE text")
        eventually(lambda: _count(stack, table) == 30, timeout=90)
        eventually(lambda: not any("does not fit" in r for r in service.not_ready()), timeout=30)
    assert sql(stack, f"SELECT count(DISTINCT id) FROM {table}") == [(30,)]
    assert sql(stack, f"SELECT n FROM {table} WHERE id = 10") == [("n10",)]
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


def _next_offset(stack: Endpoints, names: dict[str, str], partition: int) -> int:
    """Where the group stands in a partition of the test's topic."""
    rows = sql(stack, f"SELECT next_offset FROM {names['schema']}.offsets WHERE "
                      f"group_id = '{names['group']}' AND topic = '{names['topic']}' "
                      f"AND partition = {partition}")  # fmt: skip
    return int(rows[0][0])


def _count(stack: Endpoints, table: str) -> int:
    """Rows in `table`; 0 before the consumer has created it."""
    if sql(stack, f"SELECT to_regclass('{table}')") == [(None,)]:
        return 0
    return int(sql(stack, f"SELECT count(*) FROM {table}")[0][0])
