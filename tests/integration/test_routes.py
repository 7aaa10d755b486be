"""Routes as users of Kafka Connect expect them, on the real stack: metadata columns filled from
each record's coordinates, timestamp, key and headers, the Spark sink's provenance among them,
equal to what a read_committed reader sees of the same record."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
import yaml

from bridge.errors import ConfigError
from bridge.kafka_admin import create_topic
from bridge.names import (
    DEFAULT_EPOCHS_TOPIC,
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
)
from bridge.settings import load_settings
from bridge_shell.spark.producer_job import run
from consumers.service import ConsumerService
from tests.consumer_helpers import (
    drained,
    eventually,
    files_job,
    produce,
    running,
    sample,
    settings_for,
    sql,
)
from tests.harness import Endpoints
from tests.kafka_helpers import read_messages, transactional_producer

PARTITIONS = 2
METADATA = {
    "src_topic": "topic", "src_partition": "partition", "src_offset": "offset",
    "written_at": "timestamp", "k": "key", "trace": "header:trace", "query": "spark.query",
    "spark_partition": "spark.partition", "epoch": "spark.epoch",
}  # fmt: skip


@pytest.fixture
def traced_table(stack: Endpoints, names: dict[str, str]) -> str:
    table = f"public.{names['table']}"
    sql(stack, f"""CREATE TABLE {table} (
        id bigint, note text, src_topic text, src_partition integer, src_offset bigint,
        written_at timestamptz, k text, trace text, query text, spark_partition integer,
        epoch bigint)""")  # fmt: skip
    stack.let_consumer_write(table, schema=names["schema"])
    return table


def _header(message: Any, name: str) -> str | None:
    found = [value for key, value in message.headers() or () if key == name]
    return found[-1].decode() if found else None


def test_metadata_and_provenance_columns_match_what_a_reader_sees(
    spark: Any, stack: Endpoints, names: dict[str, str], traced_table: str, tmp_path: Path
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    lines = [f'{{"id": {i}, "note": "n{i}"}}' for i in range(40)]
    job = files_job(stack, names["topic"], tmp_path, lines)
    assert run(job, spark).rows_written == 40
    # And records from elsewhere: a header of their own, no provenance, no key.
    produce(stack, names["topic"], [(None, {"id": 100 + i, "note": "x"}) for i in range(5)],
            headers=[("trace", "t-1"), ("trace", "t-2")])  # fmt: skip
    settings = settings_for(stack, names, metadata=METADATA)
    with running(settings):
        drained(stack, names, PARTITIONS)

    expected = set()
    for message in read_messages(stack.bootstrap_servers, names["topic"],
                                 partitions=PARTITIONS, config=stack.properties()):  # fmt: skip
        _, millis = message.timestamp()
        key = message.key()
        expected.add((
            message.topic(), message.partition(), message.offset(),
            datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis),
            None if key is None else key.decode(), _header(message, "trace"),
            _header(message, PROVENANCE_QUERY),
            int(p) if (p := _header(message, PROVENANCE_PARTITION)) is not None else None,
            int(e) if (e := _header(message, PROVENANCE_EPOCH)) is not None else None,
        ))  # fmt: skip
    stored = sql(stack, f"SELECT src_topic, src_partition, src_offset, written_at, k, trace, "
                        f"query, spark_partition, epoch FROM {traced_table}")  # fmt: skip
    assert len(stored) == len(expected) == 45
    assert set(stored) == expected
    # The sink's provenance on every row it wrote, the Spark query's id the same on all.
    spark_rows = sql(stack, f"SELECT count(*), count(DISTINCT query), count(k) FROM "
                            f"{traced_table} WHERE epoch IS NOT NULL")  # fmt: skip
    assert spark_rows == [(40, 1, 40)]
    assert sql(stack, f"SELECT DISTINCT trace FROM {traced_table} WHERE id >= 100") == [("t-2",)]


def test_a_metadata_column_the_table_lacks_is_refused_naming_the_key_path(
    stack: Endpoints, names: dict[str, str], traced_table: str
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    settings = settings_for(stack, names, metadata={"nope": "offset"})
    with pytest.raises(ConfigError, match=r"consumer\.routes\.0\.metadata\.nope"):
        ConsumerService(settings).start()


IGNORED = "bridge_consumer_ignored_fields_total"


@pytest.mark.parametrize(
    ("fields", "row", "ignored"),
    [
        # name lands in label; secret is left out on purpose, junk and the second record's
        # own label (not a field that lands) are left out too (unknown_fields: ignore), and
        # counted a record at a time: junk twice, label once.
        ({"rename": {"name": "label"}, "exclude": ["secret"]}, (1, "a", 5, "none"), 3),
        # Only id and name, name in label: nothing else lands, nothing counted.
        ({"include": ["id", "name"], "rename": {"name": "label"}}, (1, "a", None, "none"), 0),
    ],
)
def test_fields_rename_include_and_exclude_what_lands(
    stack: Endpoints, names: dict[str, str], fields: dict[str, Any], row: tuple[Any, ...],
    ignored: int,
) -> None:  # fmt: skip
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint, label text, amount numeric, "
               f"secret text NOT NULL DEFAULT 'none')")  # fmt: skip
    value = {"id": 1, "name": "a", "amount": 5, "secret": "s", "junk": 1}
    produce(stack, names["topic"], [(None, value), (None, {**value, "id": 2, "label": "x"})])
    settings = settings_for(stack, names, fields=fields, unknown_fields="ignore")
    with running(settings) as service:
        drained(stack, names, 1)
        assert sample(service, IGNORED, topic=names["topic"]) == ignored
    assert sql(stack, f"SELECT * FROM {table} ORDER BY id") == [
        row, (2, *row[1:])  # the record's own label is not a field that lands in label
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "path", "message"),
    [
        ({"rename": {"name": "nope"}}, "fields.rename.name", "has no column nope"),
        ({"include": ["id", "nope"]}, "fields.include", "has no column nope"),
        ({"exclude": ["label"]}, "fields", "no field fills label, which"),
        ({"exclude": ["id"]}, "fields", "no field fills key column(s) id"),
    ],
)
def test_fields_the_table_cannot_take_are_refused_naming_the_key_path(
    stack: Endpoints, names: dict[str, str], fields: dict[str, Any], path: str, message: str
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    sql(stack, f"CREATE TABLE public.{names['table']} (id bigint PRIMARY KEY, label text NOT NULL)")
    settings = settings_for(stack, names, fields=fields, mode="upsert", key_columns=["id"])
    with pytest.raises(ConfigError) as refused:
        ConsumerService(settings).start()
    assert any(
        p == f"consumer.routes.0.{path}" and message in m for p, m in refused.value.problems
    ), refused.value.problems


def test_settings_refuse_contradicting_fields_and_key_sources() -> None:
    base = {"topic": "t", "table": "public.t"}
    bad: list[tuple[dict[str, Any], str]] = [
        ({"fields": {"include": ["a"], "exclude": ["b"]}}, "include or exclude, not both"),
        ({"fields": {"rename": {"a": "c", "b": "c"}}}, "more than one field renamed to c"),
        ({"fields": {"exclude": ["a"], "rename": {"a": "c"}}}, "renames field(s) it leaves out"),
        ({"key_source": "kafka", "key_columns": ["t", "p"]}, "needs three key_columns"),
        ({"key_source": "record_key"}, "key_source 'record_key' needs key_columns"),
        ({"key_source": "kafka", "key_columns": ["t", "p", "o"], "metadata": {"o": "offset"}},
         "cannot also be a metadata column"),
        ({"mode": "replace"}, "mode 'replace' needs key_columns"),
    ]  # fmt: skip
    for route, message in bad:
        with pytest.raises(ConfigError) as refused:
            load_settings(
                kafka={"bootstrap_servers": "127.0.0.1:9"},
                postgres={"dsn": "postgresql://u@127.0.0.1/db"},
                consumer={"group_id": "g", "routes": [{**base, **route}]},
            )
        assert any(p.startswith("consumer.routes.0") and message in m
                   for p, m in refused.value.problems), (route, refused.value.problems)  # fmt: skip


def test_key_from_the_record_key_upserts_and_deletes_by_it(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, note text)")
    produce(stack, names["topic"], [
        ({"id": 1}, {"note": "a"}), (2, {"note": "b"}), (3, {"note": "c"}),
        ({"id": 1}, {"note": "a2", "id": 99}),  # the value's id is not the key
        ({"id": 2}, None),  # a tombstone deletes by the record key
        (None, {"note": "no key"}),  # a dead letter: nothing to key it by
    ])  # fmt: skip
    settings = settings_for(stack, names, mode="upsert", key_columns=["id"],
                            key_source="record_key")  # fmt: skip
    with running(settings):
        drained(stack, names, 1)
    assert sql(stack, f"SELECT id, note FROM {table} ORDER BY id") == [(1, "a2"), (3, "c")]
    dead = sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters')
    assert dead == [(5, "the record has no key, which key_source record_key reads")]


def test_kafka_coordinates_as_the_key_match_what_a_reader_sees(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (t text, p integer, o bigint, id bigint, "
               f"PRIMARY KEY (t, p, o))")  # fmt: skip
    produce(stack, names["topic"], [({"id": i % 3}, {"id": i % 3}) for i in range(30)])
    produce(stack, names["topic"], [({"id": 0}, None)])  # no row is its own coordinates
    settings = settings_for(stack, names, mode="upsert", key_columns=["t", "p", "o"],
                            key_source="kafka")  # fmt: skip
    with running(settings):
        drained(stack, names, PARTITIONS)
    expected = {
        (m.topic(), m.partition(), m.offset(), json.loads(value)["id"])
        for m in read_messages(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS,
                               config=stack.properties())
        if (value := m.value()) is not None
    }  # fmt: skip
    assert set(sql(stack, f"SELECT t, p, o, id FROM {table}")) == expected
    assert len(expected) == 30
    dead = sql(stack, f"SELECT error FROM {names['schema']}.dead_letters")
    assert len(dead) == 1 and "key_source kafka" in dead[0][0]
    # The same keys with upsert on a table keyed by something else are refused at start.
    sql(stack, f"ALTER TABLE {table} DROP CONSTRAINT {names['table']}_pkey")
    sql(stack, f"ALTER TABLE {table} ADD PRIMARY KEY (id, o)")
    with pytest.raises(ConfigError, match="no primary key or unique constraint on"):
        ConsumerService(settings).start()


def test_a_pattern_route_reads_topics_created_mid_run_into_their_own_tables(
    stack: Endpoints, names: dict[str, str]
) -> None:
    prefix = names["topic"]  # c-<suffix>: its topics c-<suffix>-a, ... go to c_<suffix>_a, ...
    first, later, unmatched = f"{prefix}-a", f"{prefix}-b", f"x{prefix}-a"
    for topic in (first, unmatched):
        create_topic(stack.bootstrap_servers, topic, partitions=PARTITIONS)
        produce(stack, topic, [(None, {"id": i}) for i in range(10)])
    sql(stack, f"CREATE TABLE public.{first.replace('-', '_')} (id bigint)")
    properties = {**stack.properties("consumer", resolved=False),
                  # New topics are seen at the next metadata refresh (5 min by default).
                  "topic.metadata.refresh.interval.ms": 1000}  # fmt: skip
    settings = settings_for(stack, names, kafka_properties=properties,
                            topic_pattern=f"{prefix}-[a-z]+", table="public.${topic}",
                            unknown_fields="ignore")  # fmt: skip
    with running(settings) as service:
        drained(stack, {**names, "topic": first}, PARTITIONS)
        # Created while it runs, before its table: the records wait, and /readyz says why.
        create_topic(stack.bootstrap_servers, later, partitions=PARTITIONS)
        # With a field its table lacks: left out (unknown_fields: ignore) and counted, as for
        # a named topic, each record's.
        produce(stack, later, [(None, {"id": i, "junk": i}) for i in range(20)])
        table = f"public.{later.replace('-', '_')}"
        eventually(lambda: any(later in r and "does not exist" in r for r in service.not_ready()))
        # Only its partitions wait: the pattern's other topic goes on meanwhile.
        produce(stack, first, [(None, {"id": i}) for i in range(10, 15)])
        drained(stack, {**names, "topic": first}, PARTITIONS)
        assert any(later in r and "does not exist" in r for r in service.not_ready())
        # The documented recovery; nothing more is produced to the topic, so the reason must
        # clear with the held records alone, on an idle topic.
        sql(stack, f"CREATE TABLE {table} (id bigint)")
        drained(stack, {**names, "topic": later}, PARTITIONS, timeout=90)
        eventually(lambda: not any(later in r for r in service.not_ready()))
        assert sample(service, IGNORED, topic=later) == 20
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [(20, 20)]
    assert sql(stack, f"SELECT count(*) FROM public.{first.replace('-', '_')}") == [(15,)]
    # The topic the pattern does not match whole was never read. (The epoch manifest is, once
    # some test's sink made it: the routes publish whole epochs by default.)
    read = sql(stack, f"SELECT DISTINCT topic FROM {names['schema']}.offsets ORDER BY 1")
    assert [topic for (topic,) in read if topic != DEFAULT_EPOCHS_TOPIC] == [first, later]


def test_librdkafka_takes_the_subscription_of_every_pattern_a_route_may_have(
    stack: Endpoints,
) -> None:
    from confluent_kafka import Consumer

    patterns = ["orders-.*", r"pay-\d{2,4}", r"a\w+\.x", "(eu|us)-[a-z]+", r"raw\.[^.]+", "x|y"]
    routes = [{"topic_pattern": p, "table": f"public.t{i}"} for i, p in enumerate(patterns)]
    consumer_settings = load_settings(
        kafka={"bootstrap_servers": stack.bootstrap_servers},
        postgres={"dsn": stack.dsn},
        consumer={"group_id": "g", "routes": routes},
    ).require_consumer()
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "g"})
    try:
        consumer.subscribe(consumer_settings.subscription())  # raises on one it cannot read
    finally:
        consumer.close()


def test_a_pattern_route_whose_topic_has_no_table_is_refused_at_start(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, f"{names['topic']}-a", partitions=1)
    settings = settings_for(stack, names, topic_pattern=f"{names['topic']}-.*",
                            table="public.${topic}")  # fmt: skip
    with pytest.raises(ConfigError, match=r"consumer\.routes\.0\.table.*does not exist"):
        ConsumerService(settings).start()


def test_an_avro_route_renames_and_excludes_fields_and_keys_by_its_avro_record_key(
    stack: Endpoints, names: dict[str, str], registry_url: str
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from spark_jobs.registry_frames import register

    schema = {"type": "record", "name": "Payment", "namespace": "test", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "secret", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                                    "scale": 2}}]}  # fmt: skip
    key_schema = {"type": "record", "name": "PaymentKey", "namespace": "test",
                  "fields": [{"name": "k", "type": "long"}]}  # fmt: skip
    with SchemaRegistryClient({"url": registry_url, **stack.registry_properties}) as client:
        value_id = register(client, f"{names['topic']}-value", schema)
        key_id = register(client, f"{names['topic']}-key", key_schema)

    def framed(writer: int, of: dict[str, Any], record: dict[str, Any]) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(of), record)
        return b"\x00" + writer.to_bytes(4, "big") + body.getvalue()

    def key(k: int) -> bytes:
        return framed(key_id, key_schema, {"k": k})

    def value(i: int, name: str) -> bytes:
        record = {"id": 100 + i, "name": name, "secret": "s", "amount": Decimal(i).scaleb(-2)}
        return framed(value_id, schema, record)

    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (k bigint PRIMARY KEY, label text, amount numeric(10,2), "
               f"secret text, id bigint)")  # fmt: skip
    producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
    producer.begin_transaction()
    for k, v in [
        (key(1), value(1, "a")),
        (key(2), value(2, "b")),
        (key(3), value(3, "x")),
        (key(1), value(4, "c")),
        (key(3), None),  # a tombstone deletes by its key
        (b'{"k": 5}', value(5, "e")),
    ]:  # a key not framed: a dead letter
        producer.produce(names["topic"], key=k, value=v)  # fmt: skip
    producer.commit_transaction(30)
    settings = settings_for(
        stack, names, registry_url=registry_url, value_format="avro", mode="upsert",
        key_columns=["k"], key_source="record_key", key_format="avro",
        fields={"rename": {"name": "label"}, "exclude": ["secret", "id"]},
    )  # fmt: skip
    with running(settings) as service:
        drained(stack, names, 1)
        assert sample(service, "bridge_consumer_ignored_fields_total", topic=names["topic"]) == 0
    assert sql(stack, f"SELECT k, label, amount, secret, id FROM {table} ORDER BY k") == [
        (1, "c", Decimal("0.04"), None, None), (2, "b", Decimal("0.02"), None, None)
    ]  # fmt: skip
    dead = sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters')
    assert dead == [(5, "key is not in the schema registry's wire format (starts with 0x7b)")]


def test_a_connect_jdbc_sink_config_translated_by_bridge_runs_as_connect_would(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    """`bridge routes from-connect` on a Connect JDBC sink config with upserts by a value
    field, ReplaceField, InsertField and a dead-letter queue: the route it prints runs against
    the stack and leaves the rows Connect would, the refused record as a dead letter."""
    from tests.cli import run_bridge

    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, label text, amount int, "
               "src_offset bigint)")  # fmt: skip
    stack.let_consumer_write(table, schema=names["schema"])
    connect = tmp_path / "orders-sink.properties"
    connect.write_text(f"""\
name=orders-sink
connector.class=io.confluent.connect.jdbc.JdbcSinkConnector
tasks.max=1
topics={names["topic"]}
table.name.format={table}
connection.url=jdbc:postgresql://db:5432/shop
insert.mode=upsert
pk.mode=record_value
pk.fields=id
transforms=pick,meta
transforms.pick.type=org.apache.kafka.connect.transforms.ReplaceField$Value
transforms.pick.exclude=secret
transforms.pick.renames=name:label
transforms.meta.type=org.apache.kafka.connect.transforms.InsertField$Value
transforms.meta.offset.field=src_offset
errors.tolerance=all
errors.deadletterqueue.topic.name=orders-dlq
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=false
""")
    printed = run_bridge("routes", "from-connect", str(connect), timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "note: errors.deadletterqueue.topic.name" in printed.stderr
    (route,) = yaml.safe_load(printed.stdout)["consumer"]["routes"]
    settings = settings_for(stack, names, **route)
    value = {"id": 1, "name": "a", "amount": 5, "secret": "s"}
    produce(stack, names["topic"], [(None, value), (None, b"not json"),
                                    (None, {**value, "name": "b", "amount": 6})])  # fmt: skip
    with running(settings):
        drained(stack, names, 1)
    assert sql(stack, f"SELECT id, label, amount, src_offset FROM {table}") == [(1, "b", 6, 2)]
    assert sql(stack, f'SELECT "offset" FROM {names["schema"]}.dead_letters') == [(1,)]


def test_quoted_table_names_keep_a_connect_users_tables_as_they_are(
    stack: Endpoints, names: dict[str, str]
) -> None:
    """Tables named as Kafka Connect's JDBC sink names them, quoted, so that PostgreSQL keeps
    `-` and capitals: a named route's `public."<name>"`, and a pattern route's
    `public."${topic}"`, which is the topic's name as it is."""
    named, patterned = names["topic"], f"{names['topic']}-Q"
    named_table = f"{names['table']}-Named"
    for topic in (named, patterned):
        create_topic(stack.bootstrap_servers, topic, partitions=1)
    for table in (named_table, patterned):
        sql(stack, f'CREATE TABLE public."{table}" (id bigint)')
        stack.let_consumer_write(f'public."{table}"', schema=names["schema"])
    produce(stack, named, [(None, {"id": i}) for i in range(5)])
    produce(stack, patterned, [(None, {"id": i}) for i in range(7)])
    routes = [
        {"topic": named, "table": f'public."{named_table}"'},
        {"topic_pattern": f"{named}-[A-Z]+", "table": 'public."${topic}"'},
    ]
    with running(settings_for(stack, names, consumer={"routes": routes})):
        drained(stack, names, 1)
        drained(stack, {**names, "topic": patterned}, 1)
    assert sql(stack, f'SELECT count(*) FROM public."{named_table}"') == [(5,)]
    assert sql(stack, f'SELECT count(*) FROM public."{patterned}"') == [(7,)]
