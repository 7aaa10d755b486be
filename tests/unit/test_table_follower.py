"""Avro fields as columns, and what a new writer schema does to a followed table: no I/O (the
schemas are in the cache already, the table's columns given)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest

from bridge.errors import ConfigError
from bridge.settings import RouteSettings, SchemaRegistrySettings, load_settings
from consumers.decoding.registry_schemas import SchemaCache
from consumers.tables.table_follower import TableColumn, TableFollower, TableMismatch, fits
from consumers.tables.table_types import FieldColumn, field_columns

BASE: dict[str, Any] = {"type": "record", "name": "R", "namespace": "n", "fields": [
    {"name": "id", "type": "long"},
    {"name": "note", "type": ["null", "string"]},
]}  # fmt: skip


def test_every_avro_type_has_its_column_type_and_kind() -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "E", "namespace": "n", "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": ["null", "long"]},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string", "default": ""},
        {"name": "raw", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 2}},
        {"name": "e", "type": {"type": "enum", "name": "K", "symbols": ["A"]}},
        {"name": "e2", "type": "n.K"},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                 "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "lt", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
        {"name": "amounts", "type": {"type": "array", "items": {
            "type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 1}}},
        {"name": "nested", "type": {"type": "array", "items": {"type": "array", "items": "long"}}},
        {"name": "m", "type": {"type": "map", "values": "long"}},
        {"name": "r", "type": {"type": "record", "name": "Sub", "fields": []}},
        {"name": "mixed", "type": ["null", "string", "long"]},
    ]})  # fmt: skip
    got = {c.name: (c.sql_type, c.kind, c.nullable, c.has_default) for c in field_columns(schema)}  # type: ignore[arg-type]
    assert got == {
        "b": ("boolean", "B", False, False),
        "i": ("integer", "N", False, False),
        "l": ("bigint", "N", True, False),
        "f": ("real", "N", False, False),
        "d": ("double precision", "N", False, False),
        "s": ("text", "S", False, True),
        "raw": ("bytea", "U", False, False),
        "fx": ("bytea", "U", False, False),
        "e": ("text", "S", False, False),
        "e2": ("text", "S", False, False),
        "dec": ("numeric(12,2)", "N", False, False),
        "day": ("date", "D", False, False),
        "t": ("time without time zone", "D", False, False),
        "at": ("timestamp with time zone", "D", False, False),
        "lt": ("timestamp without time zone", "D", False, False),
        "u": ("uuid", "U", False, False),
        "tags": ("text[]", "A", False, False),
        "amounts": ("numeric(5,1)[]", "A", False, False),
        "nested": ("jsonb", "U", False, False),
        "m": ("jsonb", "U", False, False),
        "r": ("jsonb", "U", False, False),
        "mixed": ("text", "S", True, False),
    }


def _column(name: str, sql_type: str, kind: str, element: str = "", **flags: bool) -> TableColumn:
    return TableColumn(name, sql_type, kind, element, flags.get("not_null", False),
                       flags.get("has_default", False), False)  # fmt: skip


def _field(sql_type: str, kind: str) -> FieldColumn:
    return FieldColumn("f", sql_type, kind, True, False)


def test_a_field_fits_a_column_of_its_kind() -> None:
    assert fits(_column("f", "character varying(20)", "S"), _field("text", "S"))
    assert fits(_column("f", "mood", "E"), _field("text", "S"))  # a PostgreSQL enum
    assert fits(_column("f", "integer", "N"), _field("bigint", "N"))
    assert fits(_column("f", "json", "U"), _field("jsonb", "U"))
    assert fits(_column("f", "bigint[]", "A", "N"), _field("numeric(5,1)[]", "A"))
    assert not fits(_column("f", "integer", "N"), _field("text", "S"))
    assert not fits(_column("f", "uuid", "U"), _field("bytea", "U"))
    assert not fits(_column("f", "text[]", "A", "S"), _field("bigint[]", "A"))
    assert not fits(_column("f", "timestamp with time zone", "D"), _field("bigint", "N"))


@pytest.fixture
def cache() -> Iterator[SchemaCache]:
    schemas = SchemaCache(SchemaRegistrySettings(url="http://127.0.0.1:9/apis/ccompat/v7"))
    yield schemas
    schemas.close()


def _follower(cache: SchemaCache, columns: list[TableColumn] | None, **route: Any) -> TableFollower:
    """A follower of a table that is `columns` whenever it is read (None: not there)."""
    settings = RouteSettings(topic="t", table="public.t", value_format="avro", **route)
    return TableFollower(route=settings, schemas=cache, columns=columns, read=lambda: columns)


def _values(cache: SchemaCache, writer: int, schema: dict[str, Any]) -> list[bytes]:
    cache.schemas[writer] = fastavro.parse_schema(schema)
    cache.types[writer] = "AVRO"
    return [b"\x00" + writer.to_bytes(4, "big") + b"\x02"]


TABLE = [_column("id", "bigint", "N", not_null=True), _column("note", "text", "S")]


def test_a_new_nullable_field_is_a_column_added_under_the_tables_lock(cache: SchemaCache) -> None:
    follower = _follower(cache, list(TABLE), auto_evolve=True)
    assert follower.follow(_values(cache, 1, BASE)) == []
    added = {**BASE, "fields": [*BASE["fields"], {"name": "region", "type": ["null", "string"]}]}
    steps = follower.follow(_values(cache, 2, added))
    texts = [step.statement.as_string() for step in steps]
    assert texts == [
        'SELECT pg_advisory_xact_lock(1651663975, hashtext(\'"public"."t"\'))',
        'ALTER TABLE "public"."t" ADD COLUMN IF NOT EXISTS "region" text',
    ]
    assert follower.target is not None and follower.target.columns == ("id", "note", "region")
    assert follower.follow(_values(cache, 2, added)) == steps  # until a batch commits them
    follower.committed(steps)
    assert follower.follow(_values(cache, 2, added)) == []
    # Without auto_evolve the field is left out (and reported as ignored).
    assert _follower(cache, list(TABLE)).follow(_values(cache, 2, added)) == []


def test_a_missing_table_is_created_with_the_key_as_primary_key(cache: SchemaCache) -> None:
    follower = _follower(cache, None, auto_create=True, mode="upsert", key_columns=["id"])
    steps = follower.follow(_values(cache, 1, BASE))
    assert steps[1].statement.as_string() == (
        'CREATE TABLE "public"."t" ("id" bigint NOT NULL, "note" text, PRIMARY KEY ("id"))'
    )


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ([{"name": "id", "type": "string"}, {"name": "note", "type": "string"}],
         "field id is text in the schema, bigint in the table"),
        ([*BASE["fields"], {"name": "must", "type": "long"}],
         "new field(s) must are required and have no default"),
        ([{"name": "note", "type": "string"}],
         "column id (bigint NOT NULL, no default) has no field in the schema"),
    ],
)  # fmt: skip
def test_a_change_no_column_can_mend_is_a_mismatch_naming_it(
    cache: SchemaCache, fields: list[dict[str, Any]], says: str
) -> None:
    follower = _follower(cache, list(TABLE), auto_evolve=True)
    with pytest.raises(TableMismatch, match=re.escape(f"table public.t, schema id 3: {says}")):
        follower.follow(_values(cache, 3, {**BASE, "fields": fields}))


def test_a_key_the_schema_lacks_is_a_mismatch(cache: SchemaCache) -> None:
    follower = _follower(cache, list(TABLE), auto_evolve=True, mode="upsert", key_columns=["id"])
    keyless = {**BASE, "fields": [{"name": "note", "type": "string"}]}
    with pytest.raises(TableMismatch, match="key column\\(s\\) id have no field"):
        follower.follow(_values(cache, 4, keyless))


def test_following_a_table_needs_a_registry_format() -> None:
    route = {"topic": "t", "table": "t", "auto_create": True}
    with pytest.raises(ConfigError, match="need value_format avro, json-schema or protobuf"):
        load_settings(
            kafka={"bootstrap_servers": "k:9092"}, postgres={"dsn": "postgresql://x@h/db"},
            consumer={"group_id": "g", "routes": [route]},
        )  # fmt: skip


def test_a_change_made_while_another_is_pending_keeps_its_lock(cache: SchemaCache) -> None:
    follower = _follower(cache, list(TABLE), auto_evolve=True)
    fields = [*BASE["fields"], {"name": "a", "type": ["null", "long"]}]
    first = follower.follow(_values(cache, 5, {**BASE, "fields": fields}))
    fields.append({"name": "b", "type": ["null", "long"]})
    both = follower.follow(_values(cache, 6, {**BASE, "fields": fields}))
    assert [s.statement.as_string() for s in both][1:] == [
        'ALTER TABLE "public"."t" ADD COLUMN IF NOT EXISTS "a" bigint',
        'ALTER TABLE "public"."t" ADD COLUMN IF NOT EXISTS "b" bigint',
    ]
    # Planned while the batch carrying the first change is in flight: the rest, locked too.
    assert [s.statement.as_string() for s in follower.pending_after(first)] == [
        first[0].statement.as_string(),
        'ALTER TABLE "public"."t" ADD COLUMN IF NOT EXISTS "b" bigint',
    ]
    follower.committed(first)  # the batch that carried the first change committed
    rest = follower.pending
    assert [s.statement.as_string() for s in rest] == [
        first[0].statement.as_string(),  # the lock, still first
        'ALTER TABLE "public"."t" ADD COLUMN IF NOT EXISTS "b" bigint',
    ]
