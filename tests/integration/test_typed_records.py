"""Typed records end to end on the real stack: a Spark DataFrame through the sink as Avro in the
schema registry's wire format, through Kafka, and through the consumer into PostgreSQL columns of
the exact types, every value compared exactly."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bridge.errors import ConfigError
from bridge.kafka_admin import create_topic
from bridge_shell.spark.producer_job import ProducerJob, Source, run
from spark_jobs.avro_schema import avro_schema
from spark_jobs.registry_frames import RegistryUnreachable, SchemaRefused, encode, register
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
from tests.integration.test_protobuf_routes import COMMON
from tests.kafka_helpers import avro_long, read_messages

PARTITIONS = 2

SCHEMA = T.StructType(
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
        T.StructField("payload", T.BinaryType()),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("scores", T.ArrayType(T.LongType())),
        T.StructField("attrs", T.MapType(T.StringType(), T.StringType())),
        T.StructField(
            "address",
            T.StructType(
                [T.StructField("city", T.StringType()), T.StructField("zip", T.IntegerType())]
            ),
        ),
        T.StructField("ref", T.StringType()),
    ]
)
TABLE = """CREATE TABLE {table} (
    id bigint PRIMARY KEY, name text, flag boolean, small smallint, count integer, ratio real,
    score double precision, amount numeric(38, 18), day date, at timestamptz,
    local_at timestamp, payload bytea, tags text[], scores bigint[], attrs jsonb,
    address jsonb, ref uuid
)"""
ROWS: list[tuple[Any, ...]] = [
    (
        1, "ünïcode ✓", True, -32768, 2_147_483_647, 0.5, 1.0000000000000002,
        Decimal("12345678901234567890.123456789012345678"), date(1, 1, 1),
        datetime(2026, 11, 25, 13, 46, 8, 123456, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999), bytes(range(256)),
        ["a", None, "ç"], [1, -(2**63), 2**63 - 1], {"k": "v", "empty": ""},
        {"city": "Zürich", "zip": 8001}, "0b8f2a1e-5c3d-4e6f-8a9b-0c1d2e3f4a5b",
    ),
    (
        2, "", False, 0, 0, -1.25, -0.0, Decimal("-0.000000000000000001"), date(9999, 12, 31),
        datetime(1970, 1, 1, tzinfo=UTC), datetime(2000, 2, 29, 0, 0), b"",
        [], [], {}, {"city": None, "zip": None}, "00000000-0000-0000-0000-000000000000",
    ),
    (3, *([None] * 16)),
]  # fmt: skip
# Protobuf cannot hold a null element of a list (a row with one fails its task, naming it).
PROTOBUF_ROWS = [(*ROWS[0][:12], ["a", "", "ç"], *ROWS[0][13:]), *ROWS[1:]]


@pytest.fixture
def typed_table(stack: Endpoints, names: dict[str, str]) -> Iterator[str]:
    # Qualified: on the secured stack the administrator's search_path starts with its own schema.
    table = f"public.{names['table']}"
    sql(stack, TABLE.format(table=table))
    sql(stack, f"GRANT SELECT, INSERT ON {table} TO PUBLIC")
    stack.let_consumer_write(table, schema=names["schema"])
    yield table
    sql(stack, f"DROP TABLE IF EXISTS {table}")


def sink_options(
    stack: Endpoints, topic: str, registry_url: str, value_format: str = "avro"
) -> dict[str, str]:
    """As the producer's principal; the registry verified by the stack's CA when secured."""
    return {
        "kafka.bootstrap.servers": stack.bootstrap_servers,
        **{f"kafka.{k}": v for k, v in stack.properties("producer").items()},
        "topic": topic,
        "value.format": value_format,
        "schema.registry.url": registry_url,
        **{f"schema.registry.{k}": v for k, v in stack.registry_properties.items()},
    }


def registry_client(stack: Endpoints, registry_url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry_url, **stack.registry_properties})


def write_typed(spark: Any, options: dict[str, str], tmp_path: Path, rows: list[Any]) -> None:
    """The rows as a streaming query would read them (Parquet keeps every type), through the
    sink with `value.format avro`."""
    source = tmp_path / "in"
    spark.createDataFrame(rows, SCHEMA).write.mode("append").parquet(str(source))
    typed = spark.readStream.schema(SCHEMA).parquet(str(source))
    framed = encode(typed.select(F.struct(*SCHEMA.fieldNames()).alias("value")), options)
    query = (
        framed.writeStream.format("bridge-kafka")
        .options(**options)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


@pytest.mark.secured
@pytest.mark.parametrize("value_format", ["avro", "json-schema", "protobuf"])
def test_every_mapped_type_lands_exactly(
    spark: Any,
    stack: Endpoints,
    names: dict[str, str],
    registry_url: str,
    typed_table: str,
    tmp_path: Path,
    value_format: str,
) -> None:
    """On the secured stack too (pytest --secure): Kafka over SASL_SSL as the producer's and the
    consumer's principals, the registry over HTTPS verified by the stack's CA."""
    create_topic(
        stack.bootstrap_servers, names["topic"], partitions=PARTITIONS, config=stack.properties()
    )
    options = sink_options(stack, names["topic"], registry_url, value_format)
    rows = ROWS if value_format != "protobuf" else PROTOBUF_ROWS
    write_typed(spark, options, tmp_path, rows)

    settings = settings_for(stack, names, registry_url=registry_url, value_format=value_format)
    with running(settings):
        drained(stack, names, PARTITIONS)
        assert dead_letters(stack, names, names["topic"]) == 0

    landed = sql(stack, f"SELECT * FROM {typed_table} ORDER BY id")
    expected = [_as_stored(row) for row in rows]
    if value_format == "protobuf":  # Protobuf has no null list or map: they are empty
        expected[2] = (*expected[2][:12], [], [], {}, *expected[2][15:])
    assert len(landed) == len(expected)
    for got, wanted in zip(landed, expected, strict=True):
        for column, value, want in zip(SCHEMA.fieldNames(), got, wanted, strict=True):
            assert value == want and type(value) is type(want), (got[0], column, value, want)


def _as_stored(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """What PostgreSQL gives back for a source row: the same values, the uuid text as a UUID."""
    *head, ref = row
    return (*head, None if ref is None else UUID(ref))


def test_a_bad_schema_id_and_a_value_not_in_the_wire_format_are_dead_letters_naming_why(
    stack: Endpoints, names: dict[str, str], registry_url: str, typed_table: str
) -> None:
    """Nothing is lost: each goes to the dead-letter table with its coordinates and its reason,
    and the records around them land."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    with registry_client(stack, registry_url) as client:
        schema = avro_schema(T.StructType([T.StructField("id", T.LongType(), False)]), name="R")
        good = register(client, f"{names['topic']}-value", schema)
        # A schema that names a type of another subject (a schema reference): its records
        # cannot be read without following the reference, which the consumer does not do.
        referenced = {"type": "fixed", "name": "Id", "namespace": "refs", "size": 8}
        register(client, f"{names['topic']}-id", referenced)
        referring = Schema(
            json.dumps(
                {"type": "record", "name": "S", "fields": [{"name": "id", "type": "refs.Id"}]}
            ),
            "AVRO",
            references=[SchemaReference("refs.Id", f"{names['topic']}-id", 1)],
        )
        refers = int(client.register_schema(f"{names['topic']}-other", referring))
    unknown = 2**31 - 7
    produce(
        stack,
        names["topic"],
        [
            (None, _framed(good, 1)),
            (None, _framed(unknown, 2)),
            (None, b'{"id": 3}'),
            (None, _framed(good, 4)),
            (None, b"\x00" + refers.to_bytes(4, "big") + bytes(8)),
        ],
    )
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro")
    with running(settings):
        drained(stack, names, 1)
    assert sql(stack, f"SELECT id FROM {typed_table} ORDER BY id") == [(1,), (4,)]
    dead = sql(
        stack,
        f'SELECT "offset", error FROM {names["schema"]}.dead_letters ORDER BY "offset"',
    )
    assert [offset for offset, _ in dead] == [1, 2, 4]
    assert f"schema id {unknown} is not in the registry" in dead[0][1]
    assert "not in the schema registry's wire format (starts with 0x7b" in dead[1][1]
    assert f"schema id {refers} cannot be read" in dead[2][1], dead[2][1]


def _framed(schema_id: int, record_id: int) -> bytes:
    """A record {id: record_id} of the schema `{"type": "record", "fields": [id: long]}`."""
    return b"\x00" + schema_id.to_bytes(4, "big") + avro_long(record_id)


def test_an_incompatible_schema_stops_the_query_before_it_starts_naming_subject_and_reason(
    spark: Any, stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    subject = f"{names['topic']}-value"
    with registry_client(stack, registry_url) as client:
        first = T.StructType([T.StructField("id", T.LongType(), False)])
        name = names["topic"].replace("-", "_") + "_value"  # as encode names it
        register(client, subject, avro_schema(first, name=name, namespace="bridge"))
        client.set_compatibility(subject, "BACKWARD")
    # A new required field without a default: readers of the new schema cannot read old data.
    options = sink_options(stack, names["topic"], registry_url)
    changed = spark.createDataFrame([(1, "x")], "id BIGINT NOT NULL, name STRING NOT NULL")
    with pytest.raises(SchemaRefused, match=rf"subject '{subject}'") as refused:
        encode(changed.select(F.struct("id", "name").alias("value")), options)
    assert "HTTP 409" in str(refused.value), refused.value


@pytest.mark.parametrize("value_format", ["avro", "json-schema"])
def test_a_topic_column_gets_each_topics_subject_under_the_default_strategy(
    spark: Any,
    stack: Endpoints,
    names: dict[str, str],
    registry_url: str,
    tmp_path: Path,
    value_format: str,
) -> None:
    """As Connect's TopicNameStrategy: each topic's schema under `<topic>-value`, each record
    framed with its own topic's id; a row of a topic not declared fails the query naming it."""
    topics = [f"{names['topic']}-a", f"{names['topic']}-b"]
    for topic in topics:
        create_topic(stack.bootstrap_servers, topic, partitions=1)
    options = {k: v for k, v in sink_options(stack, topics[0], registry_url, value_format).items()
               if k != "topic"} | {"topics": ",".join(topics)}  # fmt: skip
    source = tmp_path / "in"
    rows = [(topics[i % 2], i, f"n{i}") for i in range(6)]
    spark.createDataFrame(rows, "topic STRING, id BIGINT, name STRING").write.parquet(str(source))

    def run(where: Path) -> None:
        typed = spark.readStream.schema("topic STRING, id BIGINT, name STRING").parquet(str(where))
        framed = encode(typed.select("topic", F.struct("id", "name").alias("value")), options)
        framed.writeStream.format("bridge-kafka").options(**options).option(
            "checkpointLocation", str(where.parent / f"checkpoint-{where.name}")
        ).trigger(availableNow=True).start().awaitTermination()

    run(source)
    with registry_client(stack, registry_url) as client:
        ids = {t: client.get_latest_version(f"{t}-value").schema_id for t in topics}
    assert len(set(ids.values())) == 2, ids  # two subjects, two schemas (their names differ)
    for topic in topics:
        found = read_messages(stack.bootstrap_servers, topic, config=stack.properties("consumer"))
        assert len(found) == 3
        assert {(m.value() or b"")[:5] for m in found} == {b"\0" + ids[topic].to_bytes(4, "big")}

    stray = tmp_path / "stray"
    columns = "topic STRING, id BIGINT, name STRING"
    spark.createDataFrame([("elsewhere", 9, "x")], columns).write.parquet(str(stray))
    with pytest.raises(Exception, match=r"topic column is elsewhere, not one of the topics option"):
        run(stray)


def test_a_struct_value_without_encoding_is_refused_before_the_query_starts(
    spark: Any, stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    spark.createDataFrame([(1,)], "id BIGINT").write.parquet(str(source))
    typed = spark.readStream.schema("id BIGINT").parquet(str(source))
    writer = (
        typed.select(F.struct("id").alias("value"))
        .writeStream.format("bridge-kafka")
        .options(**sink_options(stack, names["topic"], registry_url))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    with pytest.raises(Exception, match=r"frame the struct first"):
        writer.start().awaitTermination()


@pytest.mark.parametrize("value_format", ["avro", "protobuf"])
def test_the_registry_killed_and_restarted_under_both_sides_loses_and_doubles_nothing(
    spark: Any,
    stack: Endpoints,
    names: dict[str, str],
    registry_url: str,
    registry_process: Any,
    typed_table: str,
    tmp_path: Path,
    value_format: str,
) -> None:
    """Producer: the schema is registered when the query is defined; with the registry gone
    (SIGKILL) the query still writes every epoch, since framing needs no registry. Consumer: a
    schema id it has not fetched waits while the registry is gone, bounded and reported
    (/readyz, the metric), never dead-lettered, and lands once it is back."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    options = sink_options(stack, names["topic"], registry_url, value_format)
    settings = settings_for(stack, names, registry_url=registry_url, value_format=value_format)
    rows = ROWS if value_format != "protobuf" else PROTOBUF_ROWS
    with running(settings) as service:
        write_typed(spark, options, tmp_path / "first", rows[:1])
        drained(stack, names, PARTITIONS)

        # A second query, its schema (one column fewer: a new id) registered before the kill.
        source = tmp_path / "second" / "in"
        fewer = T.StructType(SCHEMA.fields[:-1])
        spark.createDataFrame([r[:-1] for r in rows[1:]], fewer).write.parquet(str(source))
        typed = spark.readStream.schema(fewer).parquet(str(source))
        framed = encode(typed.select(F.struct(*fewer.fieldNames()).alias("value")), options)
        registry_process.kill()
        query = (
            framed.writeStream.format("bridge-kafka")
            .options(**options)
            .option("checkpointLocation", str(tmp_path / "second" / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

        unavailable = "bridge_consumer_schema_registry_unavailable_total"
        eventually(lambda: sample(service, unavailable) >= 2, timeout=60)
        assert any("schema registry unavailable" in r for r in service.not_ready())
        assert dead_letters(stack, names, names["topic"]) == 0
        assert sql(stack, f"SELECT count(*) FROM {typed_table}") == [(1,)]

        # Nothing more is produced: the reason must clear with the held records alone, on
        # an idle topic.
        registry_process.start()
        registry_process.wait_ready(120)
        drained(stack, names, PARTITIONS, timeout=120)
        eventually(lambda: not any("registry" in r for r in service.not_ready()), timeout=30)
        assert dead_letters(stack, names, names["topic"]) == 0

    landed = sql(stack, f"SELECT id, count(*) FROM {typed_table} GROUP BY id ORDER BY id")
    assert landed == [(1, 1), (2, 1), (3, 1)]


def test_defining_a_typed_query_with_the_registry_gone_fails_at_once_and_clearly(
    spark: Any,
    stack: Endpoints,
    names: dict[str, str],
    registry_url: str,
    registry_process: Any,
) -> None:
    registry_process.kill()
    df = spark.createDataFrame([(1,)], "id BIGINT NOT NULL")
    with pytest.raises(RegistryUnreachable, match=r"could not reach the schema registry at"):
        encode(
            df.select(F.struct("id").alias("value")),
            sink_options(stack, names["topic"], registry_url),
        )


def test_the_producer_job_writes_json_lines_as_typed_records_and_passes_bad_lines_through(
    spark: Any,
    stack: Endpoints,
    names: dict[str, str],
    registry_url: str,
    typed_table: str,
    tmp_path: Path,
) -> None:
    """`bridge produce --value-format avro --value-schema ... --key-field id --key-format
    avro`: each line read by the schema and framed, its key a framed record of its id; a line
    that is not JSON, or does not fit, goes through as it is, and the consumer dead-letters it
    with its bytes: nothing is lost."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.json").write_text(
        '{"id": 1, "amount": "12345678901234567890.123456789012345678",'
        ' "at": "2026-11-25T13:46:08.123456Z", "tags": ["a", "b"]}\n'
        "not json\n"
        '{"id": "not a number"}\n'
        '{"id": 2, "name": "two", "unknown": true}\n'
    )
    job = ProducerJob(
        source=Source.FILES,
        input=tmp_path / "in",
        topic=names["topic"],
        checkpoint=tmp_path / "checkpoint",
        bootstrap_servers=stack.bootstrap_servers,
        value_format="avro",
        value_schema=(
            "id BIGINT, name STRING, amount DECIMAL(38,18), at TIMESTAMP, tags ARRAY<STRING>"
        ),
        registry={"url": registry_url},
        key_field="id",
        key_format="avro",
    )
    assert run(job, spark).rows_written == 4
    keys: list[dict[str, Any]] = []
    with registry_client(stack, registry_url) as client:
        for message in read_messages(stack.bootstrap_servers, names["topic"],
                                     partitions=PARTITIONS, config=stack.properties()):  # fmt: skip
            raw = message.key()
            assert raw is not None and raw[0] == 0
            schema = client.get_schema(int.from_bytes(raw[1:5], "big"))
            parsed = fastavro.parse_schema(json.loads(schema.schema_str))
            key = fastavro.schemaless_reader(io.BytesIO(raw[5:]), parsed, None)
            assert isinstance(key, dict)
            keys.append(key)
        assert client.get_latest_version(f"{names['topic']}-key").schema is not None
    # The id as the value's schema types it; null where the line had none to read.
    assert sorted(keys, key=lambda k: (k["id"] is not None, k["id"] or 0)) == [
        {"id": None}, {"id": None}, {"id": 1}, {"id": 2},
    ]  # fmt: skip

    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro")
    with running(settings):
        drained(stack, names, PARTITIONS)
    assert sql(stack, f"SELECT id, name, amount, at, tags FROM {typed_table} ORDER BY id") == [
        (
            1, None, Decimal("12345678901234567890.123456789012345678"),
            datetime(2026, 11, 25, 13, 46, 8, 123456, tzinfo=UTC), ["a", "b"],
        ),
        (2, "two", None, None, None),
    ]  # fmt: skip
    dead = sql(stack, f"SELECT value, error FROM {names['schema']}.dead_letters ORDER BY value")
    assert [bytes(value) for value, _ in dead] == [b"not json", b'{"id": "not a number"}']
    assert all("not in the schema registry's wire format" in error for _, error in dead)


def test_a_json_route_fills_array_columns_reads_epoch_millis_and_reports_ignored_fields(
    stack: Endpoints, names: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    # Qualified: once a schema named after the administrator exists, it comes first on its path.
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint, tags text[], scores bigint[], "
               "at timestamptz, doc jsonb)")  # fmt: skip
    sql(stack, f"GRANT SELECT, INSERT ON {table} TO PUBLIC")
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    produce(
        stack,
        names["topic"],
        [
            (None, {"id": 1, "tags": ["a", None, "ç"], "scores": [1, -(2**63)],
                    "at": 1764077168123, "doc": [1, {"k": "v"}]}),
            (None, {"id": 2, "at": "2026-11-25T13:46:08.5+01:00", "added": True, "also": 1}),
        ],
    )  # fmt: skip
    settings = settings_for(stack, names, epoch_millis_timestamps=True, unknown_fields="ignore")
    with running(settings) as service:
        drained(stack, names, 1)
        ignored = sample(service, "bridge_consumer_ignored_fields_total", topic=names["topic"])
    assert ignored == 2
    assert any("field(s) added, also that are not columns" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert sql(stack, f"SELECT id, tags, scores, at, doc FROM {table} ORDER BY id") == [
        (1, ["a", None, "ç"], [1, -(2**63)],
         datetime(2025, 11, 25, 13, 26, 8, 123000, tzinfo=UTC), [1, {"k": "v"}]),
        (2, None, None, datetime(2026, 11, 25, 12, 46, 8, 500000, tzinfo=UTC), None),
    ]  # fmt: skip
    sql(stack, f"DROP TABLE {table}")


def test_a_registry_url_that_is_not_the_api_holds_records_back_and_dead_letters_none(
    stack: Endpoints, names: dict[str, str], registry_url: str, typed_table: str
) -> None:
    """A wrong schema_registry.url on the right server answers 404 for every id, but not the
    API's "schema not found": a settings fault, so the records wait and /readyz says why."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    with registry_client(stack, registry_url) as client:
        schema = avro_schema(T.StructType([T.StructField("id", T.LongType(), False)]), name="R")
        good = register(client, f"{names['topic']}-value", schema)
    produce(stack, names["topic"], [(None, _framed(good, 1))])
    wrong = registry_url.removesuffix("/apis/ccompat/v7") + "/not-the-api"
    settings = settings_for(stack, names, registry_url=wrong, value_format="avro")
    with running(settings) as service:
        unavailable = "bridge_consumer_schema_registry_unavailable_total"
        eventually(lambda: sample(service, unavailable) >= 2, timeout=60)
        assert any("schema registry unavailable" in r for r in service.not_ready())
        assert dead_letters(stack, names, names["topic"]) == 0
    assert sql(stack, f"SELECT count(*) FROM {typed_table}") == [(0,)]
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


@pytest.mark.parametrize("packages", [False, True], ids=["without-spark-avro", "spark_packages"])
def test_a_users_own_session_gets_spark_avro_from_spark_packages_or_a_clear_refusal(
    stack: Endpoints, topic_name: str, registry_url: str, tmp_path: Path, packages: bool
) -> None:
    """A session of the user's own, not bridge's: without spark-avro, `encode` refuses naming
    the column and the fix; with `spark_packages()`, Spark fetches it and `encode` frames."""
    import os
    import subprocess
    import sys

    options = sink_options(stack, topic_name, registry_url)
    config = '.config("spark.jars.packages", spark_packages())' if packages else ""
    job = tmp_path / "job.py"
    job.write_text(f"""
import json, sys
from pyspark.sql import SparkSession, functions as F
from bridge.errors import ConfigError
from spark_jobs.registry_frames import encode
from spark_jobs.spark_packages import spark_packages

spark = SparkSession.builder.master("local[1]"){config}.getOrCreate()
frame = spark.range(3).select(F.struct(F.col("id")).alias("value"))
try:
    rows = encode(frame, json.loads({json.dumps(json.dumps(options))})).collect()
except ConfigError as exc:
    print("refused:", exc)
    sys.exit(3)
print("framed:", [bytes(r.value[:1]) for r in rows])
spark.stop()
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "PYSPARK_"))}
    ran = subprocess.run(
        [sys.executable, str(job)], env=env, capture_output=True, text=True, timeout=300
    )
    if packages:
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "framed: [b'\\x00', b'\\x00', b'\\x00']" in ran.stdout  # the magic byte
    else:
        assert ran.returncode == 3, ran.stderr[-3000:]
        assert "value.format: avro needs Spark's spark-avro package" in ran.stdout
        assert "spark_packages()" in ran.stdout


def test_the_sinks_protobuf_keys_and_values_make_a_table_evolve_it_and_delete_by_key(
    spark: Any, stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    """The whole Protobuf path through the real sink: keys and values in Protobuf, a table
    created from their schemas (its primary key from the key's), a column a later query adds,
    and tombstones that delete by the Protobuf key."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    options = sink_options(stack, names["topic"], registry_url, "protobuf") | {
        "key.format": "protobuf"
    }
    table = f"public.{names['table']}"

    def write(step: str, schema: str, rows: list[Any], value: Any) -> None:
        source = tmp_path / step / "in"
        spark.createDataFrame(rows, schema).write.parquet(str(source))
        read = spark.readStream.schema(schema).parquet(str(source))
        framed = encode(read.select(F.struct("id").alias("key"), value.alias("value")), options)
        framed.writeStream.format("bridge-kafka").options(**options).option(
            "checkpointLocation", str(tmp_path / step / "checkpoint")
        ).trigger(availableNow=True).start().awaitTermination()

    first = "id BIGINT NOT NULL, name STRING, amount DECIMAL(12, 2)"
    second = f"{first}, region STRING"
    settings = settings_for(stack, names, registry_url=registry_url, value_format="protobuf",
                            key_format="protobuf", key_source="record_key", key_columns=["id"],
                            mode="upsert", auto_create=True, auto_evolve=True,
                            table=table)  # fmt: skip
    try:
        with running(settings):
            write("first", first, [(i, f"n{i}", Decimal(i) / 4) for i in range(6)],
                  F.struct("name", "amount"))  # fmt: skip
            drained(stack, names, PARTITIONS)
            assert _column_types(stack, table) == {
                "id": "bigint", "name": "text", "amount": "text"
            }  # fmt: skip
            write("second", second, [(i, f"n{i}", Decimal(i), "eu") for i in range(4, 8)],
                  F.struct("name", "amount", "region"))  # fmt: skip
            drained(stack, names, PARTITIONS)
            assert _column_types(stack, table)["region"] == "text"
            # A later query's tombstones: the value is null where `gone`.
            write("third", f"{second}, gone BOOLEAN",
                  [(1, "x", Decimal(0), "eu", True), (6, "x", Decimal(0), "eu", True),
                   (2, "kept", Decimal("9.5"), "us", False)],
                  F.when(~F.col("gone"), F.struct("name", "amount", "region")))  # fmt: skip
            drained(stack, names, PARTITIONS)
            assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]
        assert sql(stack, f"SELECT id, name, amount, region FROM {table} ORDER BY id") == [
            (0, "n0", "0.00", None), (2, "kept", "9.50", "us"), (3, "n3", "0.75", None),
            (4, "n4", "4.00", "eu"), (5, "n5", "5.00", "eu"), (7, "n7", "7.00", "eu"),
        ]  # fmt: skip
        primary = sql(stack, f"SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                             f"a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE "
                             f"i.indrelid = '{table}'::regclass AND i.indisprimary")  # fmt: skip
        assert primary == [("id",)]
    finally:
        sql(stack, f"DROP TABLE IF EXISTS {table}")


def _column_types(stack: Endpoints, table: str) -> dict[str, str]:
    return dict(
        sql(stack, f"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                   f"WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped")
    )  # fmt: skip


ORDER_PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "shop/common.proto";
enum Status { NEW = 0; PAID = 1; }
message Header { string source = 1; }
message Order {
  int64 id = 1;
  google.protobuf.Timestamp at = 2;
  uint64 big = 3;
  sint32 small = 4;
  fixed32 f32 = 5;
  sfixed64 sf64 = 6;
  uint32 u32 = 7;
  optional string note = 8;
  Status status = 9;
  repeated string tags = 10;
  map<string, int32> attrs = 11;
  common.Money price = 12;
  google.protobuf.Duration took = 13;
  google.protobuf.Int64Value boxed = 14;
  bytes blob = 15;
  double ratio = 16;
  bool flag = 17;
  oneof pay { string card = 18; int64 cash = 19; }
  google.protobuf.Struct doc = 20;
  float ff = 21;
  int32 i32 = 22;
  sint64 s64 = 23;
  fixed64 f64 = 24;
  sfixed32 sf32 = 25;
  google.protobuf.ListValue items = 26;
  google.protobuf.Value any = 27;
  google.protobuf.StringValue said = 28;
}
"""
ORDER_COLUMNS = (
    "id BIGINT NOT NULL, at TIMESTAMP, big DECIMAL(20, 0), small INT, f32 BIGINT, sf64 BIGINT, "
    "u32 BIGINT, note STRING, status STRING, tags ARRAY<STRING>, attrs MAP<STRING, INT>, "
    "price STRUCT<currency: STRING, units: BIGINT>, took INTERVAL DAY TO SECOND, boxed BIGINT, "
    "blob BINARY, ratio DOUBLE, flag BOOLEAN, card STRING, cash BIGINT, doc STRING, ff FLOAT, "
    "i32 INT, s64 BIGINT, f64 DECIMAL(20, 0), sf32 INT, items STRING, any STRING, said STRING"
)


def test_a_users_own_proto_with_an_import_writes_every_type_into_a_table_made_from_it(
    spark: Any, stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    """The user's `.proto` (its second message, so the long form of the message indexes; an
    import of their own, registered as a reference; well-known types built in) through the
    real sink, registry and consumer into a table `auto_create` makes from it: every kind of
    field the reader's table names lands exactly, presence included."""
    protos = tmp_path / "protos"
    (protos / "shop").mkdir(parents=True)
    (protos / "shop" / "common.proto").write_text(COMMON)
    (protos / "order.proto").write_text(ORDER_PROTO)
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    options = sink_options(stack, names["topic"], registry_url, "protobuf") | {
        "value.proto.file": str(protos / "order.proto"), "value.proto.message": "shop.Order"
    }  # fmt: skip
    at = datetime(2026, 11, 27, 13, 0, 0, 123456, tzinfo=UTC)
    rows = [
        (1, at, Decimal(2**64 - 1), -(2**31), 2**32 - 1, -(2**63), 2**32 - 1, "n", "PAID",
         ["a", "ç"], {"k": -1}, ("EUR", 12), timedelta(days=1, microseconds=5), 0,
         bytes(range(256)), 1.0000000000000002, True, None, 2**63 - 1,
         '{"a": [1, "x", null]}', 0.5, -(2**31), -(2**63), Decimal(2**64 - 1), -(2**31),
         '[1, "x"]', '"text"', ""),
        (2, *([None] * 27)),
    ]  # fmt: skip
    source = tmp_path / "in"
    spark.createDataFrame(rows, ORDER_COLUMNS).write.parquet(str(source))
    read = spark.readStream.schema(ORDER_COLUMNS).parquet(str(source))
    framed = encode(read.select(F.struct(*read.columns).alias("value")), options)
    framed.writeStream.format("bridge-kafka").options(**options).option(
        "checkpointLocation", str(tmp_path / "checkpoint")
    ).trigger(availableNow=True).start().awaitTermination()

    with registry_client(stack, registry_url) as client:
        main = client.get_latest_version(f"{names['topic']}-value").schema
        assert [(r.name, r.subject) for r in main.references or ()] == [
            ("shop/common.proto", "shop/common.proto")
        ]
    found = read_messages(
        stack.bootstrap_servers, names["topic"], partitions=PARTITIONS, config=stack.properties()
    )
    assert {bytes(m.value() or b"")[5:7] for m in found} == {b"\x02\x02"}  # indexes [1], long form

    table = f"public.{names['table']}"
    settings = settings_for(stack, names, registry_url=registry_url, value_format="protobuf",
                            table=table, auto_create=True, mode="upsert",
                            key_columns=["id"])  # fmt: skip
    try:
        with running(settings) as service:
            drained(stack, names, PARTITIONS)
            assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]
            # Every field of shop.Order is a column; none of shop.Header's (the first message,
            # which these records are not) was reported as left out (it once was).
            ignored = "bridge_consumer_ignored_fields_total"
            assert sample(service, ignored, topic=names["topic"]) == 0
        landed = sql(stack, f"SELECT id, at, big, small, f32, sf64, u32, note, status, tags, "
                            f"attrs, price, took, boxed, blob, ratio, flag, card, cash, doc, ff, "
                            f"i32, s64, f64, sf32, items, \"any\", said "
                            f"FROM {table} ORDER BY id")  # fmt: skip
        assert landed == [
            (1, at, Decimal(2**64 - 1), -(2**31), 2**32 - 1, -(2**63), 2**32 - 1, "n", "PAID",
             ["a", "ç"], {"k": -1}, {"currency": "EUR", "units": 12},
             timedelta(days=1, microseconds=5), 0, bytes(range(256)), 1.0000000000000002, True,
             None, 2**63 - 1, {"a": [1, "x", None]}, 0.5, -(2**31), -(2**63),
             Decimal(2**64 - 1), -(2**31), [1, "x"], "text", ""),
            (2, None, Decimal(0), 0, 0, 0, 0, None, "NEW", [], {}, None, None, None, b"", 0.0,
             False, None, None, None, 0.0, 0, 0, Decimal(0), 0, None, None, None),
        ]  # fmt: skip
    finally:
        sql(stack, f"DROP TABLE IF EXISTS {table}")


def test_a_users_own_proto_that_does_not_fit_the_columns_is_refused_naming_each(
    spark: Any, stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    protos = tmp_path / "protos"
    (protos / "shop").mkdir(parents=True)
    (protos / "shop" / "common.proto").write_text(COMMON)
    (protos / "order.proto").write_text(ORDER_PROTO)
    options = sink_options(stack, names["topic"], registry_url, "protobuf") | {
        "value.proto.file": str(protos / "order.proto"), "value.proto.message": "shop.Order"
    }  # fmt: skip
    frame = spark.createDataFrame([(1, "x", 2)], "id STRING, nope STRING, status BIGINT")
    with pytest.raises(ConfigError) as refused:
        encode(frame.select(F.struct("*").alias("value")), options)
    assert [where for where, _ in refused.value.problems] == ["id", "nope"], refused.value
    missing = options | {"value.proto.message": "shop.Refund"}
    with pytest.raises(ConfigError, match=r"has no message 'shop.Refund' \(its messages: "
                       r"shop.Header, shop.Order\)"):  # fmt: skip
        encode(frame.select(F.struct("*").alias("value")), missing)


def test_the_producer_job_writes_protobuf_values_and_keys_and_passes_bad_lines_through(
    spark: Any, stack: Endpoints, names: dict[str, str], registry_url: str, typed_table: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`bridge produce --value-format protobuf --value-schema ... --key-field id --key-format
    protobuf`: each line a Protobuf record, its key one of its id, both framed with the first
    message's indexes; a line that is not JSON goes through as it is, for a dead letter."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.json").write_text(
        '{"id": 1, "name": "one", "amount": "12.50", "tags": ["a"]}\nnot json\n{"id": 2}\n'
    )
    job = ProducerJob(
        source=Source.FILES, input=tmp_path / "in", topic=names["topic"],
        checkpoint=tmp_path / "checkpoint", bootstrap_servers=stack.bootstrap_servers,
        value_format="protobuf", value_schema="id BIGINT, name STRING, amount DECIMAL(38,18), "
        "tags ARRAY<STRING>", registry={"url": registry_url}, key_field="id",
        key_format="protobuf",
    )  # fmt: skip
    assert run(job, spark).rows_written == 3
    found = read_messages(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS,
                          config=stack.properties())  # fmt: skip
    assert {bytes(m.key() or b"")[5:6] for m in found} == {b"\x00"}  # the short form: [0]
    settings = settings_for(stack, names, registry_url=registry_url, value_format="protobuf")
    with running(settings):
        drained(stack, names, PARTITIONS)
    assert sql(stack, f"SELECT id, name, amount, tags FROM {typed_table} ORDER BY id") == [
        (1, "one", Decimal("12.5"), ["a"]), (2, None, None, []),
    ]  # fmt: skip
    dead = sql(stack, f"SELECT value FROM {names['schema']}.dead_letters")
    assert [bytes(value) for (value,) in dead] == [b"not json"]
