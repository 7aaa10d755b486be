"""The write modes on the real stack: what each leaves in the table for the same records (a key
already there, a key twice in a batch, a column a record lacks, a tombstone), their bulk path,
the records they skip counted, and each under a consumer SIGKILLed in a loop: no record lost,
no batch applied twice, and `replace` never leaves a key absent after a commit."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from bridge.errors import ConfigError
from bridge.kafka_admin import create_topic
from bridge.names import OFFSETS_TABLE
from consumers.service import ConsumerService
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
from tests.integration.test_consumer_faults import start_consumer

SKIPPED = "bridge_consumer_records_skipped_total"


@pytest.fixture
def table(stack: Endpoints, names: dict[str, str]) -> str:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, note text, "
               f"extra text NOT NULL DEFAULT 'd', n integer)")  # fmt: skip
    # A key there before, and one a tombstone deletes.
    sql(stack, f"INSERT INTO {table} VALUES (1, 'old', 'kept', 5), (3, 'gone', 'kept', 3)")
    return table


@pytest.mark.parametrize(
    ("mode", "rows", "skipped"),
    [
        # The record's columns merged into the row; a lacking column stays as it was.
        ("upsert", [(1, "new", "kept", 5), (2, "b", "d", None)], 0),
        # The row deleted and the record inserted: a lacking column takes its default or NULL.
        ("replace", [(1, "new", "d", None), (2, "b", "d", None)], 0),
        # The first record of a key, only where the key is absent: key 1's record and key 2's
        # second are skipped.
        ("insert_if_absent", [(1, "old", "kept", 5), (2, "a", "d", None)], 2),
        # Only rows there: key 2's record (the last of the two) is skipped.
        ("update", [(1, "new", "kept", 5)], 1),
    ],
)
def test_each_mode_writes_what_it_promises(
    stack: Endpoints, names: dict[str, str], table: str,
    mode: str, rows: list[tuple[Any, ...]], skipped: int,
) -> None:  # fmt: skip
    records = [({"id": 1}, {"id": 1, "note": "new"}), ({"id": 2}, {"id": 2, "note": "a"}),
               ({"id": 2}, {"id": 2, "note": "b"}), ({"id": 3}, None)]  # fmt: skip
    produce(stack, names["topic"], records)
    settings = settings_for(stack, names, mode=mode, key_columns=["id"])
    with running(settings) as service:
        drained(stack, names, 1)
        assert sample(service, SKIPPED, topic=names["topic"]) == skipped
        assert dead_letters(stack, names, names["topic"]) == 0
    assert sql(stack, f"SELECT id, note, extra, n FROM {table} ORDER BY id") == rows


@pytest.mark.parametrize(
    ("mode", "rows"),
    [
        # Written from the record-by-record contract (docs/routes.md), not from the code:
        # key 1 deleted, then written afresh (its lacking columns take default and NULL); key 2's
        # second record leaves `n` as its first set it; key 3 written, then deleted.
        ("upsert", [(1, "t-2", "d", None), (2, "x", "d", 55)]),
        ("replace", [(1, "t-2", "d", None), (2, "x", "d", None)]),
        ("insert_if_absent", [(1, "t-2", "d", None), (2, None, "d", 55)]),
        # Key 1's record finds its row deleted, key 2 has none, key 3's is deleted after.
        ("update", []),
    ],
)
def test_one_batch_leaves_the_table_its_records_would_one_by_one(
    stack: Endpoints, names: dict[str, str], table: str, mode: str, rows: list[tuple[Any, ...]]
) -> None:
    """A tombstone then a record of the same key, and two records of a new key the second of
    which lacks a column, in one transaction, so that one batch holds them."""
    records = [({"id": 1}, None), ({"id": 2}, {"id": 2, "n": 55}),
               ({"id": 3}, {"id": 3, "note": "y"}), ({"id": 1}, {"id": 1, "note": "t-2"}),
               ({"id": 2}, {"id": 2, "note": "x"}), ({"id": 3}, None)]  # fmt: skip
    produce(stack, names["topic"], records)
    with running(settings_for(stack, names, mode=mode, key_columns=["id"])):
        drained(stack, names, 1)
    assert sql(stack, f"SELECT id, note, extra, n FROM {table} ORDER BY id") == rows


@pytest.mark.parametrize("mode", ["upsert", "replace", "insert_if_absent", "update"])
def test_each_mode_has_a_bulk_path_with_keys_repeated_across_batches(
    stack: Endpoints, names: dict[str, str], table: str, mode: str
) -> None:
    # 2,000 records over keys 0..499, each key four times, in batches of 300: a key repeats
    # inside batches and across them. Keys 0..249 are in the table before.
    sql(stack, f"DELETE FROM {table}")
    sql(stack, f"INSERT INTO {table} SELECT i, 'seed', 'kept', -1 FROM generate_series(0, 249) i")
    produce(stack, names["topic"], [(None, {"id": i % 500, "n": i}) for i in range(2000)])
    settings = settings_for(
        stack, names, consumer={"batch_max_records": 300}, mode=mode, key_columns=["id"]
    )
    with running(settings) as service:
        drained(stack, names, 1)
        skipped = sample(service, SKIPPED, topic=names["topic"])
    found = sql(stack, f"SELECT id, n, extra FROM {table} ORDER BY id")
    last = {i: 1500 + i for i in range(500)}  # each key's last record
    first = {i: i for i in range(500)}  # and its first
    expected = {
        "upsert": [(i, last[i], "kept" if i < 250 else "d") for i in range(500)],
        "replace": [(i, last[i], "d") for i in range(500)],
        "insert_if_absent": [
            (i, -1 if i < 250 else first[i], "kept" if i < 250 else "d") for i in range(500)
        ],
        "update": [(i, last[i], "kept") for i in range(250)],
    }[mode]
    assert found == expected
    if mode == "insert_if_absent":  # every record but the first of each absent key
        assert skipped == 2000 - 250
    elif mode == "update":  # at least the last record of each absent key; superseded ones not
        assert 250 <= skipped <= 1000
    else:
        assert skipped == 0


def test_keyed_modes_are_refused_at_start_without_what_they_need(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint, note text)")  # no unique key
    for mode in ("replace", "insert_if_absent", "update"):
        with pytest.raises(ConfigError, match=rf"consumer\.routes\.0.*mode '{mode}' needs key_"):
            settings_for(stack, names, mode=mode)
    for mode in ("insert_if_absent", "update"):
        with pytest.raises(ConfigError) as refused:
            ConsumerService(settings_for(stack, names, mode=mode, key_columns=["id"])).start()
        assert refused.value.problems == [
            ("consumer.routes.0.key_columns",
             f"{table} has no primary key or unique constraint on (id), which {mode} needs"),
        ]  # fmt: skip
    # replace goes by the key without a unique constraint: every row of the key is replaced.
    with running(settings_for(stack, names, mode="replace", key_columns=["id"])):
        pass


KEYS = 400
RECORDS = 20_000
KILLS = 4


def _audited(stack: Endpoints, table: str) -> None:
    """Every row a transaction writes (inserted or updated), recorded by a trigger: a batch
    applied twice shows as the same (id, n) twice."""
    sql(stack, f"CREATE TABLE {table}_audit (id bigint, n integer)")
    sql(stack, f"""CREATE FUNCTION {table}_audit() RETURNS trigger LANGUAGE plpgsql
        SECURITY DEFINER AS $$ BEGIN INSERT INTO {table}_audit VALUES (NEW.id, NEW.n);
        RETURN NEW; END $$""")  # fmt: skip
    sql(stack, f"CREATE TRIGGER audit AFTER INSERT OR UPDATE ON {table} FOR EACH ROW "
               f"EXECUTE FUNCTION {table}_audit()")  # fmt: skip


def _config(path: Path, stack: Endpoints, names: dict[str, str], mode: str) -> Path:
    settings = {
        # A short session lets the group drop a killed member quickly.
        "kafka": {"bootstrap_servers": stack.bootstrap_servers,
                  "properties": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                                 **stack.properties("consumer", resolved=False)}},
        "postgres": {"dsn": stack.role_dsn("consumer")},
        "consumer": {
            "group_id": names["group"], "state_schema": names["schema"],
            # Small batches: at full speed the whole stream takes some 50 ms in batches of 500,
            # too short for the kills to land in it on an idle machine; in batches of 50 it takes
            # seconds.
            "batch_max_records": 50, "batch_max_wait_ms": 50,
            "routes": [{"topic": names["topic"], "table": f"public.{names['table']}",
                        "mode": mode, "key_columns": ["id"]}],
        },
    }  # fmt: skip
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["upsert", "replace", "insert_if_absent", "update"])
def test_each_mode_under_a_sigkill_loop_loses_nothing_and_applies_nothing_twice(
    stack: Endpoints, names: dict[str, str], tmp_path: Path, mode: str
) -> None:
    table = f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, n integer, "
               f"extra text NOT NULL DEFAULT 'd')")  # fmt: skip
    seeded = 0 if mode == "insert_if_absent" else KEYS if mode != "update" else KEYS // 2
    sql(stack, f"INSERT INTO {table} SELECT i, -1, 'seed' FROM generate_series(0, {seeded - 1}) i")
    _audited(stack, table)
    for start in range(0, RECORDS, 5000):
        produce(stack, names["topic"], [({"id": i % KEYS}, {"id": i % KEYS, "n": i})
                                        for i in range(start, start + 5000)])  # fmt: skip
    config = _config(tmp_path / "bridge.yaml", stack, names, mode)
    log = tmp_path / "consumer.log"
    rng = random.Random(names["topic"])  # noqa: S311 - timing jitter, not secrets
    absent_seen = []
    at_kills: list[int] = []  # records committed at each kill

    def progress() -> int:  # from the offsets table: insert_if_absent writes few rows
        try:
            offsets = f"{names['schema']}.{OFFSETS_TABLE}"
            return int(sql(stack, f"SELECT coalesce(sum(next_offset), 0) FROM {offsets}")[0][0])
        except psycopg.errors.UndefinedTable:  # before the first consumer made it
            return 0

    for _ in range(KILLS):
        consumer = start_consumer(config, log)
        before, deadline = progress(), time.monotonic() + 60
        while progress() == before and time.monotonic() < deadline:
            if mode == "replace":  # every key is there in every committed state
                absent_seen.append(KEYS - sql(stack, f"SELECT count(*) FROM {table}")[0][0])
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.05))
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(30)
        at_kills.append(progress())
    lives = log.read_text().count('"consumer started"')
    consumer = start_consumer(config, log)
    try:
        drained(stack, names, 2, timeout=120)
        # Its SIGTERM handler is in place once it has started (the stream may be done already).
        eventually(lambda: log.read_text().count('"consumer started"') > lives)
    finally:
        consumer.send_signal(signal.SIGTERM)
        assert consumer.wait(60) == 0, log.read_text()[-3000:]

    # Each key's records are spread over the two partitions by its Kafka key: one partition a
    # key, so "last" and "first" are the last and first of its records.
    last = {k: RECORDS - KEYS + k for k in range(KEYS)}
    expected = {
        "upsert": [(k, last[k]) for k in range(KEYS)],
        "replace": [(k, last[k]) for k in range(KEYS)],
        "insert_if_absent": [(k, k) for k in range(KEYS)],
        "update": [(k, last[k]) for k in range(KEYS // 2)],
    }[mode]
    assert sql(stack, f"SELECT id, n FROM {table} ORDER BY id") == expected
    doubled = sql(stack, f"SELECT id, n, count(*) FROM {table}_audit WHERE n >= 0 "
                         f"GROUP BY 1, 2 HAVING count(*) > 1")  # fmt: skip
    assert doubled == [], "a batch was applied twice"
    assert len({p for p in at_kills if 0 < p < RECORDS}) >= 2, f"kills at {at_kills}"
    assert set(absent_seen) <= {0}, "replace left a key absent after a commit"
    if mode == "replace":
        assert sql(stack, f"SELECT DISTINCT extra FROM {table}") == [("d",)]
