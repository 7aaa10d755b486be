"""The consumer service against real Kafka and PostgreSQL."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from bridge.errors import ConfigError
from bridge.kafka_admin import KafkaAdmin, create_topic
from bridge.settings import BridgeSettings, load_settings
from consumers.service import ConsumerService
from tests.harness import Endpoints
from tests.kafka_helpers import transactional_producer


def settings_for(
    stack: Endpoints, names: dict[str, str], *, consumer: dict[str, Any] | None = None, **route: Any
) -> BridgeSettings:
    return load_settings(
        kafka={"bootstrap_servers": stack.bootstrap_servers},
        postgres={"dsn": stack.dsn},
        consumer={
            "group_id": names["group"],
            "state_schema": names["schema"],
            "batch_max_wait_ms": 50,
            "routes": [{"topic": names["topic"], "table": f"public.{names['table']}", **route}],
            **(consumer or {}),
        },
    )


def sql(stack: Endpoints, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        cursor = conn.execute(statement.encode())
        return cursor.fetchall() if cursor.description else []


def produce(
    stack: Endpoints,
    topic: str,
    records: list[tuple[Any, Any]],
    *,
    abort: bool = False,
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    producer = transactional_producer(stack.bootstrap_servers)
    producer.begin_transaction()
    for key, value in records:
        producer.produce(
            topic,
            key=None if key is None else json.dumps(key).encode(),
            value=None
            if value is None
            else (value if isinstance(value, bytes) else json.dumps(value).encode()),
            headers=headers,
        )
    if abort:
        producer.flush(30)
        producer.abort_transaction(30)
    else:
        producer.commit_transaction(30)


@contextmanager
def running(settings: BridgeSettings) -> Iterator[ConsumerService]:
    service = ConsumerService(settings)
    service.start()
    failure: list[BaseException] = []

    def loop() -> None:
        try:
            service.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread below
            failure.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        service.stop()
        thread.join(60)
        assert not thread.is_alive(), "the service did not stop"
        if failure:
            raise failure[0]


def eventually(check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def test_committed_records_land_once_and_aborted_never(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int PRIMARY KEY, body text)")
    produce(stack, names["topic"], [(None, {"id": i, "body": f"b{i}"}) for i in range(300)])
    produce(stack, names["topic"], [(None, {"id": 10_000 + i}) for i in range(50)], abort=True)
    produce(stack, names["topic"], [(None, {"id": i, "body": "late"}) for i in range(300, 400)])

    with running(settings_for(stack, names)):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= 400)
        time.sleep(1)  # anything more would be a duplicate (refused by the key) or an aborted row

    assert sql(stack, f"SELECT count(*), min(id), max(id) FROM {names['table']}") == [(400, 0, 399)]
    offsets = sql(
        stack,
        f"SELECT partition, next_offset, owner_epoch FROM {names['schema']}.offsets "
        f"WHERE group_id = '{names['group']}' ORDER BY partition",
    )
    assert [row[0] for row in offsets] == [0, 1, 2]
    # next_offset is last offset + 1: past the data and the transaction markers, never a count.
    assert sum(row[1] for row in offsets) >= 400
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


def test_restart_resumes_from_database_offsets(stack: Endpoints, names: dict[str, str]) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    sql(
        stack, f"CREATE TABLE public.{names['table']} (id int, body text)"
    )  # no key: duplicates would show
    settings = settings_for(stack, names)
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(100)])
    with running(settings):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= 100)
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(100, 150)])
    with running(settings):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= 150)
        time.sleep(1)
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {names['table']}") == [(150, 150)]


def test_poison_records_go_to_dead_letters_and_the_rest_flows(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"])
    sql(stack, f"CREATE TABLE public.{names['table']} "
               "(id int PRIMARY KEY, qty int NOT NULL CHECK (qty > 0), note text)")  # fmt: skip
    sql(stack, f"CREATE INDEX ON public.{names['table']} (note)")
    records: list[tuple[Any, Any]] = [
        (None, {"id": 1, "qty": 1}),
        (None, b"not json"),  # offset 1
        (None, {"id": 2}),  # offset 2: qty is required
        (None, {"id": 3, "qty": -5}),  # offset 3: CHECK
        (None, {"id": 4, "qty": "many"}),  # offset 4: not an integer
        (None, {"id": 1, "qty": 9}),  # offset 5: unique violation in insert mode
        (None, [1, 2]),  # offset 6: JSON, not an object
        (None, {"id": 5, "qty": 5}),
        (None, {"id": 6, "qty": 1, "note": "a\u0000b"}),  # offset 8: NUL, which text cannot hold
        (None, {"id": 7, "qty": 1, "note": secrets.token_hex(10_000)}),  # 9: too big to index
        (None, {"id": 8, "qty": 8}),
    ]
    # NUL and bytes that are not UTF-8 in a header, which jsonb cannot hold as they are.
    produce(stack, names["topic"], records, headers=[("trace", b"t-1"), ("bin", b"\x00\xff")])
    with running(settings_for(stack, names)):
        # Every record is through once the last one is: it may land a batch after the poison.
        eventually(
            lambda: sql(stack, f"SELECT count(*) FROM {names['table']} WHERE id = 8")[0][0] == 1
        )
        time.sleep(0.5)  # time for anything wrongly applied twice to show
    assert sql(stack, f"SELECT id, qty FROM {names['table']} ORDER BY id") == [
        (1, 1),
        (5, 5),
        (8, 8),
    ]
    dead = sql(
        stack,
        f'SELECT topic, partition, "offset", value, error, headers FROM {names["schema"]}.'
        'dead_letters ORDER BY "offset"',
    )
    assert [(t, p, o) for t, p, o, *_ in dead] == [
        (names["topic"], 0, o) for o in (1, 2, 3, 4, 5, 6, 8, 9)
    ]
    assert bytes(dead[0][3]) == b"not json"
    errors = [row[4] for row in dead]
    assert "not JSON" in errors[0]
    assert "qty" in errors[1]
    assert errors[2].startswith("23514")  # check_violation
    assert errors[3].startswith("22P02")  # invalid_text_representation
    assert errors[4].startswith("23505")  # unique_violation
    assert "not a JSON object" in errors[5]
    assert "cannot contain NUL" in errors[6]
    assert errors[7].startswith("54000")  # program_limit_exceeded: index row size
    # Headers come along whether the record failed decoding or PostgreSQL refused it.
    assert all(row[5] == [["trace", "t-1"], ["bin", "\\x00\\xff"]] for row in dead)


def test_values_land_exactly_as_json_and_absent_columns_take_their_defaults(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"])
    columns = ("id int NOT NULL, amount numeric, big numeric, ratio double precision, "
               "meta jsonb, tags text, flag boolean, note text DEFAULT 'none', "
               "seq bigint GENERATED BY DEFAULT AS IDENTITY")  # fmt: skip
    sql(stack, f"CREATE TABLE public.{names['table']} ({columns})")
    records: list[tuple[Any, Any]] = [
        (None, b'{"id": 1, "amount": 12345678901234.567890, "big": 1234567890123456789012345,'
               b' "ratio": 0.1, "meta": {"a": [1, 2.50, null]}, "tags": ["x", 1], "flag": true,'
               b' "note": "given", "ignored": 1}'),
        (None, b'{"id": 2, "note": null, "meta": null}'),  # null is NULL, not the default
        (None, b'{"id": 3}'),  # absent: the default, though other records carry the column
        (None, b'{"id": 4, "ratio": 1e400}'),  # offset 3: beyond a double
        (None, b'{"id": 5, "note": "after"}'),
    ]  # fmt: skip
    produce(stack, names["topic"], records)
    with running(settings_for(stack, names)):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] == 4)
    rows = sql(
        stack,
        "SELECT id, amount::text, big::text, ratio, meta::text, tags, flag, note, seq IS NOT NULL"
        f" FROM {names['table']} ORDER BY id",
    )
    assert rows == [
        (1, "12345678901234.567890", "1234567890123456789012345", 0.1,
         '{"a": [1, 2.50, null]}', '["x",1]', True, "given", True),
        (2, None, None, None, None, None, None, None, True),
        (3, None, None, None, None, None, None, "none", True),
        (5, None, None, None, None, None, None, "after", True),
    ]  # fmt: skip
    dead = sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters')
    assert [(offset, error[:5]) for offset, error in dead] == [(3, "22003")]  # out of range


@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_columns_the_table_generates_are_filled_by_it_and_a_record_setting_one_is_dead(
    stack: Endpoints, names: dict[str, str], mode: str
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"])
    sql(stack, f"CREATE TABLE public.{names['table']} "
               "(id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount numeric, "
               "twice numeric GENERATED ALWAYS AS (amount * 2) STORED)")  # fmt: skip
    route: dict[str, Any] = {"mode": mode, "key_columns": ["id"]} if mode == "upsert" else {}
    records: list[tuple[Any, Any]] = [
        (None, {"id": 100, "amount": 1}),  # a given identity is written, as COPY does
        (None, {"id": 101, "amount": 2, "twice": 5}),  # offset 1: the table computes twice
        (None, {"id": 102, "amount": 3, "twice": None}),  # offset 2: null is a value too
        (None, {"id": 100, "amount": 4}),  # upsert: replaces the first; insert: the key is taken
    ]
    if mode == "insert":
        records.append((None, {"amount": 5}))  # the identity fills it
    produce(stack, names["topic"], records)
    last = records[-1][1]["amount"]
    with running(settings_for(stack, names, **route)):
        # Every record is through once the last one is (one partition, in order).
        eventually(
            lambda: (
                sql(stack, f"SELECT count(*) FROM {names['table']} WHERE amount = {last}") == [(1,)]
            )
        )
        time.sleep(0.5)  # time for anything wrongly applied twice to show
    rows = sql(stack, f"SELECT id, amount, twice FROM {names['table']} ORDER BY amount")
    if mode == "upsert":
        assert rows == [(100, 4, 8)]
    else:
        assert rows[0] == (100, 1, 2)
        assert rows[1][1:] == (5, 10) and rows[1][0] != 100  # the identity's own value
    dead = sql(stack, f'SELECT "offset", error FROM {names["schema"]}.dead_letters ORDER BY 1')
    assert [offset for offset, _ in dead[:2]] == [1, 2]
    assert all("column twice is generated by the table" in error for _, error in dead[:2])
    if mode == "insert":
        assert dead[2][0] == 3 and dead[2][1].startswith("23505")


def test_upsert_last_record_wins_and_tombstone_deletes(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"])
    sql(stack, f"CREATE TABLE public.{names['table']} (id int PRIMARY KEY, v text)")
    produce(
        stack,
        names["topic"],
        [
            ({"id": 1}, {"id": 1, "v": "first"}),
            ({"id": 2}, {"id": 2, "v": "doomed"}),
            ({"id": 1}, {"id": 1, "v": "last"}),
            ({"id": 3}, {"id": 3, "v": "kept"}),
            ({"id": 2}, None),
            ({"id": 3}, None),
            ({"id": 3}, {"id": 3, "v": "back"}),
            # One key for PostgreSQL, two for JSON: still the last record wins.
            ({"id": 4}, {"id": 4, "v": "number"}),
            ({"id": "4"}, {"id": "4", "v": "text"}),
        ],
    )
    with running(settings_for(stack, names, mode="upsert", key_columns=["id"])):
        eventually(
            lambda: sql(stack, f"SELECT count(*) FROM {names['table']} WHERE v = 'back'")[0][0] == 1
        )
    assert sql(stack, f"SELECT id, v FROM {names['table']} ORDER BY id") == [
        (1, "last"),
        (3, "back"),
        (4, "text"),
    ]


def test_bad_configuration_is_refused_at_start(stack: Endpoints, names: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"consumer\.routes\.0\.table.*does not exist"):
        ConsumerService(settings_for(stack, names)).start()

    sql(stack, f"CREATE TABLE public.{names['table']} (id int, v text)")
    with pytest.raises(ConfigError, match=r"key_columns.*no column nope"):
        ConsumerService(settings_for(stack, names, mode="upsert", key_columns=["nope"])).start()
    with pytest.raises(ConfigError, match=r"no primary key or unique constraint"):
        ConsumerService(settings_for(stack, names, mode="upsert", key_columns=["id"])).start()
    sql(stack, f"ALTER TABLE public.{names['table']} ADD COLUMN twice int UNIQUE "
               "GENERATED ALWAYS AS (id * 2) STORED")  # fmt: skip
    with pytest.raises(ConfigError, match=r"key_columns.*twice is generated by"):
        ConsumerService(settings_for(stack, names, mode="upsert", key_columns=["twice"])).start()


def test_metrics_health_and_readiness_endpoints(stack: Endpoints, names: dict[str, str]) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int NOT NULL, body text)")
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(500)])
    produce(stack, names["topic"], [(None, b"not json")])
    settings = settings_for(stack, names)
    consumer = settings.require_consumer().model_copy(update={"http_port": 0})
    settings = settings.model_copy(update={"consumer": consumer})

    with running(settings) as service:
        assert service.http_port
        base = f"http://127.0.0.1:{service.http_port}"
        eventually(lambda: service.applied_total == 500)
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/readyz")[0] == 200
        assert _get(base + "/nothing")[0] == 404

        def scraped(name: str) -> float:
            status, body = _get(base + "/metrics")
            assert status == 200
            for line in body.splitlines():
                if line.startswith(name):
                    return float(line.rsplit(" ", 1)[1])
            return -1.0

        topic = names["topic"]
        assert scraped(f'bridge_consumer_records_applied_total{{topic="{topic}"}}') == 500
        assert scraped(f'bridge_consumer_dead_letters_total{{topic="{topic}"}}') == 1
        assert scraped("bridge_consumer_batches_total") >= 1
        assert scraped("bridge_consumer_end_to_end_latency_seconds_count") >= 1
        # Lag comes from librdkafka's statistics, every 5 s: both partitions caught up.
        eventually(
            lambda: (
                scraped(f'bridge_consumer_lag{{partition="0",topic="{topic}"}}') == 0
                and scraped(f'bridge_consumer_lag{{partition="1",topic="{topic}"}}') == 0
            ),
            timeout=30,
        )


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback test
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_two_instances_with_forced_rebalances_apply_each_record_once(
    stack: Endpoints, names: dict[str, str]
) -> None:
    total, chunk = 30_000, 1_000
    create_topic(stack.bootstrap_servers, names["topic"], partitions=4)
    # No key: a record applied twice would be a second row.
    sql(stack, f"CREATE TABLE public.{names['table']} (id int NOT NULL, body text)")
    settings = settings_for(stack, names)

    def feed(start: int) -> None:
        # Keyed, so that every partition gets records and both members have work.
        produce(stack, names["topic"], [(i, {"id": i}) for i in range(start, start + chunk)])

    sent = 0
    with running(settings) as first:
        feed(sent)
        sent += chunk
        with running(settings) as second:  # joins: partitions move from first to second
            deadline = time.monotonic() + 60
            while second.applied_total == 0 or sent < total // 2:
                assert time.monotonic() < deadline, "the second member never applied a record"
                feed(sent)
                sent += chunk
                time.sleep(0.3)
        # second left: its partitions come back to first, at the offsets second stored
        while sent < total:
            feed(sent)
            sent += chunk
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= total)
        time.sleep(1)  # a late duplicate would show in this window

    rows, distinct = sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {names['table']}")[0]
    assert (rows, distinct) == (total, total)
    # Each record was applied by exactly one of the two members, once.
    assert first.applied_total + second.applied_total == total


def stream_through_fault(
    stack: Endpoints, names: dict[str, str], fault: Callable[[], None], *, total: int
) -> tuple[int, int, int]:
    """Produce `total` records in transactions of 1,000 while the service applies them; halfway,
    once some are applied, run `fault`. Returns (rows, distinct ids, what the service counted)
    after everything has landed and a late duplicate has had a second to show."""
    chunk = 1_000
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int NOT NULL, body text)")

    with running(settings_for(stack, names)) as service:
        for start in range(0, total, chunk):
            produce(stack, names["topic"], [(None, {"id": i}) for i in range(start, start + chunk)])
            if start == total // 2:
                eventually(lambda: service.applied_total > 0)
                fault()
        eventually(
            lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= total,
            timeout=180,
        )
        time.sleep(1)  # a late duplicate would show in this window

    rows, distinct = sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {names['table']}")[0]
    return rows, distinct, service.applied_total


def test_postgres_restarted_mid_stream_loses_and_doubles_nothing(
    stack: Endpoints, names: dict[str, str]
) -> None:
    postgres = stack.postgres
    if postgres is None:
        pytest.skip("needs the local stack's PostgreSQL process to restart it")

    def restart() -> None:
        postgres.stop()  # fast shutdown: every open transaction rolls back
        time.sleep(2)
        postgres.start()

    rows, distinct, _ = stream_through_fault(stack, names, restart, total=20_000)
    assert (rows, distinct) == (20_000, 20_000)


def test_broker_killed_mid_stream_loses_and_doubles_nothing(
    stack: Endpoints, names: dict[str, str]
) -> None:
    """SIGKILL the broker while the service applies a stream, restart it: the service rides the
    outage out (librdkafka reconnects; the group is rejoined) and every record lands once."""
    kafka = stack.kafka
    if kafka is None:
        pytest.skip("needs the local stack's Kafka process to kill it")

    def kill_and_restart() -> None:
        kafka.kill()
        time.sleep(2)
        kafka.start()
        kafka.wait_ready(timeout=120)

    rows, distinct, applied = stream_through_fault(stack, names, kill_and_restart, total=20_000)
    assert (rows, distinct) == (20_000, 20_000)
    assert applied == 20_000


def test_offsets_are_mirrored_to_the_kafka_group_only_when_asked(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int)")
    produce(stack, names["topic"], [(i, {"id": i}) for i in range(30)])
    admin = KafkaAdmin({"bootstrap.servers": stack.bootstrap_servers})
    keys = [(names["topic"], 0), (names["topic"], 1)]

    def kafka_offsets(group: str) -> list[int]:
        return [tp.offset for tp in sorted(admin.stable_committed(group, keys),
                                           key=lambda tp: tp.partition)]  # fmt: skip

    def database_offsets(group: str) -> list[int]:
        rows = sql(stack, f"SELECT next_offset FROM {names['schema']}.offsets "
                          f"WHERE group_id = '{group}' ORDER BY partition")  # fmt: skip
        return [row[0] for row in rows]

    with running(settings_for(stack, names)):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] == 30)
    assert all(offset < 0 for offset in kafka_offsets(names["group"]))  # nothing in Kafka

    mirrored = {**names, "group": names["group"] + "-m"}
    settings = settings_for(stack, mirrored)
    settings = settings.model_copy(
        update={"consumer": settings.require_consumer().model_copy(
            update={"mirror_offsets_to_kafka": True})}
    )  # fmt: skip
    with running(settings):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] == 60)
        eventually(lambda: kafka_offsets(mirrored["group"]) == database_offsets(mirrored["group"]))
