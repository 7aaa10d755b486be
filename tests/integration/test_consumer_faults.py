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


def count(dsn: str, table: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
    assert row is not None
    return row[0], row[1]


def test_sigkill_at_random_moments_loses_and_doubles_nothing(
    stack: Endpoints, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:10]
    topic, table = f"k-{suffix}", f"k_{suffix}"
    create_topic(stack.bootstrap_servers, topic, partitions=3)
    with psycopg.connect(stack.dsn) as conn:
        conn.execute(f"CREATE TABLE {table} (id int NOT NULL, body text)")
    producer = transactional_producer(stack.bootstrap_servers)
    for start in range(0, RECORDS, 5_000):
        producer.begin_transaction()
        for i in range(start, start + 5_000):
            producer.produce(topic, value=json.dumps({"id": i, "body": "x" * 40}).encode())
        producer.commit_transaction(60)

    config = tmp_path / "bridge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                # A short session lets the group drop a killed member quickly.
                "kafka": {
                    "bootstrap_servers": stack.bootstrap_servers,
                    "properties": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
                },
                "postgres": {"dsn": stack.dsn},
                "consumer": {
                    "group_id": f"g-{suffix}",
                    "batch_max_records": 500,
                    "batch_max_wait_ms": 50,
                    "routes": [{"topic": topic, "table": f"public.{table}"}],
                },
            }
        )
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
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.2))
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(30)
        progress.append(count(stack.dsn, table)[0])
        print(f"killed at {progress[-1]} rows")
        if progress[-1] >= RECORDS:
            break

    consumer = start_consumer(config, log)
    deadline = time.monotonic() + 180
    while count(stack.dsn, table)[0] < RECORDS and time.monotonic() < deadline:
        assert consumer.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    time.sleep(1)  # a duplicate applied late would show now
    consumer.send_signal(signal.SIGTERM)
    assert consumer.wait(60) == 0, log.read_text()[-3000:]

    assert count(stack.dsn, table) == (RECORDS, RECORDS), f"rows at each kill: {progress}"
    mid_stream = [p for p in progress if 0 < p < RECORDS]
    assert len(mid_stream) >= 3, f"too few kills landed mid-stream: {progress}"
