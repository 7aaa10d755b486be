"""A range applied again over records that were dead-lettered (an operator's `offsets reset`,
a restart after one): the service goes on, each record ends once, in its table or in the
dead-letter table, and a record that fits now lands and leaves the dead-letter table. An error
nothing handles ends the process with one JSON line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from confluent_kafka.schema_registry import Schema

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import (
    consumer_process,
    drained,
    json_lines,
    plain_config,
    produce,
    running,
    settings_for,
    sql,
)
from tests.harness import Endpoints
from tests.integration.test_operator_tools import bridge
from tests.integration.test_typed_records import _framed, registry_client
from tests.kafka_helpers import transactional_producer

NOT_JSON, REFUSED = 5, 17  # offsets of partition 0's poison records in the JSON case


def _reset_to_earliest(stack: Endpoints, names: dict[str, str]) -> None:
    reset = bridge(stack, "offsets", "reset", "--group", names["group"], "--schema",
                   names["schema"], "--topic", names["topic"], "--to", "earliest",
                   "--execute")  # fmt: skip
    assert reset.returncode == 0, reset.stderr


def _dead(stack: Endpoints, names: dict[str, str]) -> list[tuple[int, int]]:
    return [
        (partition, offset)
        for partition, offset in sql(
            stack,
            f'SELECT partition, "offset" FROM {names["schema"]}.dead_letters ORDER BY 1, 2',
        )
    ]


def _ids(stack: Endpoints, table: str) -> list[int]:
    return [row[0] for row in sql(stack, f"SELECT id FROM {table} ORDER BY id")]


def test_a_reset_over_json_dead_letters_resumes_with_each_record_once(
    stack: Endpoints, names: dict[str, str]
) -> None:
    table = f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    sql(stack, f"CREATE TABLE {table} (id int PRIMARY KEY, body text CHECK (body <> 'bad'))")
    producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
    producer.begin_transaction()
    for i in range(30):
        value = json.dumps({"id": i, "body": "bad" if i == REFUSED else "ok"}).encode()
        producer.produce(
            names["topic"], value=b"{not json" if i == NOT_JSON else value, partition=0
        )
        other = {"id": 100 + i, "body": "ok"}
        producer.produce(names["topic"], value=json.dumps(other).encode(), partition=1)
    producer.commit_transaction(30)
    settings = settings_for(stack, names, mode="upsert", key_columns=["id"])
    with running(settings):
        drained(stack, names, 2)
    assert _dead(stack, names) == [(0, NOT_JSON), (0, REFUSED)]

    # Applied again as they are: the same two records are dead letters once each.
    _reset_to_earliest(stack, names)
    with running(settings):
        drained(stack, names, 2)
    assert _dead(stack, names) == [(0, NOT_JSON), (0, REFUSED)]
    good = [i for i in [*range(30), *range(100, 130)] if i not in (NOT_JSON, REFUSED)]
    assert _ids(stack, table) == good

    # The table fixed, applied again: the refused record lands and is a dead letter no more.
    sql(stack, f"ALTER TABLE {table} DROP CONSTRAINT {names['table']}_body_check")
    _reset_to_earliest(stack, names)
    with running(settings):
        drained(stack, names, 2)
    assert _dead(stack, names) == [(0, NOT_JSON)]
    assert _ids(stack, table) == sorted([*good, REFUSED])
    (error,) = sql(stack, f"SELECT error FROM {names['schema']}.dead_letters")[0]
    assert "not JSON" in error, error


def test_a_reset_over_avro_dead_letters_resumes_with_each_record_once(
    stack: Endpoints, names: dict[str, str], registry_url: str
) -> None:
    table = f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY)")
    record = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
    with registry_client(stack, registry_url) as client:
        good = int(
            client.register_schema(f"{names['topic']}-value", Schema(json.dumps(record), "AVRO"))
        )
    unknown = 2**31 - 11
    values = [_framed(unknown if i % 7 == 3 else good, i) for i in range(20)]
    values[10] = b'{"id": 10}'  # not in the wire format
    produce(stack, names["topic"], [(None, value) for value in values])
    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            mode="upsert", key_columns=["id"])  # fmt: skip
    poison = [(0, i) for i in range(20) if i % 7 == 3 or i == 10]
    with running(settings):
        drained(stack, names, 1)
    assert _dead(stack, names) == poison
    for _ in range(2):
        _reset_to_earliest(stack, names)
        with running(settings):
            drained(stack, names, 1)
        assert _dead(stack, names) == poison
        assert _ids(stack, table) == [i for i in range(20) if (0, i) not in poison]


def test_an_unexpected_error_ends_the_process_with_one_json_line_and_a_non_zero_exit(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    """The state schema dropped under a running consumer: nothing handles that, so the process
    says what happened, as JSON, and leaves the restart to its supervisor."""
    table = f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    sql(stack, f"CREATE TABLE {table} (id int)")
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(10)])
    config = tmp_path / "consumer.yaml"
    config.write_text(yaml.safe_dump(plain_config(stack, names, batch_max_wait_ms=50)))
    log = tmp_path / "consumer.log"
    with consumer_process(config, log) as service:
        drained(stack, names, 1)
        sql(stack, f"DROP SCHEMA {names['schema']} CASCADE")
        produce(stack, names["topic"], [(None, {"id": 10})])
        rc = service.wait(timeout=120)
    output = log.read_text()
    assert rc == 1, output[-3000:]
    last = json_lines(output)[-1]
    assert last["level"] == "critical", last
    assert "stopped on an unexpected error" in last["message"], last
    assert "Traceback" in last["error"], last  # the trace inside the JSON line, not raw
    assert last["group"] == names["group"]
    assert f"{names['topic']}[0]" in last["partitions"], last
