"""The consumer process killed with SIGKILL at random moments, restarted each time: every record
lands exactly once. The table has no key, so a duplicate would show as a second row."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml

from bridge.kafka_admin import create_topic
from bridge.names import DEFAULT_STATE_SCHEMA
from tests.consumer_helpers import drained
from tests.harness import Endpoints
from tests.kafka_helpers import transactional_producer

pytestmark = pytest.mark.slow

RECORDS = 100_000
KILLS = 5


def start_consumer(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "consumers", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")},
        )


def write_config(
    path: Path, stack: Endpoints, *, group: str, topic: str, table: str, batch: int
) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                # A short session lets the group drop a killed or paused member quickly.
                "kafka": {
                    "bootstrap_servers": stack.bootstrap_servers,
                    "properties": {
                        "session.timeout.ms": 6000,
                        "heartbeat.interval.ms": 1000,
                        **stack.properties("consumer", resolved=False),
                    },
                },
                # The consumer's own principal and role on a secured stack.
                "postgres": {"dsn": stack.role_dsn("consumer")},
                "consumer": {
                    "group_id": group,
                    "batch_max_records": batch,
                    "batch_max_wait_ms": 50,
                    "routes": [{"topic": topic, "table": f"public.{table}"}],
                },
            }
        )
    )
    return path


def count(dsn: str, table: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.secured
def test_sigkill_at_random_moments_loses_and_doubles_nothing(
    stack: Endpoints, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:10]
    topic, table = f"k-{suffix}", f"k_{suffix}"
    create_topic(stack.bootstrap_servers, topic, partitions=3, config=stack.properties())
    with psycopg.connect(stack.dsn) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id int NOT NULL, body text)")
    stack.let_consumer_write(f"public.{table}")
    producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
    for start in range(0, RECORDS, 5_000):
        producer.begin_transaction()
        for i in range(start, start + 5_000):
            producer.produce(topic, value=json.dumps({"id": i, "body": "x" * 40}).encode())
        producer.commit_transaction(60)

    config = write_config(
        tmp_path / "bridge.yaml", stack, group=f"g-{suffix}", topic=topic, table=table, batch=500
    )
    log = tmp_path / "consumer.log"
    rng = random.Random(suffix)  # noqa: S311 - timing jitter, not secrets
    progress = []
    for _ in range(KILLS):
        consumer = start_consumer(config, log)
        # Kill somewhere between start-up and the middle of the stream.
        deadline = time.monotonic() + 30
        before = count(stack.dsn, table)[0]
        while count(stack.dsn, table)[0] == before and time.monotonic() < deadline:
            time.sleep(0.01)
        # A batch of 500 takes a few milliseconds: a short jitter still lands anywhere in its
        # cycle, and leaves most of the stream for the next lives.
        time.sleep(rng.uniform(0.0, 0.05))
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(30)
        progress.append(count(stack.dsn, table)[0])
        print(f"killed at {progress[-1]} rows")
        if progress[-1] >= RECORDS:
            break

    lives = log.read_text().count('"consumer started"')
    consumer = start_consumer(config, log)
    deadline = time.monotonic() + 180
    while count(stack.dsn, table)[0] < RECORDS and time.monotonic() < deadline:
        assert consumer.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    # Its SIGTERM handler is in place once it has started (the stream may be done already).
    while log.read_text().count('"consumer started"') == lives and time.monotonic() < deadline:
        time.sleep(0.05)
    # Drained to the end of the log: a duplicate applied late would be counted by now.
    names = {"topic": topic, "group": f"g-{suffix}", "schema": DEFAULT_STATE_SCHEMA}
    drained(stack, names, partitions=3)
    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait(60) == 0, log.read_text()[-3000:]

    assert count(stack.dsn, table) == (RECORDS, RECORDS), f"rows at each kill: {progress}"
    mid_stream = [p for p in progress if 0 < p < RECORDS]
    assert len(mid_stream) >= 3, f"too few kills landed mid-stream: {progress}"


# What a woken zombie logs once it has met the successor's claim (consumers.batch.committer,
# consumers.batch.lifecycle, consumers.membership.leases).
_MET_THE_SUCCESSOR = (
    "offset lease refused",
    "partitions taken by another owner",
    '"message": "assigned [',
)


def test_zombie_woken_after_its_partitions_moved_commits_nothing(
    stack: Endpoints, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:10]
    topic, table, group = f"z-{suffix}", f"z_{suffix}", f"g-{suffix}"
    records = 20_000
    create_topic(stack.bootstrap_servers, topic, partitions=2)
    with psycopg.connect(stack.dsn) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id int NOT NULL, body text)")

    def feed(start: int, stop: int) -> None:
        producer = transactional_producer(stack.bootstrap_servers)
        producer.begin_transaction()
        for i in range(start, stop):
            producer.produce(topic, value=json.dumps({"id": i, "body": "z"}).encode())
        producer.commit_transaction(60)

    feed(0, records)
    config = write_config(
        tmp_path / "bridge.yaml", stack, group=group, topic=topic, table=table, batch=200
    )
    zombie_log, successor_log = tmp_path / "zombie.log", tmp_path / "successor.log"
    zombie = start_consumer(config, zombie_log)
    deadline = time.monotonic() + 60
    while count(stack.dsn, table)[0] == 0:
        assert time.monotonic() < deadline, zombie_log.read_text()[-3000:]
        time.sleep(0.02)
    zombie.send_signal(signal.SIGSTOP)  # paused mid-stream, batch in hand, past its session
    paused_at = count(stack.dsn, table)[0]

    successor = start_consumer(config, successor_log)
    try:
        deadline = time.monotonic() + 120
        while count(stack.dsn, table)[0] < records:
            assert successor.poll() is None, successor_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the successor never took the partitions over"
            time.sleep(0.2)
        with psycopg.connect(stack.dsn) as conn:
            owners = conn.execute(
                "SELECT owner FROM bridge.offsets WHERE group_id = %s", (group,)
            ).fetchall()
        assert {o[0].rsplit(":", 1)[1] for o in owners} == {str(successor.pid)}, owners

        woke_at = zombie_log.stat().st_size
        zombie.send_signal(signal.SIGCONT)  # wakes up with its stale batch and stale epoch
        # A sign that it ran into the successor's claim: its stale batch refused, or its
        # partitions revoked and a share of them assigned again when it rejoined the group.
        deadline = time.monotonic() + 60
        while not any(sign in zombie_log.read_text()[woke_at:] for sign in _MET_THE_SUCCESSOR):
            assert zombie.poll() is None, zombie_log.read_text()[-3000:]
            assert time.monotonic() < deadline, zombie_log.read_text()[woke_at:][-3000:]
            time.sleep(0.1)
        assert count(stack.dsn, table) == (records, records), "the zombie committed its batch"
        feed(records, records + 2_000)  # and the group, zombie included, keeps going exactly
        deadline = time.monotonic() + 60
        while count(stack.dsn, table)[0] < records + 2_000 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
    finally:
        for process in (zombie, successor):
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
        for process in (zombie, successor):
            process.wait(60)

    assert count(stack.dsn, table) == (records + 2_000, records + 2_000)
    print(f"zombie paused at {paused_at} rows; its log after waking:")
    print(zombie_log.read_text()[-1500:])
