"""Typed records' pure parts: the sink's format options, the wire format's header, Avro records
to rows, JSON rows for array and timestamp columns, the registry's backoff, the settings."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from bridge.errors import ConfigError
from bridge.settings import RouteSettings, SchemaRegistrySettings, load_settings
from bridge_shell.spark.spark_session import REDACTION_REGEX
from consumers.decoding.avro_rows import AvroRowDecoder, reading_of
from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import SchemaCache, registry_backoff, schema_id
from consumers.decoding.rows import UNSET, ArrayValue
from consumers.tables.targets import Target
from spark_jobs.kafka_rows import check_schema
from spark_jobs.registry_frames import record_name, subject_name
from spark_jobs.sink_options import SinkOptions, SubjectStrategy, ValueFormat

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "orders.v1-eu"}
REGISTRY = {"schema.registry.url": "http://registry:8080/apis/ccompat/v7"}


def test_sink_formats_default_to_json_and_avro_needs_the_registry() -> None:
    assert SinkOptions.parse(BASE).value_format is ValueFormat.JSON
    with pytest.raises(ConfigError) as raised:
        SinkOptions.parse({**BASE, "value.format": "avro"})
    assert dict(raised.value.problems) == {
        "schema.registry.url": "required with avro, json-schema or protobuf"
    }
    options = SinkOptions.parse(
        {**BASE, **REGISTRY, "value.format": "avro", "schema.registry.basic.auth.user.info": "u:p"}
    )
    assert options.typed and options.registry == {
        "url": REGISTRY["schema.registry.url"],
        "basic.auth.user.info": "u:p",
    }
    assert "u:p" not in repr(options)
    # Spark hides the registry's credentials by key in plans, its UI and event logs.
    registry_keys = [
        "schema.registry.basic.auth.user.info",
        "schema.registry.url",
        "schema.registry.bearer.auth.token",
        "schema.registry.ssl.ca.location",
    ]
    hidden = [key for key in registry_keys if re.search(REDACTION_REGEX, key)]
    assert hidden == ["schema.registry.basic.auth.user.info", "schema.registry.bearer.auth.token"]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"value.format": "thrift"}, "value.format"),
        ({"value.format": "json_schema"}, "value.format"),
        ({"key.format": "xml"}, "key.format"),
        ({"subject.name.strategy": "topic-record"}, "subject.name.strategy"),
        ({"value.record.name": "9lives"}, "value.record.name"),
        ({"record.namespace": "com.-x"}, "record.namespace"),
        # A Protobuf schema of one's own: only with protobuf, and a message only with a file.
        ({"value.format": "avro", "value.proto.file": "order.proto"}, "value.proto.file"),
        ({"value.format": "protobuf", "value.proto.message": "shop.Order"}, "value.proto.file"),
        ({"key.proto.message": "shop.Key"}, "key.proto.message"),
    ],
)
def test_bad_format_options_are_refused_by_name(extra: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SinkOptions.parse({**BASE, **REGISTRY, **extra})
    assert key in dict(raised.value.problems)


def test_subjects_and_record_names_follow_the_strategy() -> None:
    options = SinkOptions.parse({**BASE, **REGISTRY, "value.format": "avro"})
    assert record_name(options, "value") == "orders_v1_eu_value"
    assert subject_name(options, "value", {"name": "x"}) == "orders.v1-eu-value"
    by_record = SinkOptions.parse(
        {**BASE, **REGISTRY, "value.format": "avro", "subject.name.strategy": "record",
         "value.record.name": "Order", "record.namespace": "shop.sales"}
    )  # fmt: skip
    assert by_record.subject_strategy is SubjectStrategy.RECORD
    schema = {"name": record_name(by_record, "value"), "namespace": by_record.record_namespace}
    assert subject_name(by_record, "value", schema) == "shop.sales.Order"


def test_a_topic_columns_topics_get_their_own_subjects_under_the_default_strategy() -> None:
    column = {k: v for k, v in BASE.items() if k != "topic"}  # each row names its topic
    options = SinkOptions.parse(
        {**column, **REGISTRY, "value.format": "avro", "topics": "orders, refunds,orders"}
    )
    assert options.topics == ("orders", "refunds")
    assert [subject_name(options, "value", {"name": "x"}, t) for t in options.topics] == [
        "orders-value", "refunds-value",
    ]  # fmt: skip
    assert record_name(options, "value", "refunds") == "refunds_value"


@pytest.mark.parametrize(
    ("extra", "key", "says"),
    [
        ({}, "subject.name.strategy", "name the column's topics in the topics option"),
        ({"topics": "a,b c"}, "topics", "'b c' is not a legal topic name"),
        ({"topics": "a", "topic": "t"}, "topics", "only without it"),
        ({"topics": "a", "value.format": "json"}, "topics", "only with value.format"),
        ({"topics": "a", "subject.name.strategy": "record"}, "topics", "only with value.format"),
    ],
)
def test_a_topic_column_under_the_topic_strategy_is_refused_by_the_options_alone(
    extra: dict[str, str], key: str, says: str
) -> None:
    """Before any Spark session: `SinkOptions.parse` is the first thing `encode` and the sink
    do, and a job may call it before starting Spark."""
    column = {k: v for k, v in BASE.items() if k != "topic"}
    with pytest.raises(ConfigError) as raised:
        SinkOptions.parse({**column, **REGISTRY, "value.format": "avro", **extra})
    assert says in dict(raised.value.problems)[key]


def test_a_typed_value_must_arrive_framed() -> None:
    struct = StructType([StructField("value", StructType([StructField("id", LongType())]))])
    with pytest.raises(ConfigError, match="frame the struct first"):
        check_schema(struct, default_topic="t", typed=("value",))
    text = StructType([StructField("value", StringType())])
    with pytest.raises(ConfigError, match="needs the framed bytes"):
        check_schema(text, default_topic="t", typed=("value",))
    check_schema(
        StructType([StructField("value", BinaryType())]), default_topic="t", typed=("value",)
    )


def test_the_wire_format_header_names_the_schema_id() -> None:
    assert schema_id(b"\x00\x00\x00\x01\x02rest") == 258
    assert schema_id(b"{}") is None
    assert schema_id(b"\x01\x00\x00\x00\x01") is None  # not the magic byte
    assert schema_id(b"\x00\x00\x00\x01") is None  # too short


SCHEMA: dict[str, Any] = fastavro.parse_schema(  # type: ignore[assignment]
    {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "attrs", "type": ["null", {"type": "map", "values": "long"}]},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                        "precision": 20, "scale": 4}},
        ],
    }
)  # fmt: skip


def _body(record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, SCHEMA, record)
    return body.getvalue()


def test_an_avro_record_becomes_a_row_of_the_tables_columns() -> None:
    reading = reading_of(
        ("id", "tags", "attrs", "at", "amount", "filled", "missing"),
        SCHEMA,
        tracked={"filled"},
        arrays={"tags"},
        limit=2**20,
    )
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    record = {"id": 1, "tags": ["a"], "attrs": {"k": 2}, "at": at, "amount": Decimal("1.2345")}
    (row,) = reading.program.rows([_body(record)], 0)
    assert reading.fix is not None
    row = reading.fix(row)
    assert row == (1, ["a"], '{"k":2}', at, Decimal("1.2345"), UNSET, None)
    assert type(row[1]) is ArrayValue
    # A list bound for a column that is not an array (jsonb) is JSON text.
    as_json = reading_of(("tags",), SCHEMA, tracked=(), arrays=(), limit=2**20)
    assert as_json.fix is not None
    (row,) = as_json.program.rows([_body({**record, "tags": ["a", "b"]})], 0)
    assert as_json.fix(row) == ('["a","b"]',)


@pytest.fixture
def cache() -> Iterator[SchemaCache]:
    """A schema cache that already holds ids 7 (Avro), 8 (JSON Schema) and knows 9 missing:
    asked for no other id, it never calls its registry (whose address takes nothing)."""
    schemas = SchemaCache(SchemaRegistrySettings(url="http://127.0.0.1:9/apis/ccompat/v7"))
    schemas.schemas.update({7: SCHEMA, 8: {"type": "object", "properties": {"id": {}}}})
    schemas.types.update({7: "AVRO", 8: "JSON"})
    schemas.missing[9] = "schema id 9 is not in the registry"
    yield schemas
    schemas.close()


def _framed(writer: int, record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, SCHEMA, record)
    return b"\x00" + writer.to_bytes(4, "big") + body.getvalue()


def test_the_avro_decoder_reads_each_value_by_its_writer_schema_and_names_what_is_wrong(
    cache: SchemaCache,
) -> None:
    decoder = AvroRowDecoder(("id", "amount"), schemas=cache)
    record = {"id": 5, "tags": [], "attrs": None, "at": datetime.now(UTC),
              "amount": Decimal("-0.0001")}  # fmt: skip
    good = _framed(7, record)
    assert decoder.prepare([good, b"{}", _framed(9, record)]) == {  # 9: no fields known
        "id",
        "tags",
        "attrs",
        "at",
        "amount",
    }
    assert decoder.decode(good) == (5, Decimal("-0.0001"))
    assert decoder.decode_all([good, good]) == [(5, Decimal("-0.0001"))] * 2
    with pytest.raises(RecordError, match="schema id 9 is not in the registry"):
        decoder.decode(_framed(9, record))
    with pytest.raises(RecordError, match="starts with 0x7b"):
        decoder.decode(b'{"id": 1}')
    with pytest.raises(RecordError, match="does not decode by schema id 7"):
        decoder.decode(good[:-3])
    with pytest.raises(RecordError, match="1 byte\\(s\\) after the record"):
        decoder.decode(good + b"\x00")
    assert decoder.decode_all([good, good[:-3]]) is None
    assert decoder.decode_all([good, good + b"\x00"]) is None  # read in one C loop, checked
    assert decoder.decode_all([good, _framed(9, record)]) is None  # two ids: one by one


def test_json_rows_fill_array_columns_and_read_epoch_millis_when_asked() -> None:
    route = RouteSettings(topic="t", table="t", epoch_millis_timestamps=True)
    target = Target(
        route=route, schema="public", name="t", columns=("id", "tags", "at"),
        required=frozenset(), arrays=frozenset({"tags"}), timestamps=frozenset({"at"}),
    )  # fmt: skip
    row = target.row(b'{"id": 1, "tags": ["a", null], "at": 1764077168123}')
    assert row[1] == ["a", None] and type(row[1]) is ArrayValue
    assert row[2] == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=1764077168123)
    assert target.row(b'{"id": 2, "at": "2026-01-01T00:00:00Z"}')[2] == "2026-01-01T00:00:00Z"
    with pytest.raises(RecordError, match=r"column at: .* out of range"):
        target.row(b'{"id": 3, "at": 99999999999999999999}')
    assert target.carried_rows([b'{"id": 1}']) is None  # the fix goes through `rows`
    assert target.rows([b'{"id": 1, "tags": ["x"]}']) == [(1, ["x"], None)]
    plain = Target(
        route=RouteSettings(topic="t", table="t"), schema="public", name="t",
        columns=("id", "at"), required=frozenset(), timestamps=frozenset({"at"}),
    )  # fmt: skip
    assert plain.row(b'{"id": 1, "at": 5}') == (1, 5)  # not asked: PostgreSQL decides


def test_the_registry_backoff_grows_to_a_bound_and_says_why_until_cleared() -> None:
    backoff = registry_backoff()
    assert backoff.reasons() == []
    # Each wait lies between retry_at - (clock after the call) and retry_at - (clock before):
    # exact bounds, whatever the machine's pace.
    waits = []
    for _ in range(8):
        before = time.monotonic()
        backoff.failed("the registry at http://r is unreachable")
        waits.append((backoff.retry_at - time.monotonic(), backoff.retry_at - before))
    expected = [1, 2, 4, 8, 16, 30, 30, 30]  # doubling from 1 s, bounded at 30 s
    assert all(low <= want <= high for (low, high), want in zip(waits, expected, strict=True))
    assert "schema registry unavailable" in backoff.reasons()[0]
    assert "unreachable" in backoff.reasons()[0]
    backoff.cleared()
    assert backoff.reasons() == [] and backoff.retry_at == 0.0


def test_an_avro_route_without_a_registry_is_refused_at_start() -> None:
    base: dict[str, Any] = {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "postgres": {"dsn": "postgresql://u@h/db"},
        "consumer": {
            "group_id": "g",
            "routes": [{"topic": "t", "table": "t", "value_format": "avro"}],
        },
    }
    without = load_settings(**base)
    with pytest.raises(ConfigError, match=r"consumer.routes.0.value_format: .*schema_registry.url"):
        without.consumer_to_run()
    # The commands that read no record (`offsets show`, `status`) need no registry.
    assert without.require_consumer().routes[0].value_format == "avro"
    settings = load_settings(**base, schema_registry={"url": "http://r:8080/apis/ccompat/v7"})
    assert settings.consumer_to_run().routes[0].value_format == "avro"


def test_an_avro_routes_ignored_fields_come_from_each_new_writer_schema(
    cache: SchemaCache,
) -> None:
    decoder = AvroRowDecoder(("id", "amount"), schemas=cache)
    record = {"id": 5, "tags": [], "attrs": None, "at": datetime.now(UTC),
              "amount": Decimal("-0.0001")}  # fmt: skip
    assert decoder.prepare([_framed(7, record)]) == {"id", "tags", "attrs", "at", "amount"}


def test_a_dataframes_schema_as_json_schema_says_what_to_json_writes() -> None:
    from pyspark.sql import types as T

    from spark_jobs.json_schema import json_schema

    schema = T.StructType(
        [
            T.StructField("id", T.LongType(), nullable=False),
            T.StructField("at", T.TimestampType()),
            T.StructField("amount", T.DecimalType(38, 18)),
            T.StructField("blob", T.BinaryType()),
            T.StructField("tags", T.ArrayType(T.StringType(), containsNull=False)),
            T.StructField("attrs", T.MapType(T.StringType(), T.LongType())),
            T.StructField("address", T.StructType([T.StructField("city", T.StringType())])),
        ]
    )
    document = json_schema(schema, title="orders_value")
    properties = document["properties"]
    assert document["type"] == "object" and document["additionalProperties"] is False
    assert document["required"] == schema.fieldNames()
    assert properties["id"] == {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
    assert properties["at"] == {"oneOf": [{"type": "null"},
                                          {"type": "string", "format": "date-time"}]}  # fmt: skip
    assert properties["amount"]["oneOf"][1] == {"type": "number"}
    assert properties["blob"]["oneOf"][1] == {"type": "string", "contentEncoding": "base64"}
    assert properties["tags"]["oneOf"][1] == {"type": "array", "items": {"type": "string"}}
    attrs = properties["attrs"]["oneOf"][1]
    assert attrs["additionalProperties"]["oneOf"][1]["type"] == "integer"
    assert properties["address"]["oneOf"][1]["properties"]["city"]["oneOf"][1] == {"type": "string"}
    with pytest.raises(ConfigError, match=r"during: .*has no JSON Schema form"):
        json_schema(T.StructType([T.StructField("during", T.DayTimeIntervalType())]), title="x")


def test_the_json_schema_decoder_checks_the_frame_then_decodes_the_body_as_json(
    cache: SchemaCache,
) -> None:
    from consumers.decoding.registry_json_rows import RegistryJsonRowDecoder

    decoder = RegistryJsonRowDecoder(("id", "name"), schemas=cache)
    framed = b"\x00\x00\x00\x00\x08" + b'{"id": 1, "name": "x"}'
    assert decoder.prepare([framed]) == {"id"}  # the JSON Schema's properties
    assert decoder.decode(framed) == (1, "x")
    assert decoder.decode_all([framed, framed]) == [(1, "x"), (1, "x")]
    with pytest.raises(RecordError, match="schema id 7 is a AVRO schema, not JSON Schema"):
        decoder.decode(b"\x00\x00\x00\x00\x07{}")
    with pytest.raises(RecordError, match="schema id 9 is not in the registry"):
        decoder.decode(b"\x00\x00\x00\x00\x09{}")
    with pytest.raises(RecordError, match="starts with 0x7b"):
        decoder.decode(b'{"id": 1}')
    assert decoder.decode_all([framed, b'{"id": 1}']) is None  # `decode` tells which


def test_a_json_schema_route_reads_base64_into_bytea_columns(cache: SchemaCache) -> None:
    route = RouteSettings(topic="t", table="t", value_format="json-schema")
    target = Target(
        route=route, schema="public", name="t", columns=("id", "blob"), required=frozenset(),
        binaries=frozenset({"blob"}), schemas=cache,
    )  # fmt: skip
    assert target.row(b'\x00\x00\x00\x00\x08{"id": 1, "blob": "AP8="}') == (1, b"\x00\xff")
    with pytest.raises(RecordError, match="column blob: not base64 text"):
        target.row(b'\x00\x00\x00\x00\x08{"id": 1, "blob": "no!"}')


def test_avro_rows_of_the_carried_columns_only_when_the_schema_has_no_filled_field(
    cache: SchemaCache,
) -> None:
    record = {"id": 5, "tags": ["x"], "attrs": None, "at": datetime(2026, 1, 1, tzinfo=UTC),
              "amount": Decimal("1.0000")}  # fmt: skip
    good = _framed(7, record)
    # `inserted` is filled by the table and no field of schema 7: rows of the others.
    decoder = AvroRowDecoder(("id", "inserted", "amount"), schemas=cache, filled={"inserted"},
                             tracked={"inserted"})  # fmt: skip
    assert decoder.carried == (0, 2)
    assert decoder.decode_carried([good, good]) == [(5, Decimal("1.0000"))] * 2
    assert decoder.decode_all([good]) == [(5, UNSET, Decimal("1.0000"))]
    # A filled column the schema has a field for: records carry it, so not this way.
    carrying = AvroRowDecoder(("id", "at"), schemas=cache, filled={"at"}, tracked={"at"})
    assert carrying.decode_carried([good]) is None
    assert carrying.decode_carried([good, good + b"\x00"]) is None
    assert decoder.decode_carried([good, good[:-1]]) is None
    assert decoder.decode_carried([good, _framed(9, record)]) is None
