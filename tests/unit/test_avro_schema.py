"""A DataFrame's schema as Avro: every mapped type, checked by fastavro, which parses the schema
and carries a row of each type through its binary encoding unchanged."""

from __future__ import annotations

import io
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from pyspark.sql import types as T

from bridge.errors import ConfigError
from spark_jobs.avro_schema import avro_schema

EVERY_TYPE = T.StructType(
    [
        T.StructField("id", T.LongType(), nullable=False),
        T.StructField("name", T.StringType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("small", T.ShortType()),
        T.StructField("count", T.IntegerType()),
        T.StructField("ratio", T.FloatType()),
        T.StructField("score", T.DoubleType()),
        T.StructField("amount", T.DecimalType(38, 18)),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("local_at", T.TimestampNTZType()),
        T.StructField("blob", T.BinaryType()),
        T.StructField("tags", T.ArrayType(T.StringType(), containsNull=False)),
        T.StructField("sparse", T.ArrayType(T.LongType())),
        T.StructField("attributes", T.MapType(T.StringType(), T.DoubleType())),
        T.StructField(
            "address",
            T.StructType(
                [
                    T.StructField("city", T.StringType()),
                    T.StructField("geo", T.StructType([T.StructField("lat", T.DoubleType())])),
                ]
            ),
        ),
    ]
)


def _round_trip(schema: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    parsed = fastavro.parse_schema(schema)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed, row)
    buffer.seek(0)
    read = fastavro.schemaless_reader(buffer, parsed, None)
    assert isinstance(read, dict)
    return read


def test_every_mapped_type_is_valid_avro_and_keeps_its_values_exactly() -> None:
    schema = avro_schema(EVERY_TYPE, name="orders_value", namespace="bridge")
    row = {
        "id": 2**62,
        "name": "Zoë",
        "flag": True,
        "small": -7,
        "count": 2**31 - 1,
        "ratio": 0.5,
        "score": 1e300,
        "amount": Decimal("12345678901234567890.123456789012345678"),
        "day": date(2026, 11, 25),
        "at": datetime(2026, 11, 25, 10, 34, 41, 123456, tzinfo=UTC),
        "local_at": datetime(2026, 11, 25, 10, 34, 41, 654321),
        "blob": b"\x00\xff",
        "tags": ["a", "b"],
        "sparse": [1, None, 3],
        "attributes": {"x": 1.5, "y": None},
        "address": {"city": "Lyon", "geo": {"lat": 45.76}},
    }
    assert _round_trip(schema, row) == row


def test_nullable_columns_are_unions_with_null_first_and_a_null_default() -> None:
    schema = avro_schema(EVERY_TYPE, name="orders_value")
    fields = {field["name"]: field for field in schema["fields"]}
    assert fields["id"]["type"] == "long" and "default" not in fields["id"]
    assert fields["name"]["type"] == ["null", "string"] and fields["name"]["default"] is None
    nulls = {name: None for name in fields if name != "id"}
    assert _round_trip(schema, {"id": 1, **nulls}) == {"id": 1, **nulls}


def test_the_logical_types_are_the_ones_the_consumer_maps_exactly() -> None:
    fields = {f["name"]: f["type"][1] for f in avro_schema(EVERY_TYPE, name="v")["fields"][1:]}
    assert fields["amount"] == {"type": "bytes", "logicalType": "decimal", "precision": 38,
                                "scale": 18}  # fmt: skip
    assert fields["at"] == {"type": "long", "logicalType": "timestamp-micros"}
    assert fields["local_at"] == {"type": "long", "logicalType": "local-timestamp-micros"}
    assert fields["day"] == {"type": "int", "logicalType": "date"}


def test_nested_records_are_named_by_their_path() -> None:
    address = next(f for f in avro_schema(EVERY_TYPE, name="v", namespace="ns")["fields"]
                   if f["name"] == "address")["type"][1]  # fmt: skip
    assert (address["name"], address["namespace"]) == ("address", "ns.v")
    geo = address["fields"][1]["type"][1]
    assert (geo["name"], geo["namespace"]) == ("geo", "ns.v.address")


@pytest.mark.parametrize(
    ("field", "path", "says"),
    [
        (T.StructField("span", T.DayTimeIntervalType()), "span", "has no Avro form"),
        (T.StructField("m", T.MapType(T.LongType(), T.StringType())), "m", "keys must be strings"),
        (T.StructField("order id", T.LongType()), "order id", "is not an Avro name"),
        (
            T.StructField("a", T.StructType([T.StructField("v", T.VariantType())])),
            "a.v",
            "has no Avro form",
        ),
    ],
)
def test_what_avro_cannot_hold_is_refused_naming_the_column(
    field: T.StructField, path: str, says: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        avro_schema(T.StructType([T.StructField("id", T.LongType()), field]), name="v")
    assert refused.value.problems[0][0] == path
    assert says in refused.value.problems[0][1]
