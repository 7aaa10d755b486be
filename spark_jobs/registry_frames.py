"""Typed values for the sink: struct columns in the schema registry's wire format, as Avro, as
JSON with a JSON Schema, or as Protobuf.

    options = {"kafka.bootstrap.servers": ..., "topic": "orders", "value.format": "avro",
               "schema.registry.url": "http://registry:8080/apis/ccompat/v7"}
    framed = encode(df.select(F.struct("*").alias("value")), options)
    framed.writeStream.format("bridge-kafka").options(**options)...start()

`encode` runs on the driver, where the query is defined: it derives each typed column's Avro
schema from the DataFrame's schema (`spark_jobs.avro_schema`), registers it under its subject,
and replaces the column by the magic byte, the schema id and Spark's own `to_avro` of it. The
encoding runs in the JVM, in the same stage that makes the rows, so the sink's Python writer
moves bytes as it does for JSON. Protobuf's schema is derived as text
(`spark_jobs.proto_schema`), or is the user's own `.proto` (`spark_jobs.proto_files`),
compiled by protoc on the driver; its bodies are made in the Python workers from the compiled
descriptors by an Arrow UDF (`spark_jobs.proto_encoder`), framed with the message's indexes as
Confluent's serializers write them. A schema the registry refuses (incompatible with the
subject's latest under its compatibility rule, or refused outright) stops here, before the
query starts, with the subject and the registry's reason.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from pyspark.errors import AnalysisException
from pyspark.sql import types as T

from bridge.errors import BridgeError, ConfigError
from bridge.registry_properties import client_properties
from spark_jobs.avro_schema import avro_schema
from spark_jobs.json_schema import TO_JSON_OPTIONS, json_schema
from spark_jobs.proto_encoder import ProtoEncoder
from spark_jobs.proto_files import ProtoWriting, derived, from_file
from spark_jobs.sink_options import SinkOptions, SubjectStrategy, ValueFormat
from spark_jobs.spark_packages import spark_packages

MAGIC = b"\x00"
_TYPES = {ValueFormat.AVRO: "AVRO", ValueFormat.JSON_SCHEMA: "JSON"}  # the registry's schemaType
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_]")
_AVRO_SERIALIZER_LOGGER = "org.apache.spark.sql.avro.AvroSerializer"


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
    url, settings = parsed.registry["url"], {**_CLIENT_DEFAULTS, **parsed.registry}
    del settings["url"]
    with SchemaRegistryClient({"url": url, **client_properties(url, settings)}) as client:
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
            by_topic = _topic_column(parsed, fields)
            ids: dict[str | None, int] = {}
            schema: dict[str, Any] | ProtoWriting
            for topic in parsed.topics if by_topic is not None else (None,):
                if wanted is ValueFormat.PROTOBUF:
                    schema = _proto_writing(parsed, column, field.dataType, topic)
                    subject = subject_name(parsed, column, {"name": schema.full_name}, topic)
                    ids[topic] = _register_proto(client, subject, schema, parsed.registry["url"])
                    continue
                schema, subject = _schema(parsed, column, field.dataType, wanted, topic)
                ids[topic] = register(
                    client, subject, schema, url=parsed.registry["url"],
                    schema_type=_TYPES[wanted],
                )  # fmt: skip
            if wanted is ValueFormat.AVRO and field.nullable:
                _quiet_nullable_root(df.sparkSession)
            try:
                encoded = encoded.withColumn(
                    field.name,
                    framed(field.name, schema, ids, wanted, by_topic=by_topic,
                           data_type=field.dataType),
                )  # fmt: skip
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


def _quiet_nullable_root(spark: Any) -> None:
    """Spark's AvroSerializer warns, in every task, that a nullable column written with a
    non-nullable Avro schema throws on a null; `framed` never hands it one (a null is a
    tombstone, written as no value), so the warning is noise a user would see each epoch. Its
    logger, which says nothing else but the converse mismatch, goes to ERROR in this JVM (the
    driver, and the executors in local mode; a cluster's executors take it from their own
    log4j2 configuration, docs/typed-records.md)."""
    with contextlib.suppress(Exception):  # a session without a JVM of its own says nothing
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            _AVRO_SERIALIZER_LOGGER, jvm.org.apache.logging.log4j.Level.ERROR
        )


def _topic_column(options: SinkOptions, fields: Mapping[str, Any]) -> str | None:
    """The `topic` column whose topics' subjects the topic strategy registers each schema
    under (the `topics` option names them: `SinkOptions.parse` holds one without the other);
    None when every record goes to the topic option's topic, or the strategy is `record`."""
    if options.topic is not None or options.subject_strategy is not SubjectStrategy.TOPIC:
        return None
    found = fields.get("topic")
    if found is None or not isinstance(found.dataType, T.StringType):
        raise ConfigError(
            [("topic", "no topic option, and no string topic column to say where each record "
              "goes")],
            source="the input of the bridge-kafka sink",
        )  # fmt: skip
    return str(found.name)


def _schema(
    options: SinkOptions,
    column: str,
    data_type: Any,
    wanted: ValueFormat,
    topic: str | None,
) -> tuple[dict[str, Any], str]:
    """The column's schema in `wanted`'s language, named for `topic` (the topic option's when
    None), and the subject it goes under."""
    name = record_name(options, column, topic)
    if wanted is ValueFormat.AVRO:
        schema = avro_schema(data_type, name=name, namespace=options.record_namespace)
        return schema, subject_name(options, column, schema, topic)
    named = {"name": name, "namespace": options.record_namespace}
    return json_schema(data_type, title=name), subject_name(options, column, named, topic)


def _proto_writing(
    options: SinkOptions, column: str, data_type: Any, topic: str | None
) -> ProtoWriting:
    """The Protobuf schema `column` is written with: the user's file's message, or the one
    derived from its struct type, named for `topic` as Avro's record is; checked against the
    column's fields before any query runs."""
    if column in options.proto_files:
        path, message = options.proto_files[column]
        writing = from_file(path, message, option=f"{column}.proto.file")
    else:
        name = record_name(options, column, topic)
        writing = derived(data_type, name=name, package=options.record_namespace)
    ProtoEncoder(writing.descriptors, writing.full_name, data_type).check()
    return writing


def _register_proto(
    client: SchemaRegistryClient, subject: str, writing: ProtoWriting, url: str
) -> int:
    """The id of the Protobuf schema under `subject`, its imports registered first, each under
    its import path as its subject (Confluent's default for references), and referenced by the
    version the registry gave it."""
    versions: dict[str, int] = {}

    def references(name: str) -> list[SchemaReference]:
        return [SchemaReference(i, i, versions[i]) for i in writing.imports[name] if i in versions]

    for name, text in writing.references:
        schema = Schema(text, "PROTOBUF", references(name))
        register(client, name, schema, url=url)
        versions[name] = _registered(name, url, partial(client.lookup_schema, name, schema)).version
    return register(client, subject, Schema(writing.text, "PROTOBUF", references("")), url=url)


def record_name(options: SinkOptions, column: str, topic: str | None = None) -> str:
    """The record's Avro name: the option's, or `<topic>_<column>` with what Avro names refuse
    as `_` (`topic`: a topic column's, else the topic option's)."""
    named = options.value_record_name if column == "value" else options.key_record_name
    if named:
        return named
    base = _NOT_A_NAME.sub("_", topic or options.topic or "record")
    return f"{base}_{column}" if not base[0].isdigit() else f"_{base}_{column}"


def subject_name(
    options: SinkOptions, column: str, schema: dict[str, Any], topic: str | None = None
) -> str:
    """The subject: `<topic>-<column>` (the topic strategy, Confluent's TopicNameStrategy; a
    topic column's `topic`, else the topic option's), or the record's full name."""
    if options.subject_strategy is SubjectStrategy.RECORD:
        namespace = schema.get("namespace")
        return f"{namespace}.{schema['name']}" if namespace else str(schema["name"])
    topic = topic or options.topic
    if topic is None:
        raise ConfigError(
            [("topics", "the topic strategy needs the topic option, or a topic column's topics "
              "in the topics option")],
            source="the bridge-kafka sink options",
        )  # fmt: skip
    return f"{topic}-{column}"


def register(
    client: SchemaRegistryClient,
    subject: str,
    schema: dict[str, Any] | Schema,
    *,
    url: str = "its url",
    schema_type: str = "AVRO",
) -> int:
    """The id of `schema` (a document of `schema_type`, or a registry Schema as it is) under
    `subject`, registering it when new; SchemaRefused naming the subject and the registry's
    reason when the registry will not take it."""
    sent = schema if isinstance(schema, Schema) else Schema(json.dumps(schema), schema_type)
    return int(_registered(subject, url, partial(client.register_schema, subject, sent)))


def _registered(subject: str, url: str, call: Callable[[], Any]) -> Any:
    """`call()`'s answer about `subject`; its failure as the registry's refusal, or as the
    registry out of reach."""
    try:
        return call()
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
    schema: dict[str, Any] | ProtoWriting,
    schema_ids: Mapping[str | None, int],
    value_format: ValueFormat = ValueFormat.AVRO,
    *,
    by_topic: str | None = None,
    data_type: Any = None,
) -> Any:
    """The column as the wire format's bytes: the magic byte, the id (4 bytes, big endian) and
    `to_avro` of the value, or its `to_json` as UTF-8, in the JVM; or Protobuf's message indexes
    and body, made in the Python workers (`data_type`: the column's struct type); null stays
    null (a tombstone). `schema_ids`: the id, under None; or, with `by_topic` (the topic
    column), each topic's, a row of any other topic failing its task with the topic named. The
    body is the same under every topic's subject: the schemas differ only in the record's name,
    which no encoding writes (Protobuf's indexes name the message by its place)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    indexes = schema.indexes if isinstance(schema, ProtoWriting) else b""

    def header(schema_id: int) -> Any:
        return F.lit(bytearray(MAGIC + schema_id.to_bytes(4, "big") + indexes))

    if isinstance(schema, ProtoWriting):
        body = _protobuf_bodies(column, schema, data_type)
    elif value_format is ValueFormat.AVRO:
        body = to_avro(F.col(column), json.dumps(schema))
    else:
        body = F.encode(F.to_json(F.col(column), TO_JSON_OPTIONS), "UTF-8")
    if by_topic is None:
        chosen = header(schema_ids[None])
    else:
        topic = F.col(by_topic)
        named = sorted((t, i) for t, i in schema_ids.items() if t is not None)
        chosen = F.when(topic == named[0][0], header(named[0][1]))
        for name, schema_id in named[1:]:
            chosen = chosen.when(topic == name, header(schema_id))
        chosen = chosen.otherwise(F.raise_error(F.concat(
            F.lit(f"the bridge-kafka sink: a row's {by_topic} column is "),
            F.coalesce(topic, F.lit("null")),
            F.lit(", not one of the topics option's, under whose subjects encode registered "
                  f"the {column} schema (topics={','.join(t for t, _ in named)})"),
        )))  # fmt: skip
    return F.when(F.col(column).isNull(), F.lit(None).cast("binary")).otherwise(
        F.concat(chosen, body)
    )


def _protobuf_bodies(column: str, writing: ProtoWriting, data_type: T.StructType) -> Any:
    """The column's Protobuf bodies, by an Arrow UDF that ships the compiled schema."""
    from pyspark.sql import functions as F

    encoder = ProtoEncoder(writing.descriptors, writing.full_name, data_type)
    # pyspark's stubs know only the form that names the UDF's type, which Spark 4.1 warns
    # against; the form that reads the type hints of `bodies` (pa.Array to pa.Array) is this.
    udf = cast(Any, F).arrow_udf(encoder.bodies, T.BinaryType())
    return udf(F.col(column))
