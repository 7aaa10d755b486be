"""Kafka Connect JDBC sink configurations translated by `bridge routes from-connect` and run as
written: the printed YAML (with the Kafka section a Connect worker kept apart, and the secrets
the notes ask for in their files) passes `bridge consume --check` and its consumer applies the
records, against the stack's real registry, Kafka and PostgreSQL."""

from __future__ import annotations

import io
import signal
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
        checked = run_bridge("consume", "--check", "--config", str(config), timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "Traceback" not in checked.stderr
        with consumer_process(config, tmp_path / "consumer.log") as service:
            drained(stack, names, 1, timeout=120)
            service.send_signal(signal.SIGTERM)
            assert service.wait(60) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        assert proxy.passed > 0 and proxy.refused == 0
    assert sql(stack, f"SELECT id, label, amount FROM {table} ORDER BY id") == [
        ("1", "c", 7), ("2", "b", 6)
    ]  # fmt: skip
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]
