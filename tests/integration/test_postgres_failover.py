"""A PostgreSQL primary SIGKILLed under load and its streaming standby promoted, with
synchronous and with asynchronous replication: the consumer follows the multi-host DSN
(`target_session_attrs=read-write`) to the new primary and every id is in the table once.

With asynchronous replication the new primary lacks commits the old one acknowledged: rows and
offsets together, so the consumer finds its offsets behind what it committed and applies those
records again from Kafka. To make that window certain rather than a matter of timing, the
primary's WAL sender is paused (SIGSTOP) before the last batches, as a lagging link would hold
them, and SIGKILLed with the primary. With synchronous replication the same pause holds the
COMMIT until the primary dies: it was never acknowledged, and nothing acknowledged is lost.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bridge.kafka_admin import create_topic
from bridge.names import POSTGRES_DATABASE, POSTGRES_USER
from bridge_shell.stack.postgres import PostgresServer
from bridge_shell.stack.process import free_port
from tests.consumer_helpers import drained, eventually, produce, running, settings_for, sql
from tests.epoch_helpers import HandSink, Reader, published, reading
from tests.harness import Endpoints

pytestmark = pytest.mark.slow

CHUNK, CHUNKS = 1_000, 20
TOTAL = CHUNK * CHUNKS
PAUSED_AT = CHUNKS // 2  # the chunk produced while the standby receives nothing


@pytest.fixture
def replicated() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A primary and its streaming standby, of this test's own: the test kills the primary."""
    # Under /tmp, reachable by the `postgres` user the servers run as when we are root.
    home = Path(tempfile.mkdtemp(prefix="bridge-test-failover-"))
    home.chmod(0o755)
    primary = PostgresServer(home=home / "primary", port=free_port())
    standby = PostgresServer(home=home / "standby", port=free_port())
    try:
        primary.start()
        standby.follow(primary)
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()
        shutil.rmtree(home, ignore_errors=True)


def multi_host_dsn(*servers: PostgresServer) -> str:
    hosts = ",".join(f"127.0.0.1:{server.port}" for server in servers)
    return (
        f"postgresql://{POSTGRES_USER}@{hosts}/{POSTGRES_DATABASE}?target_session_attrs=read-write"
    )


def rows_in(dsn: str, table: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def wal_sender(primary: PostgresServer) -> int:
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_replication").fetchone()
    assert row is not None, "no standby streams from the primary"
    return int(row[0])


def waiting_for_the_standby(primary: PostgresServer) -> bool:
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "asynchronous"])
def test_the_primary_killed_and_its_standby_promoted_loses_and_doubles_nothing(
    stack: Endpoints,
    names: dict[str, str],
    replicated: tuple[PostgresServer, PostgresServer],
    synchronous: bool,
) -> None:
    primary, standby = replicated
    primary.replicate_synchronously(synchronous)
    expected_sync = "sync" if synchronous else "async"
    eventually(lambda: ("streaming", expected_sync) in primary.replication())
    failover = Endpoints(
        bootstrap_servers=stack.bootstrap_servers,
        dsn=multi_host_dsn(primary, standby),
        origin="a primary and its standby",
    )
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    sql(failover, f"CREATE TABLE public.{names['table']} (id int NOT NULL)")

    table = f"public.{names['table']}"

    def chunk(n: int) -> None:
        ids = range(n * CHUNK, (n + 1) * CHUNK)
        produce(stack, names["topic"], [(None, {"id": i}) for i in ids])

    with running(settings_for(failover, names)) as service:
        for n in range(PAUSED_AT):
            chunk(n)
        eventually(lambda: service.applied_total == PAUSED_AT * CHUNK, timeout=120)
        sender = wal_sender(primary)
        os.kill(sender, signal.SIGSTOP)
        try:
            chunk(PAUSED_AT)
            if synchronous:  # the COMMIT waits for a standby that receives nothing
                eventually(lambda: waiting_for_the_standby(primary))
            else:  # acknowledged by the primary alone
                eventually(lambda: service.applied_total == (PAUSED_AT + 1) * CHUNK)
            acknowledged = service.applied_total
            primary.kill()
        finally:
            os.kill(sender, signal.SIGKILL)  # what it holds never reaches the standby
        standby.promote()
        on_the_new_primary = rows_in(standby.dsn, table)
        for n in range(PAUSED_AT + 1, CHUNKS):
            chunk(n)
        eventually(lambda: rows_in(failover.dsn, table) >= TOTAL, timeout=180)
        drained(failover, names, partitions=3)  # a late duplicate would show after this

    rows, distinct = sql(failover, f"SELECT count(*), count(DISTINCT id) FROM {names['table']}")[0]
    assert (rows, distinct) == (TOTAL, TOTAL)
    lost = acknowledged - on_the_new_primary  # rows of acknowledged commits it lacked
    reapplied = service.applied_total - TOTAL  # records applied twice: once on each primary
    if synchronous:
        assert (lost, reapplied) == (0, 0)
    else:
        assert lost == CHUNK, (acknowledged, on_the_new_primary)
        assert reapplied == lost


@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "asynchronous"])
def test_whole_epochs_through_a_failover_lose_double_and_show_nothing_partial(
    stack: Endpoints,
    names: dict[str, str],
    replicated: tuple[PostgresServer, PostgresServer],
    synchronous: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Epochs of 3 tasks over two topics, with whole epochs: the primary is killed with epoch 4
    committed by it alone (asynchronous) or waiting for its standby (synchronous). A reader of
    whichever server is primary never sees part of an epoch; on the promoted standby the epoch
    the old primary lost is published again, from Kafka, and every id is in its table once."""
    # The member's INFO lines in the report of a failure: once, on a loaded machine, epochs 5
    # to 7 were not published within 180 s after the failover, and its WARNINGs said nothing.
    caplog.set_level(logging.INFO, logger="bridge.consumer")
    primary, standby = replicated
    primary.replicate_synchronously(synchronous)
    expected_sync = "sync" if synchronous else "async"
    eventually(lambda: ("streaming", expected_sync) in primary.replication())
    failover = Endpoints(
        bootstrap_servers=stack.bootstrap_servers,
        dsn=multi_host_dsn(primary, standby),
        origin="a primary and its standby",
    )
    suffix = uuid.uuid4().hex[:8]
    topics, manifest = [f"fo-a-{suffix}", f"fo-b-{suffix}"], f"fo-epochs-{suffix}"
    tables = [f"public.fo_a_{suffix}", f"public.fo_b_{suffix}"]
    for topic in topics:
        create_topic(stack.bootstrap_servers, topic, partitions=3)
    create_topic(stack.bootstrap_servers, manifest, partitions=1)
    for table in tables:
        sql(failover, f"CREATE TABLE {table} (id bigint PRIMARY KEY, epoch_no int)")
    tasks, per_task, epochs = 3, 60, 8
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=manifest, query=query)

    def write(epoch: int) -> None:
        for task in range(tasks):
            records = []
            for i in range(per_task):
                record_id = (epoch * tasks + task) * per_task + i
                value = f'{{"id": {record_id}, "epoch_no": {epoch}}}'.encode()
                records.append((topics[i % 2], record_id % 3, None, value))
            sink.task(epoch, task, records)
        sink.commit(epoch, list(range(tasks)))

    def settled() -> int:
        return published(failover.dsn, names["schema"], query)

    config = settings_for(failover, names, consumer={
        "routes": [{"topic": t, "table": table, "epochs": "whole"}
                   for t, table in zip(topics, tables, strict=True)],
        "epochs_topic": manifest,
    })  # fmt: skip
    reader = Reader(failover.dsn, tables, dict.fromkeys(range(epochs), tasks * per_task))
    with running(config), reading(reader, reconnect=True):
        for epoch in range(4):
            write(epoch)
        eventually(lambda: settled() == 4, timeout=120)
        sender = wal_sender(primary)
        os.kill(sender, signal.SIGSTOP)
        try:
            write(4)
            if synchronous:  # the batch's COMMIT waits for a standby that receives nothing
                eventually(lambda: waiting_for_the_standby(primary))
            else:  # published on the primary alone
                eventually(lambda: settled() == 5)
            primary.kill()
        finally:
            os.kill(sender, signal.SIGKILL)  # what it holds never reaches the standby
        standby.promote()
        assert published(standby.dsn, names["schema"], query) == 4  # epoch 4 is not there
        for epoch in range(5, epochs):
            write(epoch)
        eventually(lambda: settled() == epochs, timeout=180)
    assert reader.partial == [], f"part of an epoch seen: {reader.partial[:5]}"
    assert reader.polls > 50
    for table in tables:
        rows, distinct = sql(failover, f"SELECT count(*), count(DISTINCT id) FROM {table}")[0]
        assert rows == distinct == epochs * tasks * per_task // 2
