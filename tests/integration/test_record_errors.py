"""`on_record_error: stop` on the real stack: a record that cannot be written halts its partition
there (the records before it committed, none after, nothing dead-lettered) while the others
flow, `/readyz` and a metric name its coordinates and the error, and the partition goes on once
the table is fixed, once the offsets are reset past the record, or once the route dead-letters."""

from __future__ import annotations

import json
import logging

import pytest

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import drained, eventually, running, sample, settings_for, sql
from tests.harness import Endpoints
from tests.integration.test_operator_tools import bridge, stored
from tests.kafka_helpers import transactional_producer

BAD_OFFSET = 13


def _setup(stack: Endpoints, names: dict[str, str], bad: bytes) -> str:
    table = f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    sql(stack, f"CREATE TABLE {table} (id int, body text CHECK (body <> 'bad'))")
    producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
    producer.begin_transaction()
    for i in range(30):  # partition 0 holds the bad record; partition 1 none
        value = bad if i == BAD_OFFSET else json.dumps({"id": i, "body": "ok"}).encode()
        producer.produce(names["topic"], value=value, partition=0)
        producer.produce(names["topic"], value=json.dumps({"id": 100 + i}).encode(), partition=1)
    producer.commit_transaction(30)
    return table


def _ids(stack: Endpoints, table: str) -> list[int]:
    return [row[0] for row in sql(stack, f"SELECT id FROM {table} ORDER BY id")]


GOOD = [*range(30), *range(100, 130)]
BEFORE = [*range(BAD_OFFSET), *range(100, 130)]  # partition 0 up to the record, all of 1
LATER = list(range(200, 205))  # partition 1's, written while partition 0 holds


@pytest.mark.parametrize(
    ("bad", "why", "resume"),
    [
        (b'{"id": 13, "body": "bad"}', "violates check constraint", "table"),
        (b'{"id": 13, "body": "bad"}', "violates check constraint", "reset"),
        (b'{"id": 13, "body": "bad"}', "violates check constraint", "config"),
        (b"not json", "value is not JSON", "reset"),
    ],
)
def test_a_bad_record_stops_its_partition_until_it_is_let_through(
    stack: Endpoints, names: dict[str, str], bad: bytes, why: str, resume: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="bridge")
    table = _setup(stack, names, bad)
    settings = settings_for(stack, names, on_record_error="stop")
    where = f"{names['topic']}[0]@{BAD_OFFSET}"
    with running(settings) as service:
        eventually(lambda: stored(stack, names) == [(0, BAD_OFFSET), (1, 30)])
        eventually(lambda: any(where in r and why in r for r in service.not_ready()))
        assert sample(service, "bridge_consumer_records_stopped_total", topic=names["topic"]) >= 1
        assert _ids(stack, table) == BEFORE
        # Partition 1 goes on while partition 0 holds: records written now land too.
        producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
        producer.begin_transaction()
        for i in LATER:
            producer.produce(names["topic"], value=json.dumps({"id": i}).encode(), partition=1)
        producer.commit_transaction(30)
        eventually(lambda: set(LATER) <= set(_ids(stack, table)))
        assert stored(stack, names)[0] == (0, BAD_OFFSET)
        assert any(where in r for r in service.not_ready())
        if resume == "table":  # fixed by hand: the next try goes through, no restart
            sql(stack, f"ALTER TABLE {table} DROP CONSTRAINT {names['table']}_body_check")
            drained(stack, names, 2)
            eventually(lambda: not any(where in r for r in service.not_ready()))
    assert stored(stack, names)[0] == (0, 30 if resume == "table" else BAD_OFFSET)
    if resume == "reset":
        reset = bridge(stack, "offsets", "reset", "--group", names["group"], "--schema",
                       names["schema"], "--topic", names["topic"], "--partition", "0",
                       "--to", str(BAD_OFFSET + 1), "--execute")  # fmt: skip
        assert reset.returncode == 0, reset.stderr
    if resume != "table":
        policy = "dead_letter" if resume == "config" else "stop"
        with running(settings_for(stack, names, on_record_error=policy)):
            drained(stack, names, 2)
    dead = sql(stack, f'SELECT partition, "offset" FROM {names["schema"]}.dead_letters')
    assert dead == ([(0, BAD_OFFSET)] if resume == "config" else [])
    # Each try is logged, and never with the row's contents (PostgreSQL's "Failing row
    # contains (...)" detail): those stay in the table and the dead letter.
    assert not [r.getMessage() for r in caplog.records if "Failing row" in r.getMessage()]
    expected = GOOD if resume == "table" else [i for i in GOOD if i != BAD_OFFSET]
    assert _ids(stack, table) == [*expected, *LATER]


def test_a_stopped_record_reset_past_while_running_clears_readyz_on_an_idle_topic(
    stack: Endpoints, names: dict[str, str]
) -> None:
    """The bad record is the last of its partition: after `bridge offsets reset --force` past
    it, with the member running, no batch comes; `/readyz` clears all the same."""
    table = f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    sql(stack, f"CREATE TABLE {table} (id int, body text CHECK (body <> 'bad'))")
    producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
    producer.begin_transaction()
    for i in range(BAD_OFFSET + 1):
        body = "bad" if i == BAD_OFFSET else "ok"
        producer.produce(names["topic"], value=json.dumps({"id": i, "body": body}).encode())
    producer.commit_transaction(30)
    where = f"{names['topic']}[0]@{BAD_OFFSET}"
    with running(settings_for(stack, names, on_record_error="stop")) as service:
        eventually(lambda: any(where in r for r in service.not_ready()))
        reset = bridge(stack, "offsets", "reset", "--group", names["group"], "--schema",
                       names["schema"], "--topic", names["topic"], "--partition", "0",
                       "--to", str(BAD_OFFSET + 1), "--execute", "--force")  # fmt: skip
        assert reset.returncode == 0, reset.stderr
        eventually(lambda: service.not_ready() == [], timeout=30)
    assert _ids(stack, table) == list(range(BAD_OFFSET))
