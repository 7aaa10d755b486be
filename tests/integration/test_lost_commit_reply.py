"""A COMMIT whose reply never arrives: PostgreSQL committed, the consumer saw its connection
drop. It must read the outcome from the offsets table, not assume a rollback: nothing lost,
nothing doubled, and it keeps going. Both write paths, both modes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from bridge.kafka_admin import KafkaAdmin, create_topic
from consumers.database.offsets import applied_position
from consumers.database.positions import caught_up_position
from tests.consumer_helpers import eventually, running, settings_for, sql
from tests.harness import Endpoints
from tests.kafka_helpers import transactional_producer
from tests.pg_wire_proxy import PgWireProxy

RECORDS = 6_000
KEYS = 1_500  # upsert: each key written four times, the last one wins
POISON_EVERY = 40  # statement by statement: a batch holding a record that is not JSON


@pytest.fixture
def proxy(stack: Endpoints) -> Iterator[PgWireProxy]:
    proxy = PgWireProxy(stack.dsn).start()
    yield proxy
    proxy.close()


def produce(stack: Endpoints, topic: str, *, mode: str, poison: bool) -> tuple[int, set[int]]:
    """The records, in transactions of 500, and with `poison` a record that is not JSON beside
    every fortieth; returns the rows expected and the numbers of the poison records."""
    producer = transactional_producer(stack.bootstrap_servers)
    poisoned = set()
    for start in range(0, RECORDS, 500):
        producer.begin_transaction()
        for i in range(start, start + 500):
            key = i % KEYS if mode == "upsert" else i
            value = json.dumps({"id": key, "seq": i}).encode()
            producer.produce(topic, key=str(key).encode(), value=value)
            if poison and i % POISON_EVERY == 7:
                producer.produce(topic, key=b"poison", value=b"not json %d" % i)
                poisoned.add(i)
        producer.commit_transaction(30)
    return (KEYS if mode == "upsert" else RECORDS), poisoned


@pytest.mark.parametrize("path", ["one message", "statement by statement"])
@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_a_lost_commit_reply_is_read_back_from_the_offsets_table(
    stack: Endpoints, names: dict[str, str], proxy: PgWireProxy, mode: str, path: str
) -> None:
    topic, table, schema, group = names["topic"], names["table"], names["schema"], names["group"]
    create_topic(stack.bootstrap_servers, topic, partitions=3)
    key = "PRIMARY KEY" if mode == "upsert" else "NOT NULL"
    sql(stack, f"CREATE TABLE public.{table} (id int {key}, seq int NOT NULL)")
    rows, poisoned = produce(stack, topic, mode=mode, poison=path == "statement by statement")
    caught_up = caught_up_position(
        KafkaAdmin({"bootstrap.servers": stack.bootstrap_servers}), topic, 3
    )

    started = time.monotonic()
    route: dict[str, Any] = {"mode": "upsert", "key_columns": ["id"]} if mode == "upsert" else {}
    through_proxy = replace(stack, dsn=proxy.dsn)
    settings = settings_for(through_proxy, names, consumer={"batch_max_records": 250}, **route)
    with running(settings) as service:
        proxy.lose_commit_replies(every=3)
        eventually(
            lambda: applied_position(stack.dsn, group, schema, topic) >= caught_up, timeout=180
        )
        proxy.heal()
        # Drained to the end of the log above: no late duplicate can land after it.
        eventually(lambda: service.ready, timeout=30)
    print(f"{proxy.dropped} COMMIT replies lost; caught up in {time.monotonic() - started:.1f}s")

    assert proxy.dropped >= 3
    assert applied_position(stack.dsn, group, schema, topic) == caught_up
    if mode == "insert":
        assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM public.{table}") == [
            (rows, rows)
        ]
    else:
        # Each key's last record won: the one with the highest sequence number.
        assert sql(stack, f"SELECT count(*), sum(seq) FROM public.{table}") == [
            (KEYS, sum(RECORDS - KEYS + k for k in range(KEYS)))
        ]
    dead = sql(stack, f"SELECT value FROM {schema}.dead_letters")
    assert sorted(int(bytes(value).split()[-1]) for (value,) in dead) == sorted(poisoned)
