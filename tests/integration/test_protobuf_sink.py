"""The sink's Protobuf side without Spark running (protoc compiles, so not a unit test): a
DataFrame's schema as `.proto` text (`spark_jobs.proto_schema`), compiled, and rows as Arrow
gives them made bodies (`spark_jobs.proto_encoder`) that the consumer's reader reads back to
the same values."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from bridge.errors import ConfigError
from bridge.protobuf_compiler import compile_schema
from consumers.decoding.proto_schemas import ProtoSchema
from spark_jobs.kafka_rows import RowError
from spark_jobs.proto_encoder import ProtoEncoder
from spark_jobs.proto_schema import proto_schema

ADDRESS = T.StructType([T.StructField("city", T.StringType()),
                        T.StructField("zip", T.IntegerType(), nullable=False)])  # fmt: skip
SCHEMA = T.StructType([
    T.StructField("id", T.LongType(), nullable=False),
    T.StructField("name", T.StringType()),
    T.StructField("small", T.ShortType()),
    T.StructField("amount", T.DecimalType(38, 18)),
    T.StructField("day", T.DateType()),
    T.StructField("at", T.TimestampType()),
    T.StructField("local_at", T.TimestampNTZType()),
    T.StructField("tags", T.ArrayType(T.StringType())),
    T.StructField("attrs", T.MapType(T.StringType(), T.LongType())),
    T.StructField("address", ADDRESS),
    T.StructField("homes", T.ArrayType(ADDRESS)),
    T.StructField("by_zip", T.MapType(T.IntegerType(), ADDRESS)),
])  # fmt: skip


def test_a_dataframes_schema_is_a_proto3_message_numbered_in_column_order() -> None:
    text = proto_schema(SCHEMA, name="orders_value", package="bridge")
    assert (
        text
        == """syntax = "proto3";
package bridge;
import "google/protobuf/timestamp.proto";

message orders_value {
  int64 id = 1;
  optional string name = 2;
  optional int32 small = 3;
  optional string amount = 4;
  optional string day = 5;
  google.protobuf.Timestamp at = 6;
  optional string local_at = 7;
  repeated string tags = 8;
  map<string, int64> attrs = 9;
  Address address = 10;
  repeated Homes homes = 11;
  map<int32, By_zip> by_zip = 12;
  message Address {
    optional string city = 1;
    int32 zip = 2;
  }
  message Homes {
    optional string city = 1;
    int32 zip = 2;
  }
  message By_zip {
    optional string city = 1;
    int32 zip = 2;
  }
}
"""
    )


def test_what_protobuf_cannot_hold_is_refused_naming_each_column() -> None:
    bad = T.StructType([
        T.StructField("grid", T.ArrayType(T.ArrayType(T.LongType()))),
        T.StructField("span", T.DayTimeIntervalType()),
        T.StructField("by_day", T.MapType(T.DateType(), T.LongType())),
        T.StructField("bad-name", T.LongType()),
    ])  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        proto_schema(bad, name="r")
    assert [where for where, _ in refused.value.problems] == [
        "grid[]", "span", "by_day", "bad-name"
    ]  # fmt: skip


def _encoder() -> tuple[ProtoEncoder, ProtoSchema]:
    text = proto_schema(SCHEMA, name="orders_value", package="bridge")
    descriptors = compile_schema(text, {})
    return ProtoEncoder(descriptors, "bridge.orders_value", SCHEMA), ProtoSchema(descriptors)


def test_rows_become_bodies_the_consumers_reader_reads_back() -> None:
    encoder, reader = _encoder()
    at = datetime(2026, 11, 25, 13, 46, 8, 123456, tzinfo=UTC)
    full = {
        "id": 1, "name": "ç", "small": -32768,
        "amount": Decimal("12345678901234567890.123456789012345678"), "day": date(1, 1, 1),
        "at": at, "local_at": datetime(1999, 12, 31, 23, 59, 59, 999999),
        "tags": ["a", ""], "attrs": [("k", 2**63 - 1)], "address": {"city": None, "zip": 8001},
        "homes": [{"city": "x", "zip": 1}], "by_zip": [(3, {"city": "y", "zip": 3})],
    }  # fmt: skip
    empty = {name: None for name in SCHEMA.fieldNames()} | {"id": 2}
    column = pa.array([full, empty, None], type=_arrow(SCHEMA))
    bodies = encoder.bodies(column).to_pylist()
    assert bodies[2] is None  # a tombstone
    assert reader.values(bodies[0]) == {
        "id": 1, "name": "ç", "small": -32768,
        "amount": "12345678901234567890.123456789012345678", "day": "0001-01-01", "at": at,
        "local_at": "1999-12-31T23:59:59.999999", "tags": ["a", ""], "attrs": {"k": 2**63 - 1},
        "address": {"city": None, "zip": 8001}, "homes": [{"city": "x", "zip": 1}],
        "by_zip": {"3": {"city": "y", "zip": 3}},
    }  # fmt: skip
    assert reader.values(bodies[1]) == {
        "id": 2, "name": None, "small": None, "amount": None, "day": None, "at": None,
        "local_at": None, "tags": [], "attrs": {}, "address": None, "homes": [], "by_zip": {},
    }  # fmt: skip


def test_a_null_element_fails_the_row_naming_its_field() -> None:
    encoder, _ = _encoder()
    row = {name: None for name in SCHEMA.fieldNames()} | {"id": 1, "tags": ["a", None]}
    with pytest.raises(RowError, match=r"row 1 of this batch .* bridge.orders_value: field tags"):
        encoder.bodies(pa.array([{"id": 0}, row], type=_arrow(SCHEMA)))


def _arrow(data_type: T.DataType) -> pa.DataType:
    """The Arrow type Spark hands a Python UDF for `data_type` (UTC timestamps)."""
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(data_type, timezone="UTC")
