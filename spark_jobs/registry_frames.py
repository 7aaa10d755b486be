"""Typed values for the sink: struct columns in the schema registry's wire format, as Avro or
as JSON with a JSON Schema.

    options = {"kafka.bootstrap.servers": ..., "topic": "orders", "value.format": "avro",
               "schema.registry.url": "http://registry:8080/apis/ccompat/v7"}
    framed = encode(df.select(F.struct("*").alias("value")), options)
    framed.writeStream.format("bridge-kafka").options(**options)...start()

`encode` runs on the driver, where the query is defined: it derives each typed column's Avro
schema from the DataFrame's schema (`spark_jobs.avro_schema`), registers it under its subject,
and replaces the column by the magic byte, the schema id and Spark's own `to_avro` of it. The
encoding runs in the JVM, in the same stage that makes the rows, so the sink's Python writer
moves bytes as it does for JSON. A schema the registry refuses (incompatible with the subject's
latest under its compatibility rule, or refused outright) stops here, before the query starts,
with the subject and the registry's reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from pyspark.errors import AnalysisException
from pyspark.sql import types as T

from bridge.errors import BridgeError, ConfigError
from spark_jobs.avro_schema import avro_schema
from spark_jobs.json_schema import TO_JSON_OPTIONS, json_schema
from spark_jobs.sink_options import SinkOptions, SubjectStrategy, ValueFormat
from spark_jobs.spark_packages import spark_packages

MAGIC = b"\x00"
_TYPES = {ValueFormat.AVRO: "AVRO", ValueFormat.JSON_SCHEMA: "JSON"}  # the registry's schemaType
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_]")


class SchemaRefused(BridgeError):
    """The registry would not take a schema under its subject; the message says which and why."""


class RegistryUnreachable(BridgeError):
    """The registry did not answer (after the client's bounded retries): the query is not
    started, and its supervisor may start it again once the registry is back."""


# Each request bounded, a few tries with the client's own backoff: at most about 45 s in all.
_CLIENT_DEFAULTS = {"timeout": 10, "max.retries": 3}


def encode(df: Any, options: Mapping[str, str]) -> Any:
    """`df` with its `value` (and `key`) column framed for the registry, as `value.format` and
    `key.format` in the sink `options` ask; a column left as JSON is left as it is."""
    parsed = SinkOptions.parse(options)
    fields = {f.name.lower(): f for f in df.schema.fields}
    encoded = df
    with SchemaRegistryClient({**_CLIENT_DEFAULTS, **parsed.registry}) as client:
        for column, wanted in (("value", parsed.value_format), ("key", parsed.key_format)):
            if not wanted.registered:
                continue
            field = fields.get(column)
            if field is None or not isinstance(field.dataType, T.StructType):
                found = "no such column" if field is None else field.dataType.simpleString()
                raise ConfigError(
                    [(column, f"{column}.format {wanted} needs a struct {column} column "
                      f"({found})")],
                    source="the input of the bridge-kafka sink",
                )  # fmt: skip
            name = record_name(parsed, column)
            if wanted is ValueFormat.AVRO:
                schema = avro_schema(field.dataType, name=name, namespace=parsed.record_namespace)
                subject = subject_name(parsed, column, schema)
            else:
                schema = json_schema(field.dataType, title=name)
                subject = subject_name(
                    parsed, column, {"name": name, "namespace": parsed.record_namespace}
                )
            schema_id = register(
                client, subject, schema, url=parsed.registry["url"], schema_type=_TYPES[wanted]
            )
            try:
                encoded = encoded.withColumn(
                    field.name, framed(field.name, schema, schema_id, wanted)
                )
            except AnalysisException as exc:
                if exc.getCondition() != "AVRO_NOT_LOADED_SQL_FUNCTIONS_UNUSABLE":
                    raise
                raise ConfigError(
                    [(f"{column}.format", "avro needs Spark's spark-avro package: start the "
                      "session with .config(\"spark.jars.packages\", spark_packages()) "
                      "(from spark_jobs.spark_packages), or --packages "
                      f"{spark_packages()} with spark-submit")],
                    source="the Spark session of the bridge-kafka sink",
                ) from None  # fmt: skip
    return encoded


def record_name(options: SinkOptions, column: str) -> str:
    """The record's Avro name: the option's, or `<topic>_<column>` with what Avro names refuse
    as `_`."""
    named = options.value_record_name if column == "value" else options.key_record_name
    if named:
        return named
    base = _NOT_A_NAME.sub("_", options.topic or "record")
    return f"{base}_{column}" if not base[0].isdigit() else f"_{base}_{column}"


def subject_name(options: SinkOptions, column: str, schema: dict[str, Any]) -> str:
    if options.subject_strategy is SubjectStrategy.RECORD:
        namespace = schema.get("namespace")
        return f"{namespace}.{schema['name']}" if namespace else str(schema["name"])
    if options.topic is None:
        raise ConfigError(
            [("subject.name.strategy", "the topic strategy needs the topic option; with a "
              "topic column, use 'record'")],
            source="the bridge-kafka sink options",
        )  # fmt: skip
    return f"{options.topic}-{column}"


def register(
    client: SchemaRegistryClient,
    subject: str,
    schema: dict[str, Any],
    *,
    url: str = "its url",
    schema_type: str = "AVRO",
) -> int:
    """The id of `schema` under `subject`, registering it when new; SchemaRefused naming the
    subject and the registry's reason when the registry will not take it."""
    try:
        return int(client.register_schema(subject, Schema(json.dumps(schema), schema_type)))
    except SchemaRegistryError as exc:
        if exc.http_status_code >= 500:
            raise RegistryUnreachable(
                f"the schema registry failed to register subject {subject!r}: {exc}"
            ) from None
        raise SchemaRefused(
            f"the schema registry refused the schema under subject {subject!r}: "
            f"{exc.error_message} (HTTP {exc.http_status_code}, code {exc.error_code})"
        ) from None
    # Anything else the client raises is its transport's: unreachable, timed out, TLS refused.
    except Exception as exc:  # noqa: BLE001
        raise RegistryUnreachable(
            f"could not reach the schema registry at {url} to register subject {subject!r}: {exc!r}"
        ) from None


def framed(
    column: str,
    schema: dict[str, Any],
    schema_id: int,
    value_format: ValueFormat = ValueFormat.AVRO,
) -> Any:
    """The column as the wire format's bytes, in the JVM: the magic byte, the id (4 bytes, big
    endian) and `to_avro` of the value, or its `to_json` as UTF-8; null stays null (a
    tombstone)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    header = MAGIC + schema_id.to_bytes(4, "big")
    if value_format is ValueFormat.AVRO:
        body = to_avro(F.col(column), json.dumps(schema))
    else:
        body = F.encode(F.to_json(F.col(column), TO_JSON_OPTIONS), "UTF-8")
    return F.when(F.col(column).isNull(), F.lit(None).cast("binary")).otherwise(
        F.concat(F.lit(bytearray(header)), body)
    )
