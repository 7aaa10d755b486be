"""The consumer scaled out: three service processes in one group on a topic of 12 partitions,
joining and leaving (cleanly and by SIGKILL) while records flow, under both of Kafka's group
protocols: the classic one (cooperative-sticky) and KIP-848's (`group.protocol=consumer`). Every
record lands exactly once; the offsets table shows who held what."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import yaml
from confluent_kafka.admin import AdminClient

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import drained, produce
from tests.harness import Endpoints

pytestmark = pytest.mark.slow

PARTITIONS = 12
CHUNK = 500


class Member:
    """One `python -m consumers` process of the group."""

    def __init__(self, config: Path, log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "consumers", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")},
            )

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.process.send_signal(sig)
        code = self.process.wait(60)
        assert sig is signal.SIGKILL or code == 0, self.log.read_text()[-3000:]


def owners(dsn: str, group: str, schema: str) -> dict[int, str | None]:
    with psycopg.connect(dsn) as conn:
        try:
            rows = conn.execute(
                f"SELECT partition, owner FROM {schema}.offsets WHERE group_id = %s",
                (group,),
            ).fetchall()
        except psycopg.errors.UndefinedTable:  # the first member has not created it yet
            return {}
    return {partition: owner for partition, owner in rows}


def rows_of(dsn: str, table: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_members_join_and_leave_under_load_and_each_record_lands_once(
    stack: Endpoints, tmp_path: Path, protocol: str
) -> None:
    suffix = uuid.uuid4().hex[:10]
    topic, table, group, schema = f"s-{suffix}", f"s_{suffix}", f"g-{suffix}", f"st_{suffix}"
    create_topic(stack.bootstrap_servers, topic, partitions=PARTITIONS)
    with psycopg.connect(stack.dsn) as conn:  # no key: a record applied twice is a second row
        conn.execute(f"CREATE TABLE public.{table} (id int NOT NULL, body text)")
    # Under the classic protocol the member sets its session; under KIP-848 the broker does.
    session = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers,
                  "properties": session if protocol == "classic" else {}},
        "postgres": {"dsn": stack.dsn},
        "consumer": {"group_id": group, "state_schema": schema, "group_protocol": protocol,
                     "batch_max_records": 1000, "batch_max_wait_ms": 50,
                     "routes": [{"topic": topic, "table": f"public.{table}"}]},
    }))  # fmt: skip

    sent = 0
    feeding = threading.Event()
    feeding.set()

    def feed() -> None:
        nonlocal sent
        while feeding.is_set():
            # Keyed by id: every partition gets records, so every member has work.
            produce(stack, topic, [(i, {"id": i}) for i in range(sent, sent + CHUNK)])
            sent += CHUNK
            time.sleep(0.1)

    def wait_for(condition: str, check: Callable[[], bool], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"never: {condition}"
            time.sleep(0.3)

    def holders() -> set[str]:
        return {o.rsplit(":", 1)[1] for o in owners(stack.dsn, group, schema).values() if o}

    logs = tmp_path
    first = Member(config, logs / "first.log")
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    members = [first]
    try:
        wait_for("the first member holds all 12", lambda: len(owners(stack.dsn, group, schema))
                 == PARTITIONS and holders() == {str(first.process.pid)})  # fmt: skip
        second, third = Member(config, logs / "second.log"), Member(config, logs / "third.log")
        members += [second, third]
        pids = {str(m.process.pid) for m in members}
        wait_for("the partitions spread over three members", lambda: holders() == pids)
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        described = admin.describe_consumer_groups([group])[group].result(30)
        assert described.type.name == protocol.upper()  # the protocol asked for is the one used
        assert len(described.members) == 3

        second.stop()  # leaves cleanly: its partitions move at once
        wait_for("the second member's partitions moved",
                 lambda: str(second.process.pid) not in holders())  # fmt: skip
        third.stop(signal.SIGKILL)  # dies: its partitions move when its session expires
        wait_for("the third member's partitions moved to the first",
                 lambda: holders() == {str(first.process.pid)}, timeout=120)  # fmt: skip
    finally:
        feeding.clear()
        feeder.join(30)
    try:
        wait_for("every record applied", lambda: rows_of(stack.dsn, f"public.{table}")[0] >= sent,
                 timeout=120)  # fmt: skip
        names = {"topic": topic, "group": group, "schema": schema}
        drained(stack, names, partitions=PARTITIONS)  # a late duplicate would be counted now
        assert rows_of(stack.dsn, f"public.{table}") == (sent, sent)
    finally:
        for member in members:
            if member.process.poll() is None:
                member.stop()
