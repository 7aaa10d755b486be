"""A route with `value_format: protobuf`: values framed as Confluent's serializers frame them
(magic byte, schema id, message indexes, body), their schema registered in the stack's real
registry with a reference, read into a table's columns with no generated code, each value
exact; what cannot be read is a dead letter naming why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from google.protobuf import message_factory

from bridge.kafka_admin import create_topic
from consumers.decoding.proto_schemas import ProtoSchema, compile_schema
from tests.consumer_helpers import drained, eventually, produce, running, settings_for, sql
from tests.harness import Endpoints

COMMON = """syntax = "proto3";
package common;
message Money { string currency = 1; int64 units = 2; }
"""
ORDER = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "shop/common.proto";
enum Status { NEW = 0; PAID = 1; }
message Order {
  int64 id = 1;
  google.protobuf.Timestamp at = 2;
  uint64 big = 3;
  sint32 small = 4;
  optional string note = 5;
  Status status = 6;
  repeated string tags = 7;
  map<string, int32> attrs = 8;
  common.Money price = 9;
  google.protobuf.Duration took = 10;
  google.protobuf.Int64Value boxed = 11;
  bytes blob = 12;
  double ratio = 13;
  bool flag = 14;
  oneof pay { string card = 15; int64 cash = 16; }
}
"""
TABLE = """CREATE TABLE {table} (
    id bigint PRIMARY KEY, at timestamptz, big numeric(20), small integer, note text,
    status text, tags text[], attrs jsonb, price jsonb, took interval, boxed bigint, blob bytea,
    ratio double precision, flag boolean, card text, cash bigint
)"""
PARTITIONS = 2


def _framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + b"\x00" + body  # [0]: the short form


@pytest.fixture
def order_schema(registry_url: str, names: dict[str, str]) -> tuple[int, Any]:
    """The schema registered as a producer's serializer registers it, and the producer's own
    class for Order (built from the same text, as generated code would be)."""
    with SchemaRegistryClient({"url": registry_url}) as client:
        common = f"{names['topic']}-common"
        client.register_schema(common, Schema(COMMON, "PROTOBUF"))
        reference = SchemaReference("shop/common.proto", common, 1)
        schema_id = client.register_schema(
            f"{names['topic']}-value", Schema(ORDER, "PROTOBUF", [reference])
        )
    compiled = ProtoSchema(compile_schema(ORDER, {"shop/common.proto": COMMON}))
    return schema_id, message_factory.GetMessageClass(compiled.message((0,)))


def test_a_protobuf_route_lands_every_value_exactly_and_dead_letters_what_it_cannot_read(
    stack: Endpoints, names: dict[str, str], registry_url: str, order_schema: tuple[int, Any]
) -> None:
    schema_id, order = order_schema
    table = f"public.{names['table']}"
    sql(stack, TABLE.format(table=table))
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    full = order(id=1, big=2**64 - 1, small=-(2**31), note="n", status=1, tags=["a", "ç"],
                 blob=bytes(range(256)), ratio=1.0000000000000002, flag=True,
                 cash=2**63 - 1)  # fmt: skip
    full.at.seconds, full.at.nanos = 1_764_000_000, 123_456_789
    full.attrs["k"] = -1
    full.price.currency, full.price.units = "EUR", 12
    full.took.seconds, full.took.nanos = 90, 500_000_000
    full.boxed.value = 0
    empty = order(id=2)  # every other field absent
    values = [
        (None, _framed(schema_id, full.SerializeToString())),
        (None, _framed(schema_id, empty.SerializeToString())),
        (None, _framed(schema_id, b"\x0a\xff\xff")),  # a body that does not parse
        (None, b"\x00" + (2**31 - 1).to_bytes(4, "big") + b"\x00"),  # an id nobody registered
    ]
    produce(stack, names["topic"], values)
    settings = settings_for(stack, names, registry_url=registry_url, value_format="protobuf",
                            table=table)  # fmt: skip
    with running(settings):
        drained(stack, names, PARTITIONS)
    rows = sql(stack, f"SELECT * FROM {table} ORDER BY id")
    assert rows == [
        (1, datetime(2025, 11, 24, 16, 0, 0, 123456, tzinfo=UTC), Decimal(2**64 - 1), -(2**31),
         "n", "PAID", ["a", "ç"], {"k": -1}, {"currency": "EUR", "units": 12},
         timedelta(seconds=90, microseconds=500_000), 0, bytes(range(256)),
         1.0000000000000002, True, None, 2**63 - 1),
        # Presence: NULL where the field has it, the default where it has not.
        (2, None, Decimal(0), 0, None, "NEW", [], {}, None, None, None, b"", 0.0, False,
         None, None),
    ]  # fmt: skip
    dead = sql(stack, f"SELECT error FROM {names['schema']}.dead_letters ORDER BY 1")
    assert len(dead) == 2, dead
    errors = " | ".join(e for (e,) in dead)
    assert f"does not decode by schema id {schema_id}: body does not parse as shop.Order" in errors
    assert f"schema id {2**31 - 1} is not in the registry" in errors


def test_a_registry_outage_holds_protobuf_values_and_dead_letters_none(
    stack: Endpoints,
    names: dict[str, str],
    registry_url: str,
    registry_process: Any,
    order_schema: tuple[int, Any],
) -> None:
    """A schema id the member has not fetched, with the registry gone: the values wait, said on
    /readyz, never dead-lettered, and land once it is back (nothing produced after)."""
    schema_id, order = order_schema
    table = f"public.{names['table']}"
    sql(stack, TABLE.format(table=table))
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    values = [(None, _framed(schema_id, order(id=i).SerializeToString())) for i in range(10)]
    produce(stack, names["topic"], values)
    registry_process.kill()
    settings = settings_for(stack, names, registry_url=registry_url, value_format="protobuf",
                            table=table)  # fmt: skip
    with running(settings) as service:
        eventually(lambda: any("schema registry unavailable" in r for r in service.not_ready()),
                   timeout=60)  # fmt: skip
        assert sql(stack, f"SELECT count(*) FROM {table}") == [(0,)]
        registry_process.start()
        registry_process.wait_ready(120)
        drained(stack, names, PARTITIONS, timeout=120)
        eventually(lambda: not any("registry" in r for r in service.not_ready()), timeout=30)
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [(10, 10)]
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


KEY = """syntax = "proto3";
package shop;
message OrderKey { int64 id = 1; }
"""


def test_protobuf_keys_upsert_by_the_key_and_a_tombstone_deletes_by_it(
    stack: Endpoints, names: dict[str, str], registry_url: str, order_schema: tuple[int, Any]
) -> None:
    schema_id, order = order_schema
    with SchemaRegistryClient({"url": registry_url}) as client:
        key_id = client.register_schema(f"{names['topic']}-key", Schema(KEY, "PROTOBUF"))
    # The generated class takes its fields as keywords, which the runtime's stubs cannot know.
    key: Any = message_factory.GetMessageClass(ProtoSchema(compile_schema(KEY, {})).message((0,)))
    table = f"public.{names['table']}"
    sql(stack, TABLE.format(table=table))
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)

    def keyed(i: int) -> bytes:
        return _framed(key_id, key(id=i).SerializeToString())

    produce(stack, names["topic"], [
        (keyed(1), _framed(schema_id, order(id=1, note="first").SerializeToString())),
        (keyed(2), _framed(schema_id, order(id=2, note="kept").SerializeToString())),
        (keyed(1), _framed(schema_id, order(id=1, note="second").SerializeToString())),
        (keyed(2), None),  # a tombstone: deletes by the Protobuf key
        (keyed(3), _framed(schema_id, order(id=3).SerializeToString())),
    ])  # fmt: skip
    settings = settings_for(stack, names, registry_url=registry_url, value_format="protobuf",
                            key_format="protobuf", key_source="record_key", key_columns=["id"],
                            mode="upsert", table=table)  # fmt: skip
    with running(settings):
        drained(stack, names, PARTITIONS)
    assert sql(stack, f"SELECT id, note FROM {table} ORDER BY id") == [(1, "second"), (3, None)]


ORDER_V2 = ORDER.replace("\n}\n", "\n  optional string region = 17;\n}\n")
CREATED = {
    "id": "bigint", "at": "timestamp with time zone", "big": "numeric(20,0)", "small": "integer",
    "note": "text", "status": "text", "tags": "text[]", "attrs": "jsonb", "price": "jsonb",
    "took": "interval", "boxed": "bigint", "blob": "bytea", "ratio": "double precision",
    "flag": "boolean", "card": "text", "cash": "bigint",
}  # fmt: skip


def test_a_protobuf_route_creates_its_table_and_gains_a_column_mid_stream(
    stack: Endpoints, names: dict[str, str], registry_url: str, order_schema: tuple[int, Any]
) -> None:
    """auto_create from the message the records name (a reference's type among its fields),
    auto_evolve with a field a later schema adds; the values land as on a table made by hand."""
    schema_id, order = order_schema
    with SchemaRegistryClient({"url": registry_url}) as client:
        reference = SchemaReference("shop/common.proto", f"{names['topic']}-common", 1)
        v2_id = client.register_schema(
            f"{names['topic']}-value", Schema(ORDER_V2, "PROTOBUF", [reference])
        )
    order_v2: Any = message_factory.GetMessageClass(
        ProtoSchema(compile_schema(ORDER_V2, {"shop/common.proto": COMMON})).message((0,))
    )
    table = f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    settings = settings_for(stack, names, registry_url=registry_url, value_format="protobuf",
                            table=table, auto_create=True, auto_evolve=True, mode="upsert",
                            key_columns=["id"])  # fmt: skip
    try:
        with running(settings):
            first = order(id=1, big=2**64 - 1, note="n", status=1, tags=["a"], cash=5)
            first.at.seconds = 1_764_000_000
            first.took.seconds = 3
            produce(stack, names["topic"], [
                (None, _framed(schema_id, first.SerializeToString())),
                (None, _framed(schema_id, order(id=2).SerializeToString())),
            ])  # fmt: skip
            drained(stack, names, PARTITIONS)
            assert _columns(stack, table) == CREATED
            produce(stack, names["topic"], [
                (None, _framed(v2_id, order_v2(id=3, region="eu").SerializeToString())),
                (None, _framed(schema_id, order(id=4).SerializeToString())),
            ])  # fmt: skip
            drained(stack, names, PARTITIONS)
            assert _columns(stack, table) == {**CREATED, "region": "text"}
        assert sql(stack, f"SELECT id, big, note, status, tags, cash, at, took, region, "
                          f"small, boxed FROM {table} ORDER BY id") == [
            (1, Decimal(2**64 - 1), "n", "PAID", ["a"], 5,
             datetime(2025, 11, 24, 16, 0, tzinfo=UTC), timedelta(seconds=3), None, 0, None),
            (2, Decimal(0), None, "NEW", [], None, None, None, None, 0, None),
            (3, Decimal(0), None, "NEW", [], None, None, None, "eu", 0, None),
            (4, Decimal(0), None, "NEW", [], None, None, None, None, 0, None),
        ]  # fmt: skip
        not_null = sql(stack, f"SELECT attname FROM pg_attribute WHERE attrelid = "
                              f"'{table}'::regclass AND attnum > 0 AND attnotnull "
                              "ORDER BY attname")  # fmt: skip
        # The fields that are never NULL (plain scalars, repeated), and the key.
        assert [n for (n,) in not_null] == sorted(
            ["id", "big", "small", "status", "tags", "attrs", "blob", "ratio", "flag"]
        )
        assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]
    finally:
        sql(stack, f"DROP TABLE IF EXISTS {table}")


def _columns(stack: Endpoints, table: str) -> dict[str, str]:
    return dict(
        sql(stack, f"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                   f"WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped")
    )  # fmt: skip
