"""Kafka Connect JDBC sink configurations translated by `bridge routes from-connect` and run as
written: the printed YAML (with the Kafka section a Connect worker kept apart, and the secrets
the notes ask for in their files) passes `bridge consume --check` and its consumer applies the
records, against the stack's real registry, Kafka and PostgreSQL."""

from __future__ import annotations

import io
import json
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import fastavro
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from bridge.kafka_admin import create_topic
from tests.cli import run_bridge
from tests.consumer_helpers import consumer_process, drained, produce, sql
from tests.harness import Endpoints
from tests.registry_auth_proxy import RegistryAuthProxy


def _jdbc_url(dsn: str) -> str:
    """The stack's database as Connect's `connection.url` names it (the user and password
    apart, as `connection.user` and `connection.password`)."""
    found = conninfo_to_dict(dsn)
    return f"jdbc:postgresql://{found.get('host')}:{found.get('port', 5432)}/{found['dbname']}"


def _translated(connect: str, tmp_path: Path, stack: Endpoints, names: dict[str, str]) -> Path:
    """`bridge routes from-connect` on `connect`, its secrets written where its notes say, and
    the Kafka section a worker would have added: the configuration file a user runs."""
    source = tmp_path / "sink.properties"
    source.write_text(connect)
    secrets = tmp_path / "secrets"
    printed = run_bridge(
        "routes", "from-connect", str(source), "--secrets-dir", str(secrets), timeout=60
    )
    assert printed.returncode == 0, printed.stderr
    document: dict[str, Any] = yaml.safe_load(printed.stdout)
    secrets.mkdir()
    (secrets / "postgres-dsn").write_text(stack.dsn + "\n")
    (secrets / "registry-user-info").write_text("reader:hunter2\n")
    document["kafka"] = {"bootstrap_servers": stack.bootstrap_servers}
    # The test's own state schema and group, so that tests sharing the stack keep apart.
    document["consumer"] |= {"state_schema": names["schema"], "batch_max_wait_ms": 50}
    assert document["consumer"]["group_id"] == names["group"]
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump(document))
    return config


def _checked_and_run(config: Path, stack: Endpoints, names: dict[str, str], tmp_path: Path) -> None:
    """`bridge consume --check` passes on `config`, and its consumer drains the topic and stops
    cleanly on SIGTERM."""
    checked = run_bridge("consume", "--check", "--config", str(config), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr
    with consumer_process(config, tmp_path / "consumer.log") as service:
        drained(stack, names, 1, timeout=120)
        service.send_signal(signal.SIGTERM)
        assert service.wait(60) == 0, (tmp_path / "consumer.log").read_text()[-3000:]


def _avro(writer: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + writer.to_bytes(4, "big") + body.getvalue()


@pytest.mark.timeout(240)
def test_a_confluent_avro_sink_behind_registry_basic_auth_with_a_string_key_runs_as_translated(
    stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    """Confluent's JDBC sink, Avro values through a registry that asks for basic auth
    (`USER_INFO`, the user:password in a secret file), a StringConverter key as the key column,
    upserts, deletes and `auto.create`: `--check` passes and the rows land as Connect's would,
    the registry asked with the credentials every time."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from spark_jobs.registry_frames import register

    schema = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "label", "type": "string"},
        {"name": "amount", "type": ["null", "long"], "default": None}]}  # fmt: skip
    with SchemaRegistryClient({"url": registry_url}) as client:
        writer = register(client, f"{names['topic']}-value", schema)
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    produce(stack, names["topic"], [
        (b"1", _avro(writer, schema, {"label": "a", "amount": 5})),
        (b"2", _avro(writer, schema, {"label": "b", "amount": 6})),
        (b"1", _avro(writer, schema, {"label": "c", "amount": 7})),
        (b"3", _avro(writer, schema, {"label": "d", "amount": None})),
        (b"3", None),  # a tombstone: delete.enabled deletes by the key
    ])  # fmt: skip
    table = f"public.{names['table']}"
    name = names["group"]
    names = {**names, "group": f"connect-{name}"}  # the group the translation names
    with RegistryAuthProxy(registry_url, user="reader", password="hunter2") as proxy:
        config = _translated(
            f"""\
name={name}
connector.class=io.confluent.connect.jdbc.JdbcSinkConnector
topics={names["topic"]}
table.name.format={table}
connection.url={_jdbc_url(stack.dsn)}
connection.user=postgres
connection.password=not-copied
insert.mode=upsert
pk.mode=record_key
pk.fields=id
delete.enabled=true
auto.create=true
errors.tolerance=all
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=io.confluent.connect.avro.AvroConverter
value.converter.schema.registry.url={proxy.url}
value.converter.basic.auth.credentials.source=USER_INFO
value.converter.basic.auth.user.info=reader:hunter2
""",
            tmp_path,
            stack,
            names,
        )
        _checked_and_run(config, stack, names, tmp_path)
        assert proxy.passed > 0 and proxy.refused == 0
    assert sql(stack, f"SELECT id, label, amount FROM {table} ORDER BY id") == [
        ("1", "c", 7), ("2", "b", 6)
    ]  # fmt: skip
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


@pytest.mark.timeout(240)
def test_a_confluent_sink_with_regex_router_cast_timestamp_converter_and_db_timezone_runs(
    stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    """Confluent's JDBC sink of Avro records through a registry with basic auth, its table named
    by RegexRouter, fields renamed, cast (Cast) and read from text (TimestampConverter), a
    Debezium MicroTimestamp field, and a `db.timezone` for timestamp columns without time zone:
    the translation passes `--check`, the rows land as Connect's would, and a value that cannot
    be converted is a dead letter naming its field."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from spark_jobs.registry_frames import register

    schema = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "label", "type": "string"},
        {"name": "amount", "type": "string"}, {"name": "qty", "type": "double"},
        {"name": "placed", "type": "string"},
        {"name": "shipped", "type": {
            "type": "long", "connect.version": 1,
            "connect.name": "io.debezium.time.MicroTimestamp"}}]}  # fmt: skip
    topic, table = names["topic"], f"public.{names['table']}"
    assert topic.removeprefix("c-") == names["table"].removeprefix("t_")  # RegexRouter's ground
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, label text, amount double "
        "precision, qty integer, placed_at timestamp, shipped timestamp)")  # fmt: skip
    with SchemaRegistryClient({"url": registry_url}) as client:
        writer = register(client, f"{topic}-value", schema)
    create_topic(stack.bootstrap_servers, topic, partitions=1)
    shipped = 1709366400000000  # 2024-03-02 08:00:00, the source database's local time, in µs
    rows = [
        {"id": 1, "label": "a", "amount": "12.50", "qty": 3.9, "placed": "2024-03-01 10:20:30"},
        {"id": 2, "label": "b", "amount": "7", "qty": 1e12, "placed": "2024-03-01 10:20:30"},
        {"id": 3, "label": "c", "amount": "1e3", "qty": 1.0, "placed": "yesterday"},
        {"id": 1, "label": "d", "amount": "13.25", "qty": 4.2, "placed": "2024-07-01 00:30:00"},
        {"id": 5, "label": "e", "amount": "abc", "qty": 1.0, "placed": "2024-07-01 00:30:00"},
    ]
    produce(stack, topic, [(None, _avro(writer, schema, {**r, "shipped": shipped})) for r in rows])
    name = names["group"]
    names = {**names, "group": f"connect-{name}"}  # the group the translation names
    with RegistryAuthProxy(registry_url, user="reader", password="hunter2") as proxy:
        config = _translated(
            f"""\
name={name}
connector.class=io.confluent.connect.jdbc.JdbcSinkConnector
topics={topic}
connection.url={_jdbc_url(stack.dsn)}
connection.user=postgres
connection.password=not-copied
insert.mode=upsert
pk.mode=record_value
pk.fields=id
errors.tolerance=all
db.timezone=Europe/Paris
value.converter=io.confluent.connect.avro.AvroConverter
value.converter.schema.registry.url={proxy.url}
value.converter.basic.auth.credentials.source=USER_INFO
value.converter.basic.auth.user.info=reader:hunter2
transforms=route,rename,cast,when
transforms.route.type=org.apache.kafka.connect.transforms.RegexRouter
transforms.route.regex=c-(.*)
transforms.route.replacement=t_$1
transforms.rename.type=org.apache.kafka.connect.transforms.ReplaceField$Value
transforms.rename.renames=placed:placed_at
transforms.cast.type=org.apache.kafka.connect.transforms.Cast$Value
transforms.cast.spec=amount:float64,qty:int32
transforms.when.type=org.apache.kafka.connect.transforms.TimestampConverter$Value
transforms.when.field=placed_at
transforms.when.target.type=Timestamp
transforms.when.format=yyyy-MM-dd HH:mm:ss
""",
            tmp_path,
            stack,
            names,
        )
        _checked_and_run(config, stack, names, tmp_path)
        assert proxy.passed > 0 and proxy.refused == 0
    # 2024-07-01 00:30 UTC is 02:30 in Paris (summer time); the MicroTimestamp is a local time
    # already, written as it is.
    assert sql(stack, f"SELECT id, label, amount, qty, placed_at, shipped FROM {table}") == [
        (1, "d", 13.25, 4, datetime(2024, 7, 1, 2, 30), datetime(2024, 3, 2, 8, 0))
    ]  # fmt: skip
    errors = dict(sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters'))
    assert sorted(errors) == [1, 2, 4], errors
    assert "field qty: 1000000000000 is out of int32's range" in errors[1]
    assert "field placed: 'yesterday' does not match format" in errors[2]
    assert "field amount: could not convert string to float" in errors[4]


PAYMENT = """\
syntax = "proto3";
package shop;
message Payment { int64 id = 1; string label = 2; int64 cents = 3; }
"""


@pytest.mark.timeout(240)
def test_a_confluent_protobuf_sink_with_auto_create_and_a_cast_runs_as_translated(
    stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    """Confluent's JDBC sink of Protobuf records (ProtobufConverter) with `auto.create` and a
    Cast: the translation passes `--check`, creates the table from the message with the cast
    field's column of the cast type, and upserts the rows."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from google.protobuf import message_factory

    from consumers.decoding.proto_schemas import ProtoSchema, compile_schema

    topic, table = names["topic"], f"public.{names['table']}"
    with SchemaRegistryClient({"url": registry_url}) as client:
        writer = client.register_schema(f"{topic}-value", Schema(PAYMENT, "PROTOBUF"))
    payment: Any = message_factory.GetMessageClass(
        ProtoSchema(compile_schema(PAYMENT, {})).message((0,))
    )
    create_topic(stack.bootstrap_servers, topic, partitions=1)
    framed = b"\x00" + writer.to_bytes(4, "big") + b"\x00"  # [0]: the first message
    produce(stack, topic, [
        (None, framed + payment(id=1, label="a", cents=500).SerializeToString()),
        (None, framed + payment(id=2, label="b", cents=7).SerializeToString()),
        (None, framed + payment(id=1, label="c", cents=650).SerializeToString()),
    ])  # fmt: skip
    name = names["group"]
    names = {**names, "group": f"connect-{name}"}
    config = _translated(
        f"""\
name={name}
connector.class=io.confluent.connect.jdbc.JdbcSinkConnector
topics={topic}
table.name.format={table}
connection.url={_jdbc_url(stack.dsn)}
connection.user=postgres
connection.password=not-copied
insert.mode=upsert
pk.mode=record_value
pk.fields=id
auto.create=true
value.converter=io.confluent.connect.protobuf.ProtobufConverter
value.converter.schema.registry.url={registry_url}
transforms=cast
transforms.cast.type=org.apache.kafka.connect.transforms.Cast$Value
transforms.cast.spec=cents:string
""",
        tmp_path,
        stack,
        names,
    )
    _checked_and_run(config, stack, names, tmp_path)
    types = sql(stack, f"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                f"WHERE attrelid = '{table}'::regclass AND attnum > 0 ORDER BY attnum")  # fmt: skip
    assert types == [("id", "bigint"), ("label", "text"), ("cents", "text")]
    assert sql(stack, f"SELECT id, label, cents FROM {table} ORDER BY id") == [
        (1, "c", "650"), (2, "b", "7")
    ]  # fmt: skip


@pytest.mark.timeout(240)
def test_a_debezium_jdbc_sink_of_json_change_events_with_its_unwrap_runs_as_translated(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    """Debezium's JDBC sink of JSON change events, with ExtractNewRecordState adding `op`:
    creates, updates and deletes land as Debezium's sink applies them, a truncate event is a
    dead letter naming its op, and a field the table lacks refuses its record, as Connect
    does."""
    topic = names["topic"]
    table = f'public."{topic}"'  # Debezium names the table after the topic
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, __op text)")
    create_topic(stack.bootstrap_servers, topic, partitions=1)

    def event(op: str, after: dict[str, Any] | None, before: dict[str, Any] | None = None) -> bytes:
        source = {"db": "shop", "table": "customers", "ts_ms": 1764300000000}
        return json.dumps({"before": before, "after": after, "source": source, "op": op,
                           "ts_ms": 1764300000001}).encode()  # fmt: skip

    produce(stack, topic, [
        (b'{"id": 1}', event("r", {"id": 1, "name": "a"})),
        (b'{"id": 2}', event("c", {"id": 2, "name": "b"})),
        (b'{"id": 1}', event("u", {"id": 1, "name": "a2"}, {"id": 1, "name": "a"})),
        (b'{"id": 2}', event("d", None, {"id": 2, "name": "b"})),
        (b'{"id": 2}', None),  # Debezium's tombstone after the delete
        (b'{"id": 3}', event("c", {"id": 3, "name": "c", "email": "c@x"})),  # no such column
        (b'{"id": 4}', event("t", None)),  # a truncate: no row
    ])  # fmt: skip
    config = _translated(
        f"""\
name={names["group"]}
connector.class=io.debezium.connector.jdbc.JdbcSinkConnector
topics={topic}
connection.url={_jdbc_url(stack.dsn)}
connection.username=postgres
connection.password=not-copied
insert.mode=upsert
primary.key.mode=record_key
primary.key.fields=id
delete.enabled=true
quote.identifiers=true
errors.tolerance=all
key.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=false
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=false
transforms=unwrap
transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState
transforms.unwrap.add.fields=op
transforms.unwrap.delete.tombstone.handling.mode=tombstone
""",
        tmp_path,
        stack,
        {**names, "group": f"connect-{names['group']}"},
    )
    names = {**names, "group": f"connect-{names['group']}"}
    _checked_and_run(config, stack, names, tmp_path)
    assert sql(stack, f"SELECT id, name, __op FROM {table} ORDER BY id") == [(1, "a2", "u")]
    errors = dict(sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters'))
    assert sorted(errors) == [5, 6], errors
    assert "email are not columns" in errors[5] and "op 't'" in errors[6]
