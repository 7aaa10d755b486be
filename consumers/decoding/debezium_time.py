"""Debezium's time types, which its AvroConverter writes as numbers and text named by
`connect.name`, as Avro's logical types and PostgreSQL's column types: so that a
`MicroTimestamp` is read and created as a timestamp, not as the bigint that carries it."""

from __future__ import annotations

from typing import Any

# Debezium's time types as Avro's logical types, by the Connect name Debezium's AvroConverter
# gives the type (`{"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}`), so that
# they are read and created as dates, times and timestamps, not as the numbers that carry them.
# Debezium's timestamps hold no zone (the database's local time): local timestamps. The nano
# types have no Avro logical type that bridge reads and stay numbers (docs/routes.md).
DEBEZIUM_TIME_TYPES: dict[tuple[str, str], str] = {
    ("int", "io.debezium.time.Date"): "date",
    ("int", "io.debezium.time.Time"): "time-millis",
    ("long", "io.debezium.time.MicroTime"): "time-micros",
    ("long", "io.debezium.time.Timestamp"): "local-timestamp-millis",
    ("long", "io.debezium.time.MicroTimestamp"): "local-timestamp-micros",
}
# Text that Debezium writes in ISO 8601, whose column is of the type PostgreSQL reads it as.
DEBEZIUM_TEXT_TYPES: dict[str, tuple[str, str]] = {
    "io.debezium.time.ZonedTimestamp": ("timestamp with time zone", "D"),
    "io.debezium.time.ZonedTime": ("time with time zone", "D"),
    "io.debezium.time.IsoDate": ("date", "D"),
    "io.debezium.time.IsoTimestamp": ("timestamp without time zone", "D"),
}


def with_debezium_time_types(schema: Any) -> Any:
    """An Avro schema document with each of Debezium's time types given its logical type, in
    place (a schema without them is returned as it is)."""
    if isinstance(schema, list):
        for branch in schema:
            with_debezium_time_types(branch)
    elif isinstance(schema, dict):
        kind, name = schema.get("type"), schema.get("connect.name")
        if isinstance(kind, str) and isinstance(name, str) and "logicalType" not in schema:
            logical = DEBEZIUM_TIME_TYPES.get((kind, name))
            if logical is not None:
                schema["logicalType"] = logical
        if isinstance(kind, list | dict):
            with_debezium_time_types(kind)
        for field in schema.get("fields", ()) if isinstance(schema.get("fields"), list) else ():
            if isinstance(field, dict):
                with_debezium_time_types(field.get("type"))
        for key in ("items", "values"):
            if key in schema:
                with_debezium_time_types(schema[key])
    return schema
