"""A JSON Schema's properties as columns (`consumers.tables.json_schema_types`): the table of
docs/table-evolution.md, agreement with the schema bridge's own sink registers for a DataFrame,
a followed table created and evolved from JSON Schemas, and hostile schemas (fuzzed: the
function never raises, and a schema that loops or branches without end is read in bounds)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from bridge.settings import RouteSettings, SchemaRegistrySettings
from consumers.decoding.registry_schemas import SchemaCache
from consumers.tables.json_schema_types import json_schema_columns
from consumers.tables.table_follower import TableColumn, TableFollower
from consumers.tables.table_types import FieldColumn
from spark_jobs.json_schema import json_schema

NULL: dict[str, Any] = {"type": "null"}


def _types(schema: Any) -> dict[str, tuple[str, bool]]:
    columns = json_schema_columns(schema)
    assert columns is not None
    return {c.name: (c.sql_type, c.nullable) for c in columns}


def test_each_json_schema_type_has_its_column() -> None:
    schema = {
        "type": "object",
        "properties": {
            "flag": {"type": "boolean"},
            "small": {"type": "integer", "minimum": -128, "maximum": 127},
            "n": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1},
            "id": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
            "plain": {"type": "integer"},
            "huge": {"type": "integer", "minimum": 0, "maximum": 2**64},
            "amount": {"type": "number"},
            "note": {"type": "string"},
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "ref": {"type": "string", "format": "uuid"},
            "raw": {"type": "string", "contentEncoding": "base64"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "counts": {
                "type": "array",
                "items": {"oneOf": [{"type": "null"}, {"type": "integer"}]},
            },
            "nested": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
            "blobs": {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}},
            "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
            "either": {"type": ["string", "integer"]},
            "anything": {},
            "maybe": {"type": ["string", "null"]},
            "spark_null": {"oneOf": [{"type": "null"}, {"type": "string", "format": "date"}]},
            "via_ref": {"$ref": "#/definitions/Money"},
            "via_defs": {"$ref": "#/$defs/Day"},
        },
        "required": [
            "flag",
            "small",
            "n",
            "id",
            "plain",
            "huge",
            "amount",
            "note",
            "day",
            "at",
            "ref",
            "raw",
            "tags",
            "counts",
            "nested",
            "blobs",
            "attrs",
            "either",
            "anything",
            "maybe",
            "spark_null",
            "via_ref",
        ],
        "definitions": {"Money": {"type": "number"}},
        "$defs": {"Day": {"type": "string", "format": "date"}},
    }
    assert _types(schema) == {
        "flag": ("boolean", False), "small": ("smallint", False), "n": ("integer", False),
        "id": ("bigint", False), "plain": ("bigint", False), "huge": ("numeric", False),
        "amount": ("numeric", False), "note": ("text", False), "day": ("date", False),
        "at": ("timestamp with time zone", False), "ref": ("uuid", False),
        "raw": ("bytea", False), "tags": ("text[]", False), "counts": ("bigint[]", False),
        "nested": ("jsonb", False), "blobs": ("jsonb", False), "attrs": ("jsonb", False),
        "either": ("text", False), "anything": ("text", False), "maybe": ("text", True),
        "spark_null": ("date", True), "via_ref": ("numeric", False),
        "via_defs": ("date", True),  # not required: it may be absent
    }  # fmt: skip


def test_the_sinks_own_schema_of_a_dataframe_gives_the_columns_spark_wrote() -> None:
    frame = T.StructType([
        T.StructField("id", T.LongType(), nullable=False),
        T.StructField("n", T.IntegerType()),
        T.StructField("s", T.ShortType()),
        T.StructField("b", T.ByteType()),
        T.StructField("ok", T.BooleanType()),
        T.StructField("ratio", T.DoubleType()),
        T.StructField("amount", T.DecimalType(12, 2)),
        T.StructField("note", T.StringType()),
        T.StructField("raw", T.BinaryType()),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("local", T.TimestampNTZType()),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("attrs", T.MapType(T.StringType(), T.LongType())),
        T.StructField("sub", T.StructType([T.StructField("a", T.IntegerType())])),
    ])  # fmt: skip
    assert _types(json_schema(frame, title="orders")) == {
        "id": ("bigint", False), "n": ("integer", True), "s": ("smallint", True),
        "b": ("smallint", True), "ok": ("boolean", True), "ratio": ("numeric", True),
        "amount": ("numeric", True), "note": ("text", True), "raw": ("bytea", True),
        "day": ("date", True), "at": ("timestamp with time zone", True),
        "local": ("text", True), "tags": ("text[]", True), "attrs": ("jsonb", True),
        "sub": ("jsonb", True),
    }  # fmt: skip


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string"},
        {"type": "array", "items": {"type": "object", "properties": {}}},
        {"type": "object"},
        {"type": ["object", "null"], "properties": {"a": {"type": "string"}}},
        {"$ref": "#/nowhere"},
        {"$ref": "#"},
        [],
        "object",
        None,
    ],
)
def test_a_schema_that_is_not_an_object_with_properties_gives_no_columns(schema: Any) -> None:
    assert json_schema_columns(schema) is None


def test_names_a_column_cannot_have_are_left_out() -> None:
    schema = {"type": "object", "properties": {"": {}, "a" * 64: {}, "x\0y": {}, "é" * 31: {},
                                               "ok": {"type": "string"}}}  # fmt: skip
    assert [c.name for c in json_schema_columns(schema) or []] == ["é" * 31, "ok"]


def test_references_that_loop_or_branch_without_end_are_read_in_bounds() -> None:
    loop = {"A": {"$ref": "#/definitions/B"}, "B": {"$ref": "#/definitions/A"}}
    looping = {"type": "object", "properties": {"a": {"$ref": "#/definitions/A"}},
               "definitions": loop}  # fmt: skip
    assert _types(looping) == {"a": ("jsonb", True)}
    # Each level's two branches name the next level: 2**40 paths if read without a bound.
    levels: dict[str, Any] = {
        f"L{i}": {"oneOf": [{"$ref": f"#/definitions/L{i + 1}"}] * 2} for i in range(40)
    }
    levels["L40"] = {"type": "string"}
    branching = {"type": "object", "properties": {"a": {"$ref": "#/definitions/L0"}},
                 "required": ["a"], "definitions": levels}  # fmt: skip
    assert _types(branching)["a"][0] in ("text", "jsonb")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    | st.sampled_from(["object", "array", "string", "integer", "number", "null", "boolean",
                       "#/definitions/a", "#/$defs/b", "#", "date", "base64"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(["type", "properties", "items", "required", "oneOf", "anyOf", "$ref",
                         "definitions", "$defs", "a", "b", "format", "contentEncoding",
                         "minimum", "maximum", "default", ""]) | st.text(max_size=4),
        inner, max_size=6),
    max_leaves=40,
)  # fmt: skip


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(schema=_JSON)
def test_any_json_document_gives_columns_or_none_and_never_raises(schema: Any) -> None:
    found = json_schema_columns(schema)
    assert found is None or all(isinstance(c, FieldColumn) for c in found)
    properties = {"p": schema, "q": {"$ref": "#/definitions/a"}}
    object_schema = {"type": "object", "properties": properties, "definitions": {"a": schema}}
    columns = json_schema_columns(object_schema)
    assert columns is not None and [c.name for c in columns] == ["p", "q"]


# -- a followed table, from JSON Schemas ------------------------------------------------------


@pytest.fixture
def cache() -> Iterator[SchemaCache]:
    schemas = SchemaCache(SchemaRegistrySettings(url="http://127.0.0.1:9/apis/ccompat/v7"))
    yield schemas
    schemas.close()


def _values(cache: SchemaCache, writer: int, schema: dict[str, Any]) -> list[bytes]:
    cache.schemas[writer] = schema
    cache.types[writer] = "JSON"
    return [b"\x00" + writer.to_bytes(4, "big") + b"{}"]


V1: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},
    "required": ["id", "note"],
}


def test_a_json_schema_route_creates_its_table_and_adds_a_column_a_new_version_brings(
    cache: SchemaCache,
) -> None:
    table: list[TableColumn] | None = None
    route = RouteSettings(topic="t", table="public.t", value_format="json-schema", mode="upsert",
                          key_columns=("id",), auto_create=True, auto_evolve=True)  # fmt: skip
    follower = TableFollower(route=route, schemas=cache, columns=table, read=lambda: table)
    created = [s.statement.as_string() for s in follower.follow(_values(cache, 1, V1))]
    assert len(created) == 2 and "CREATE TABLE" in created[1]
    assert '"id" bigint NOT NULL' in created[1] and '"note" text NOT NULL' in created[1]
    assert 'PRIMARY KEY ("id")' in created[1]
    follower.committed(follower.pending)
    v2 = {**V1, "properties": {**V1["properties"], "region": {"type": ["string", "null"]}}}
    added = [s.statement.as_string() for s in follower.follow(_values(cache, 2, v2))]
    assert any('ADD COLUMN IF NOT EXISTS "region" text' in text for text in added)


def test_an_avro_schema_on_a_json_schema_route_changes_no_table(cache: SchemaCache) -> None:
    route = RouteSettings(topic="t", table="public.t", value_format="json-schema",
                          auto_create=True)  # fmt: skip
    follower = TableFollower(route=route, schemas=cache, columns=None, read=lambda: None)
    cache.schemas[3] = {"type": "record", "name": "r", "fields": []}
    cache.types[3] = "AVRO"
    assert follower.follow([b"\x00\x00\x00\x00\x03{}"]) == []
