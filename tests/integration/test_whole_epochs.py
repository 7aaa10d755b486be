"""Whole epochs on the real broker and database: a reader polling the tables never sees part of
an epoch when its route wants whole epochs, through two members, a rebalance between staging and
publishing, and a member killed while it publishes; and it does see parts on the per-partition
mode, the same run otherwise. Every record lands exactly once either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import yaml
from confluent_kafka import OFFSET_END, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bridge.epoch_manifest import Part, key_of
from bridge.kafka_admin import create_topic
from bridge.names import (
    CONSUMER_APPLICATION_PREFIX,
    EPOCH_PARTS_TABLE,
    EPOCHS_TABLE,
    METRIC_EPOCHS_OWNER,
    OFFSETS_TABLE,
)
from bridge.settings import BridgeSettings
from consumers.database.offsets.store import application_name
from consumers.membership.manifest_start import LOOKBACK_S
from consumers.service import ConsumerService
from tests.consumer_helpers import (
    dead_letters,
    eventually,
    http_get,
    plain_config,
    produce,
    running,
    sample,
    settings_for,
    sql,
)
from tests.epoch_helpers import HandSink, Reader, polling, published, reading, staged
from tests.harness import Endpoints
from tests.integration.test_operator_tools import bridge
from tests.integration.test_status import status
from tests.kafka_helpers import transactional_producer

PARTITIONS = 4
TASKS = 3


@pytest.fixture
def pipeline(stack: Endpoints, names: dict[str, str]) -> dict[str, Any]:
    """Two topics of 4 partitions, their tables (an epoch's rows spread over both), and a
    manifest topic of this test's own."""
    suffix = uuid.uuid4().hex[:8]
    topics = [f"we-a-{suffix}", f"we-b-{suffix}"]
    tables = [f"we_a_{suffix}", f"we_b_{suffix}"]
    manifest = f"we-epochs-{suffix}"
    for topic in topics:
        create_topic(stack.bootstrap_servers, topic, partitions=PARTITIONS)
    create_topic(stack.bootstrap_servers, manifest, partitions=1)
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        for table in tables:
            conn.execute(f"CREATE TABLE public.{table} (id bigint PRIMARY KEY, epoch_no int)")
            conn.execute(f"GRANT ALL ON public.{table} TO PUBLIC")
    return {"topics": topics, "tables": [f"public.{t}" for t in tables], "manifest": manifest}


def settings(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], epochs: str, **consumer: Any
) -> Any:
    routes = [
        {"topic": topic, "table": table, "epochs": epochs}
        for topic, table in zip(pipeline["topics"], pipeline["tables"], strict=True)
    ]
    return settings_for(
        stack,
        names,
        consumer={"routes": routes, "epochs_topic": pipeline["manifest"], **consumer},
    )


def epoch_records(
    pipeline: dict[str, Any], epoch: int, task: int, per_task: int
) -> list[tuple[str, int, bytes | None, bytes | None]]:
    """A task's records: ids unique over the run, spread over both topics and all partitions."""
    records: list[tuple[str, int, bytes | None, bytes | None]] = []
    for i in range(per_task):
        record_id = (epoch * TASKS + task) * per_task + i
        topic = pipeline["topics"][i % 2]
        value = f'{{"id": {record_id}, "epoch_no": {epoch}}}'.encode()
        records.append((topic, record_id % PARTITIONS, None, value))
    return records


def write_epoch(sink: HandSink, pipeline: dict[str, Any], epoch: int, per_task: int) -> None:
    """Each of the TASKS tasks of `epoch`, then its record: an epoch the driver committed."""
    for task in range(TASKS):
        sink.task(epoch, task, epoch_records(pipeline, epoch, task, per_task))
    sink.commit(epoch, list(range(TASKS)))


def counts(stack: Endpoints, pipeline: dict[str, Any]) -> tuple[int, int]:
    with psycopg.connect(stack.dsn) as conn:
        total = distinct = 0
        for table in pipeline["tables"]:
            row = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
            assert row is not None
            total, distinct = total + row[0], distinct + row[1]
    return total, distinct


def visible(stack: Endpoints, pipeline: dict[str, Any], epoch: int) -> int:
    with psycopg.connect(stack.dsn) as conn:
        return sum(
            conn.execute(f"SELECT count(*) FROM {t} WHERE epoch_no = %s", (epoch,)).fetchone()[0]  # type: ignore[index]
            for t in pipeline["tables"]
        )


def test_the_per_partition_mode_shows_a_reader_part_of_an_epoch(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """The reader's check can fail: one task of an epoch committed, its rows are visible alone."""
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=f"q-{uuid.uuid4()}")
    per_task = 40
    reader = Reader(stack.dsn, pipeline["tables"], {1: TASKS * per_task})
    with running(settings(stack, names, pipeline, "per-partition")), reading(reader):
        sink.task(1, 0, epoch_records(pipeline, 1, 0, per_task))
        # The reader's own poll sees the first task's rows alone before the others are written.
        eventually(lambda: (1, per_task) in reader.partial)
        for task in range(1, TASKS):
            sink.task(1, task, epoch_records(pipeline, 1, task, per_task))
        sink.commit(1, list(range(TASKS)))
        eventually(lambda: visible(stack, pipeline, 1) == TASKS * per_task)
    assert (1, per_task) in reader.partial
    assert counts(stack, pipeline) == (TASKS * per_task, TASKS * per_task)


def test_two_members_publish_each_epoch_whole_through_a_rebalance(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task, epochs = 30, 6
    reader = Reader(stack.dsn, pipeline["tables"], dict.fromkeys(range(epochs), TASKS * per_task))
    # Both members read the whole topics (`all`): the staging path, with a member leaving.
    config = settings(stack, names, pipeline, "whole", epochs_members="all")
    with running(config), reading(reader):
        with running(config):
            for epoch in range(epochs):
                for task in range(TASKS):
                    sink.task(epoch, task, epoch_records(pipeline, epoch, task, per_task))
                    if epoch == 1 and task == 0:
                        # Staged, committed with its offsets, and not visible.
                        eventually(lambda: staged(stack.dsn, names["schema"], query, 1) == per_task)
                        assert visible(stack, pipeline, 1) == 0
                if epoch == 3:
                    break  # the second member leaves between staging and publishing
                sink.commit(epoch, list(range(TASKS)))
        sink.commit(3, list(range(TASKS)))
        for epoch in range(4, epochs):
            for task in range(TASKS):
                sink.task(epoch, task, epoch_records(pipeline, epoch, task, per_task))
            sink.commit(epoch, list(range(TASKS)))
        eventually(lambda: published(stack.dsn, names["schema"], query) == epochs)
    assert reader.partial == [], f"part of an epoch seen: {reader.partial[:5]}"
    assert reader.polls > 50
    assert counts(stack, pipeline) == (epochs * TASKS * per_task,) * 2


def test_the_publishers_idle_session_ended_by_the_server_is_not_reported_as_a_failure(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """A restart or an operator ends every session of the group while nothing flows: the
    publisher's next look opens a new one, and `/readyz` never says an epoch cannot be
    published (it did until that session answered again, a second later)."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    with running(settings(stack, names, pipeline, "whole")) as service:
        for task in range(TASKS):
            sink.task(0, task, epoch_records(pipeline, 0, task, 10))
        sink.commit(0, list(range(TASKS)))
        eventually(lambda: published(stack.dsn, names["schema"], query) == 1)
        eventually(lambda: service.ready)
        sessions = f"{CONSUMER_APPLICATION_PREFIX}{names['group']}"
        sql(stack, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                   f"WHERE application_name = '{sessions}'")  # fmt: skip
        reasons: set[str] = set()
        turned, sampled = service.turns, threading.Event()
        deadline = time.monotonic() + 60
        while service.turns < turned + 200:  # looks every 0.2 s: several after the restart
            assert time.monotonic() < deadline, "the member's loop stopped turning"
            reasons |= {r for r in service.not_ready() if "cannot be published" in r}
            sampled.wait(0.005)  # sampling what must never show, not waiting for it
        for task in range(TASKS):
            sink.task(1, task, epoch_records(pipeline, 1, task, 10))
        sink.commit(1, list(range(TASKS)))
        eventually(lambda: published(stack.dsn, names["schema"], query) == 2)
    assert reasons == set()


@pytest.mark.parametrize("members", ["one", "all"])
def test_a_querys_epoch_never_overtakes_an_earlier_querys_records_in_a_partition(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], members: str
) -> None:
    """A backfill query writes the keys (its epoch record late, as a driver's replay brings
    it), and a second query then updates every key, its epoch whole at once. Published first,
    the second's rows would be overwritten by the backfill's earlier ones when it completes:
    it waits, and the tables end as the records one by one leave them (the second's values).
    With one member the backfill's records are held, then staged past the hold; with `all`
    they are staged."""
    backfill = HandSink(stack, manifest_topic=pipeline["manifest"], query=f"a-{uuid.uuid4()}")
    update = HandSink(stack, manifest_topic=pipeline["manifest"], query=f"0-{uuid.uuid4()}")
    keys = 48

    def rows(marker: int) -> list[tuple[str, int, bytes | None, bytes | None]]:
        return [
            (pipeline["topics"][i % 2], i % PARTITIONS, str(i).encode(),
             f'{{"id": {i}, "epoch_no": {marker}}}'.encode())
            for i in range(keys)
        ]  # fmt: skip

    routes = [{"topic": t, "table": table, "epochs": "whole", "mode": "upsert",
               "key_columns": ["id"]}
              for t, table in zip(pipeline["topics"], pipeline["tables"], strict=True)]  # fmt: skip
    config = settings_for(stack, names, consumer={
        "routes": routes, "epochs_topic": pipeline["manifest"], "epochs_members": members,
        "epochs_hold_ms": 1_000,
    })  # fmt: skip
    with running(config), running(config) if members == "all" else nullcontext():
        backfill.task(0, 0, rows(1))
        eventually(lambda: staged(stack.dsn, names["schema"], backfill.query, 0) == keys)
        update.task(0, 0, rows(2))
        update.commit(0, [0])
        eventually(lambda: staged(stack.dsn, names["schema"], update.query, 0) == keys)
        assert published(stack.dsn, names["schema"], update.query) == 0  # it waits
        assert counts(stack, pipeline) == (0, 0)
        backfill.commit(0, [0])
        eventually(lambda: published(stack.dsn, names["schema"], update.query) == 1)
        assert published(stack.dsn, names["schema"], backfill.query) == 1
    assert counts(stack, pipeline) == (keys, keys)
    markers = sql(stack, " UNION ALL ".join(
        f"SELECT epoch_no, count(*) FROM {t} GROUP BY epoch_no" for t in pipeline["tables"]
    ))  # fmt: skip
    assert {int(m) for m, _ in markers} == {2}, markers


def test_by_default_a_group_shares_another_producers_records_until_its_first_epoch(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """Routes that do not say `epochs` (whole by default), two members: records without the
    sink's provenance go to their tables as their batches commit, the partitions spread over
    both members, no lock held and no dead letter; from the sink's first epoch, the members
    share out its query (one unit: both topics), one of them reads it, every epoch is published
    whole, and other records still land."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    routes = [{"topic": t, "table": table}
              for t, table in zip(pipeline["topics"], pipeline["tables"], strict=True)]  # fmt: skip
    config = settings_for(
        stack, names, consumer={"routes": routes, "epochs_topic": pipeline["manifest"]}
    )
    per_task, epochs, others = 30, 4, 200
    reader = Reader(stack.dsn, pipeline["tables"], dict.fromkeys(range(epochs), TASKS * per_task))

    def another_producers(first: int) -> None:
        for topic in pipeline["topics"]:
            produce(stack, topic, [(f"k{i}", {"id": first + i, "epoch_no": -1})
                                   for i in range(others)])  # fmt: skip

    def holding(members: tuple[ConsumerService, ...]) -> list[int]:
        """How many partitions of the routes' topics each member holds."""
        return sorted(
            sum(name.rsplit("[", 1)[0] in pipeline["topics"] for name in m.context()["partitions"])
            for m in members
        )

    with running(config) as first, running(config) as second, reading(reader):
        members = (first, second)
        another_producers(10_000_000)
        eventually(lambda: counts(stack, pipeline) == (2 * others,) * 2)
        # Shared, as a sticky assignor spreads 9 partitions (the manifest's too) over two.
        eventually(lambda: holding(members) in ([3, 5], [4, 4]))
        assert _locks(stack, names) == 0
        for epoch in range(epochs):
            for task in range(TASKS):
                sink.task(epoch, task, epoch_records(pipeline, epoch, task, per_task))
            sink.commit(epoch, list(range(TASKS)))
        eventually(lambda: published(stack.dsn, names["schema"], query) == epochs, timeout=90)
        eventually(lambda: _locks(stack, names) == 3)  # each member's slot, and the unit's
        # The member that reads the unit holds both topics; the other, neither.
        eventually(lambda: holding(members) == [0, 2 * PARTITIONS])
        another_producers(20_000_000)
        total = epochs * TASKS * per_task + 4 * others
        eventually(lambda: counts(stack, pipeline) == (total, total))
    assert reader.partial == [], f"part of an epoch seen: {reader.partial[:5]}"
    assert reader.polls > 50
    assert dead_letters(stack, names) == 0


def test_a_member_started_before_the_groups_first_epoch_looks_once_it_takes_partitions_over(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """Routes whole by default: a member started while its group had no epoch neither looks
    at the ledger nor takes its share of the group's queries. Another member then brings the
    group its epochs (a row in the ledger, as one that staged an epoch and died leaves it) and
    leaves: the first member, claiming its partitions, asks the ledger, looks at it from then
    on (it publishes what the other left staged) and takes its share (a slot lock)."""
    routes = [{"topic": t, "table": table}
              for t, table in zip(pipeline["topics"], pipeline["tables"], strict=True)]  # fmt: skip
    config = settings_for(
        stack, names, consumer={"routes": routes, "epochs_topic": pipeline["manifest"]}
    )
    with running(config) as first:
        eventually(lambda: len(first.context()["partitions"]) == 2 * PARTITIONS + 1)
        assert _locks(stack, names) == 0
        sql(stack, f"INSERT INTO {names['schema']}.{EPOCHS_TABLE} (group_id, query, epoch, "
                   f"outcome, settled_at) VALUES ('{names['group']}', 'q-{uuid.uuid4()}', 0, "
                   "'discarded', now())")  # fmt: skip
        with running(config):  # it takes its share at its start: the ledger knows epochs
            eventually(lambda: len(first.context()["partitions"]) < 2 * PARTITIONS + 1)
            assert _locks(stack, names) == 1  # its slot: the first member has none yet
        eventually(lambda: _locks(stack, names) == 1)  # the first member's own
        eventually(lambda: len(first.context()["partitions"]) == 2 * PARTITIONS + 1)


def _keyed_route(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> tuple[str, str, HandSink, BridgeSettings, Callable[[], dict[int, int]]]:
    """An upsert route of whole epochs keyed by `id`, its table made: (topic, query, the
    query's hand sink, the consumer's config, the table's rows as {id: epoch_no})."""
    topic, table = pipeline["topics"][0], f"public.{names['table']}"
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, epoch_no int)")
        conn.execute(f"GRANT ALL ON {table} TO PUBLIC")
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    route = {"topic": topic, "table": table, "epochs": "whole", "mode": "upsert",
             "key_columns": ["id"]}  # fmt: skip
    config = settings_for(stack, names, consumer={
        "routes": [route], "epochs_topic": pipeline["manifest"], "epochs_hold_ms": 100,
    })  # fmt: skip

    def rows() -> dict[int, int]:
        return dict(sql(stack, f"SELECT id, epoch_no FROM {table}"))

    return topic, query, sink, config, rows


def row(record_id: int, epoch_no: int) -> bytes:
    return json.dumps({"id": record_id, "epoch_no": epoch_no}).encode()


@pytest.mark.parametrize("member", ["same", "restarted"])
def test_another_producers_record_never_overtakes_an_epochs_earlier_record_in_its_partition(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], member: str
) -> None:
    """An epoch whose record has not come is staged (held 100 ms at most), then another
    producer writes the same key after it in its partition. Applied first, the other producer's
    row would be overwritten by the epoch's earlier one at its publication: it waits for the
    publication, and the table ends as the partition's order says. `same`: the member that
    staged the epoch sees it (its assembly cuts the partition); `restarted`: a new member that
    never saw it stage (the ledger's check in the batch refuses it, and the batch written
    statement by statement holds the partition)."""
    topic, query, sink, config, rows = _keyed_route(stack, names, pipeline)

    def another_producer_then_the_epochs_record() -> None:
        producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
        try:
            producer.begin_transaction()
            producer.produce(topic, row(7, -1), b"7", 0)  # after the epoch's id 7
            producer.produce(topic, row(8, -1), b"8", 2)  # in a partition it has no record
            producer.commit_transaction(30)
        finally:
            producer.close()
        eventually(lambda: rows() == {8: -1})  # 7 waits for the epoch before it
        assert rows() == {8: -1}
        sink.commit(1, [0])
        eventually(lambda: rows() == {7: -1, 8: -1, 9: 1})

    with running(config):
        sink.task(1, 0, [(topic, 0, b"7", row(7, 1)), (topic, 1, b"9", row(9, 1))])
        eventually(lambda: staged(stack.dsn, names["schema"], query, 1) == 2)
        if member == "same":
            another_producer_then_the_epochs_record()
    if member == "restarted":
        with running(config):
            another_producer_then_the_epochs_record()
    assert dead_letters(stack, names) == 0


@pytest.mark.parametrize("member", ["same", "restarted"])
def test_another_producers_record_between_two_tasks_of_an_epoch_goes_ahead_of_it(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], member: str
) -> None:
    """What the soak met (a poison record of another producer at soak[2]@18113): epoch 1's
    task 0 commits a record in partition 0, another producer commits two after it there, then
    task 1 commits its record after those, and the driver commits the epoch. The epoch cannot
    be whole before the other producer's records are passed, so they cannot wait for it (the
    soak's partition held at them for ever): they go ahead of it, and the epoch's record of
    their key, before them, is the table's once the epoch is published. `same`: the member
    that staged task 0 sees them (its assembly); `restarted`: a new member that never saw it
    stage (the ledger's check in the batch refuses it, and the batch written statement by
    statement finds the epoch's records after them)."""
    topic, query, sink, config, rows = _keyed_route(stack, names, pipeline)
    ahead = "bridge_consumer_records_ahead_of_epochs_total"

    def another_producer_then_task_1() -> None:
        producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
        try:
            producer.begin_transaction()
            producer.produce(topic, row(1, -1), b"1", 0)  # after the epoch's id 1
            producer.produce(topic, row(5, -1), b"5", 0)
            producer.commit_transaction(30)
        finally:
            producer.close()
        sink.task(1, 1, [(topic, 0, b"2", row(2, 1))])
        sink.commit(1, [0, 1])

    with running(config) as service:
        sink.task(1, 0, [(topic, 0, b"1", row(1, 1))])
        eventually(lambda: staged(stack.dsn, names["schema"], query, 1) == 1)
        if member == "same":
            another_producer_then_task_1()
            eventually(lambda: rows() == {1: 1, 2: 1, 5: -1}, timeout=30)
            assert sample(service, ahead, topic=topic) == 2
    if member == "restarted":
        another_producer_then_task_1()
        with running(config) as service:
            eventually(lambda: rows() == {1: 1, 2: 1, 5: -1}, timeout=30)
            assert sample(service, ahead, topic=topic) == 2
    assert dead_letters(stack, names) == 0


def test_an_epoch_that_cannot_complete_is_reported_then_settled_by_the_operator(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """Epoch 1's query stopped for good after two of its three tasks committed: /readyz, the
    metric, `bridge status` and `bridge epochs show` name it and what it lacks, and epoch 2
    waits behind it. Discarded by the operator, its records go to the dead letters and epoch 2
    publishes. Epoch 3, whose third part never came, is published as it is by the operator."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 10
    config = settings(stack, names, pipeline, "whole", http_port=0, epochs_incomplete_after_ms=1000)
    schema = ["--group", names["group"], "--schema", names["schema"]]
    with running(config) as service:
        for task in range(2):
            sink.task(1, task, epoch_records(pipeline, 1, task, per_task))
        for task in range(TASKS):
            sink.task(2, task, epoch_records(pipeline, 2, task, per_task))
        sink.commit(2, list(range(TASKS)))
        url = f"http://127.0.0.1:{service.http_port}/readyz"

        def reported() -> bool:
            code, body = http_get(url)
            return code == 503 and f"query {query} epoch 1" in body

        eventually(reported)
        _, body = http_get(url)
        assert "no epoch record in the manifest" in body
        assert sample(service, "bridge_consumer_oldest_incomplete_epoch_seconds") >= 1
        assert visible(stack, pipeline, 2) == 0  # waits behind epoch 1

        code, found = status(stack, "--schema", names["schema"], "--stall-after", "1")
        assert code == 1
        assert any(f"query {query} epoch 1" in p for p in found["problems"]), found["problems"]
        shown = bridge(stack, "epochs", "show", *schema, "--format", "json")
        assert shown.returncode == 0, shown.stderr
        epochs = {row["epoch"]: row for row in json.loads(shown.stdout)}
        assert epochs[1]["staged"] == 2 * per_task
        assert epochs[1]["missing"] == [
            "no epoch record in the manifest: the driver has not committed the epoch"
        ]

        dry = bridge(stack, "epochs", "discard", "--query", query, "--epoch", "1", *schema)
        assert dry.returncode == 0 and "dry run" in dry.stdout, dry.stderr
        done = bridge(stack, "epochs", "discard", "--query", query, "--epoch", "1", *schema,
                      "--execute")  # fmt: skip
        assert done.returncode == 0, done.stderr
        eventually(lambda: visible(stack, pipeline, 2) == TASKS * per_task)
        assert visible(stack, pipeline, 1) == 0
        eventually(lambda: http_get(url)[0] == 200)

        # Epoch 3: the driver named three parts; the third task's never came.
        for task in range(2):
            sink.task(3, task, epoch_records(pipeline, 3, task, per_task))
        sink.commit(3, list(range(TASKS)))
        eventually(lambda: staged(stack.dsn, names["schema"], query, 3) == 2 * per_task)
        forced = bridge(stack, "epochs", "publish", "--query", query, "--epoch", "3", *schema,
                        "--execute")  # fmt: skip
        assert forced.returncode == 0, forced.stderr
        assert "Spark partition 2: its part is not in the manifest" in forced.stdout
        eventually(lambda: visible(stack, pipeline, 3) == 2 * per_task)
    dead = sql(stack, f"SELECT count(*), min(error) FROM {names['schema']}.dead_letters")
    assert dead[0][0] == 2 * per_task
    assert f"epoch 1 of query {query} discarded by" in dead[0][1]
    actions = sql(stack, f"SELECT epoch, action, records FROM {names['schema']}.epoch_actions "
                  "ORDER BY id")  # fmt: skip
    assert actions == [(1, "discard", 2 * per_task), (3, "publish", 2 * per_task)]
    assert counts(stack, pipeline) == ((TASKS + 2) * per_task,) * 2


def test_manifest_parts_its_retention_deleted_before_the_group_read_them_are_named_with_the_way_out(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """The group was stopped longer than the manifest keeps its records (the sink's
    `epochs.retention.ms`), and they were deleted unread: never a silent hold. `/readyz` names
    the manifest partition, what its loss means and the command that resets it, then the epoch
    whose parts went with it and the commands that settle it. Run as named, every row of both
    epochs lands once."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 10
    config = settings(stack, names, pipeline, "whole", epochs_incomplete_after_ms=1000)
    with running(config):
        for task in range(TASKS):
            sink.task(1, task, epoch_records(pipeline, 1, task, per_task))
        sink.commit(1, list(range(TASKS)))
        eventually(lambda: visible(stack, pipeline, 1) == TASKS * per_task)
    write_epoch(sink, pipeline, 2, per_task)
    admin = AdminClient(stack.client())
    end = TopicPartition(pipeline["manifest"], 0, OFFSET_END)
    for future in admin.delete_records([end]).values():  # as its retention would
        future.result(30)

    with running(config) as service:
        manifest = f"{pipeline['manifest']}[0] out_of_range"
        epoch = f"query {query} epoch 2"
        eventually(lambda: any(manifest in r for r in service.not_ready()))
        eventually(lambda: any(epoch in r for r in service.not_ready()), timeout=30)
        reasons = service.not_ready()
        lost = next(r for r in reasons if manifest in r)
        assert "below the log start" in lost and "epochs.retention.ms" in lost, lost
        reset = next(c for c in lost.split("`") if c.startswith("bridge offsets reset --"))
        settle = next(r for r in reasons if epoch in r)
        publish = next(c for c in settle.split("`") if c.startswith("bridge epochs publish"))
        assert visible(stack, pipeline, 2) == 0

        assert bridge(stack, *reset.split()[1:]).returncode == 0
        done = bridge(stack, *publish.split()[1:], "--schema", names["schema"])
        assert done.returncode == 0, done.stderr
        eventually(lambda: visible(stack, pipeline, 2) == TASKS * per_task)
        eventually(lambda: service.ready and not service.not_ready(), timeout=30)
    assert counts(stack, pipeline) == (2 * TASKS * per_task,) * 2


def test_a_new_group_finds_an_epoch_whose_records_retention_deleted_named_with_the_way_out(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """A group started after its topics' retention deleted an epoch's records, the manifest
    still holding the epoch's parts (it keeps them as long or longer): that epoch can never be
    whole for this group, and the query's later epochs wait behind it. Today it is named on
    `/readyz` with the commands that settle it; publishing it as it is (nothing of it is left
    to apply) lets the next epoch through, every row of it once."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 5
    write_epoch(sink, pipeline, 1, per_task)
    admin = AdminClient(stack.client())
    ends = [TopicPartition(topic, number, OFFSET_END)
            for topic in pipeline["topics"] for number in range(PARTITIONS)]  # fmt: skip
    for future in admin.delete_records(ends).values():  # as the topics' retention would
        future.result(30)
    write_epoch(sink, pipeline, 2, per_task)

    config = settings(stack, names, pipeline, "whole", epochs_incomplete_after_ms=1000)
    with running(config) as service:
        held = f"query {query} epoch 1 (0 staged)"
        eventually(lambda: any(held in r for r in service.not_ready()), timeout=30)
        assert visible(stack, pipeline, 2) == 0  # behind epoch 1
        settle = next(r for r in service.not_ready() if held in r)
        publish = next(c for c in settle.split("`") if c.startswith("bridge epochs publish"))
        done = bridge(stack, *publish.split()[1:], "--schema", names["schema"])
        assert done.returncode == 0, done.stderr
        eventually(lambda: visible(stack, pipeline, 2) == TASKS * per_task)
        eventually(lambda: service.ready and not service.not_ready(), timeout=30)
    assert counts(stack, pipeline) == (TASKS * per_task,) * 2


def other_querys_parts(stack: Endpoints, manifest: str, count: int, at_ms: int) -> str:
    """`count` parts of another query (of a topic no route reads), stamped `at_ms`, on the
    shared manifest, as a week of another query leaves it; its name."""
    other = f"q-other-{uuid.uuid4()}"
    producer = Producer(stack.client("producer"))
    try:
        for epoch in range(count):
            part = Part(query=other, epoch=epoch, partition=0, records={"elsewhere": 1})
            producer.produce(manifest, part.encode(), key_of(other), 0, timestamp=at_ms)
            if epoch % 1000 == 999:
                producer.flush(30)
        assert producer.flush(30) == 0
    finally:
        producer.close()
    return other


def parts_read(stack: Endpoints, names: dict[str, str], query: str) -> int:
    """Parts of `query` in the group's ledger: parts whose epoch record never comes stay."""
    with psycopg.connect(stack.dsn) as conn:
        found = conn.execute(
            f"SELECT count(*) FROM {names['schema']}.{EPOCH_PARTS_TABLE} WHERE query = %s",
            (query,),
        ).fetchone()
    assert found is not None
    return int(found[0])


def test_a_new_group_reads_the_manifest_from_before_its_first_record_not_its_history(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """The manifest is shared and keeps days of other queries' parts; a new group starts
    reading it `LOOKBACK_S` before the first record of its own topics, so those hours are
    never read (a part whose epoch record never comes would stay in its ledger), and the
    group's own epoch publishes, every row once."""
    hours_ago = int(time.time() * 1000) - int(3 * LOOKBACK_S * 1000)
    other = other_querys_parts(stack, pipeline["manifest"], 2000, hours_ago)
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 5
    write_epoch(sink, pipeline, 1, per_task)
    with running(settings(stack, names, pipeline, "whole")):
        eventually(lambda: visible(stack, pipeline, 1) == TASKS * per_task)
    assert counts(stack, pipeline) == (TASKS * per_task,) * 2
    assert parts_read(stack, names, other) == 0
    assert parts_read(stack, names, query) == 0  # settled: cleared


def test_a_new_group_reads_the_manifest_from_before_the_first_record_it_reads(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """A group that starts at its topics' earliest records, written hours ago, reads the
    manifest from before them: the parts of their epoch (written with them), and of another
    query written since, then their epoch's record written now. Starting from now less the
    lookback instead would miss the parts, and hold the epoch for ever."""
    now_ms = int(time.time() * 1000)
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 5
    for task in range(TASKS):
        old = now_ms - int(3 * LOOKBACK_S * 1000)
        sink.task(1, task, epoch_records(pipeline, 1, task, per_task), timestamp_ms=old)
    other = other_querys_parts(stack, pipeline["manifest"], 50, now_ms - int(2 * LOOKBACK_S * 1000))
    sink.commit(1, list(range(TASKS)))
    write_epoch(sink, pipeline, 2, per_task)
    with running(settings(stack, names, pipeline, "whole")):
        eventually(lambda: visible(stack, pipeline, 2) == TASKS * per_task)
    assert visible(stack, pipeline, 1) == TASKS * per_task
    assert counts(stack, pipeline) == (2 * TASKS * per_task,) * 2
    assert parts_read(stack, names, other) == 50


def test_a_new_group_at_latest_reads_the_manifest_from_its_end(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """`start_policy: latest`: the group reads its topics from their end, and the manifest too,
    not the lookback before: the parts of an epoch written before it started would open an
    epoch whose records it never reads, held for ever, and every later epoch behind it. The
    epoch written after its start publishes, every row once, and nothing before it does."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 5
    write_epoch(sink, pipeline, 1, per_task)
    config = settings(stack, names, pipeline, "whole", start_policy="latest")

    def claimed() -> int:  # the offsets table comes with the service
        try:
            return int(sql(stack, f"SELECT count(*) FROM {names['schema']}.{OFFSETS_TABLE} "
                                  "WHERE owner IS NOT NULL")[0][0])  # fmt: skip
        except psycopg.errors.UndefinedTable:
            return 0

    with running(config) as service:
        # Every partition claimed, at its end: the topics' and the manifest's.
        eventually(lambda: claimed() == 2 * PARTITIONS + 1, timeout=30)
        write_epoch(sink, pipeline, 2, per_task)
        eventually(lambda: visible(stack, pipeline, 2) == TASKS * per_task)
        assert not service.not_ready()
    assert visible(stack, pipeline, 1) == 0
    assert counts(stack, pipeline) == (TASKS * per_task,) * 2
    assert parts_read(stack, names, query) == 0  # epoch 1's never read; epoch 2's cleared


def test_an_epoch_open_past_its_routes_hold_bound_is_discarded_by_policy(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """`epochs_hold_s` on the routes: epoch 1, whose query stopped for good after two of its
    three tasks committed, is discarded by the member once it has been open that long, with no
    operator: its records go to the dead letters naming the policy, an audit row says so, and
    epoch 2, held behind it, publishes. Epoch 2 (of both topics, the bound of the first: 2 s)
    is open past its bound too while it waits behind epoch 1 (of the second only: 6 s), but
    lacks nothing: its query is not gone, and it is never discarded."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 10
    routes = [
        {"topic": topic, "table": table, "epochs": "whole", "epochs_hold_s": bound}
        for topic, table, bound in zip(pipeline["topics"], pipeline["tables"], (2, 6), strict=True)
    ]
    config = settings_for(stack, names, consumer={
        "routes": routes, "epochs_topic": pipeline["manifest"]})  # fmt: skip
    second = pipeline["topics"][1]
    with running(config):
        for task in range(2):
            records = epoch_records(pipeline, 1, task, per_task)
            sink.task(1, task, [(second, p, k, v) for _, p, k, v in records])
        for task in range(TASKS):
            sink.task(2, task, epoch_records(pipeline, 2, task, per_task))
        sink.commit(2, list(range(TASKS)))
        eventually(lambda: visible(stack, pipeline, 2) == TASKS * per_task, timeout=60)
        assert visible(stack, pipeline, 1) == 0
    dead = sql(stack, f"SELECT count(*), min(error) FROM {names['schema']}.dead_letters")
    assert dead[0][0] == 2 * per_task
    assert f"epoch 1 of query {query} discarded by the policy epochs_hold_s: 6" in dead[0][1]
    actions = sql(stack, f"SELECT epoch, action, records, requested_by FROM "
                  f"{names['schema']}.epoch_actions ORDER BY id")  # fmt: skip
    assert actions == [(1, "discard", 2 * per_task, "the policy epochs_hold_s: 6")]


def member_config(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], tmp_path: Path,
    **consumer: Any,
) -> Path:  # fmt: skip
    """The YAML file of a `Member`: whole routes, and a short Kafka session, so that a killed
    member's partitions move on soon."""
    config = tmp_path / "consumer.yaml"
    routes = [
        {"topic": topic, "table": table, "epochs": "whole"}
        for topic, table in zip(pipeline["topics"], pipeline["tables"], strict=True)
    ]
    plain = plain_config(stack, names, routes=routes, epochs_topic=pipeline["manifest"],
                         batch_max_wait_ms=50, db_session_timeout_ms=5000, **consumer)  # fmt: skip
    plain["kafka"]["properties"] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    config.write_text(yaml.safe_dump(plain))
    return config


class Member:
    """One `python -m consumers` process of the group."""

    def __init__(self, config: Path, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "consumers", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def holds_port(self, port: int) -> bool:
        connections = psutil.Process(self.process.pid).net_connections(kind="tcp")
        return any(c.laddr and c.laddr.port == port for c in connections)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)


def client_port_waiting_on(dsn: str, group: str, statement: str) -> int | None:
    """The client port of the group's session that waits for a lock inside `statement`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT client_port FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND application_name = %s AND query ILIKE %s",
            (f"{CONSUMER_APPLICATION_PREFIX}{group}", f"%{statement}%"),
        ).fetchone()
    return None if row is None else int(row[0])


def test_members_killed_while_staging_and_while_publishing_lose_double_and_show_nothing_partial(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], tmp_path: Path
) -> None:
    """Two member processes. One is SIGKILLed with its staging transaction inside the COPY into
    the ledger, one with its publishing transaction inside the COPY into a table; each time
    another member finishes the work, and the reader never sees part of an epoch."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task, epochs = 40, 4
    config = member_config(stack, names, pipeline, tmp_path, epochs_members="all")
    reader = Reader(stack.dsn, pipeline["tables"], dict.fromkeys(range(epochs), TASKS * per_task))
    members = [Member(config, tmp_path / f"member-{i}.log") for i in range(2)]
    try:
        with reading(reader):
            ledger = f"{names['schema']}.epoch_chunks"
            eventually(lambda: _exists(stack, ledger))
            # Both members hold partitions, so that neither sees an epoch whole and both stage
            # (one holding every partition publishes in its batches, tested below).
            eventually(lambda: _owners(stack, names, pipeline["topics"]) == 2)
            for task in range(TASKS):
                sink.task(0, task, epoch_records(pipeline, 0, task, per_task))
            sink.commit(0, list(range(TASKS)))
            eventually(lambda: published(stack.dsn, names["schema"], query) == 1)

            # Killed while staging: epoch 1's records wait for a COPY into the ledger.
            with psycopg.connect(stack.dsn) as holder:
                holder.execute(f"LOCK TABLE {ledger} IN ACCESS EXCLUSIVE MODE")
                for task in range(TASKS):
                    sink.task(1, task, epoch_records(pipeline, 1, task, per_task))
                sink.commit(1, list(range(TASKS)))
                port: list[int] = []

                def staging() -> bool:
                    found = client_port_waiting_on(stack.dsn, names["group"], "COPY")
                    port[:] = [] if found is None else [found]
                    return found is not None

                eventually(staging)
                (victim,) = [m for m in members if m.holds_port(port[0])]
                victim.kill()
                holder.rollback()
            members[members.index(victim)] = Member(config, tmp_path / "member-restarted-1.log")
            eventually(lambda: published(stack.dsn, names["schema"], query) == 2, timeout=120)

            # Killed while publishing: epoch 2 is whole, its publisher waits inside the COPY
            # into the first table.
            with psycopg.connect(stack.dsn) as holder:
                holder.execute(f"LOCK TABLE {pipeline['tables'][0]} IN ACCESS EXCLUSIVE MODE")
                for task in range(TASKS):
                    sink.task(2, task, epoch_records(pipeline, 2, task, per_task))
                sink.commit(2, list(range(TASKS)))
                eventually(staging)
                (victim,) = [m for m in members if m.holds_port(port[0])]
                victim.kill()
                holder.rollback()
            eventually(lambda: published(stack.dsn, names["schema"], query) == 3, timeout=120)
            for task in range(TASKS):
                sink.task(3, task, epoch_records(pipeline, 3, task, per_task))
            sink.commit(3, list(range(TASKS)))
            eventually(lambda: published(stack.dsn, names["schema"], query) == epochs)
    finally:
        for member in members:
            if member.process.poll() is None:
                member.kill()
    assert reader.partial == [], f"part of an epoch seen: {reader.partial[:5]}"
    assert counts(stack, pipeline) == (epochs * TASKS * per_task,) * 2


@pytest.mark.parametrize("epochs_members", ["one", "all"])
def test_a_member_killed_while_epochs_flow_holds_them_back_for_at_most_15_seconds(
    stack: Endpoints,
    names: dict[str, str],
    pipeline: dict[str, Any],
    tmp_path: Path,
    epochs_members: str,
) -> None:
    """Two members with the product's own Kafka settings, an epoch written every 0.3 s; one is
    SIGKILLed: with `one`, the member that reads the query's topics (the other reads none of
    them), with `all`, one of the two sharing them. Every epoch spans every partition, so none can
    complete until the dead member's partitions move: the lock of its session released, the
    session timeout, the rebalance, the claim and a publication. The next epoch is published
    within 15 s of the kill (docs/consumer.md says what sets the bound), and nothing is lost,
    doubled or seen in part."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 24
    config = tmp_path / "consumer.yaml"
    routes = [{"topic": t, "table": table, "epochs": "whole"}
              for t, table in zip(pipeline["topics"], pipeline["tables"], strict=True)]  # fmt: skip
    config.write_text(yaml.safe_dump(plain_config(stack, names, routes=routes,
                                                  epochs_topic=pipeline["manifest"],
                                                  epochs_members=epochs_members)))  # fmt: skip
    logs = [tmp_path / f"member-{i}.log" for i in range(2)]
    members = [Member(config, log) for log in logs]
    written: list[int] = []
    stop = threading.Event()

    def flow() -> None:
        while not stop.is_set():
            epoch = len(written)
            for task in range(TASKS):
                sink.task(epoch, task, epoch_records(pipeline, epoch, task, per_task))
            sink.commit(epoch, list(range(TASKS)))
            written.append(epoch)
            stop.wait(0.3)

    def settled_at() -> dict[int, float]:
        rows = sql(
            stack,
            f"SELECT epoch, extract(epoch FROM settled_at) FROM {names['schema']}.epochs "
            f"WHERE query = '{query}' AND outcome = 'published'",
        )
        return {int(epoch): float(at) for epoch, at in rows}

    # Every epoch has the same rows; far more epochs than 0.3 s apiece can write here.
    reader = Reader(stack.dsn, pipeline["tables"], dict.fromkeys(range(10_000), TASKS * per_task))
    writer = threading.Thread(target=flow, daemon=True)
    try:
        eventually(lambda: all('"consumer started"' in _text(log) for log in logs), timeout=90)
        with reading(reader):
            writer.start()
            # Under `one`, the query's unit is known from its first part: one member then reads
            # both topics (they are shared until then, as topics no manifest names are).
            sharing = 2 if epochs_members == "all" else 1
            eventually(lambda: _owners(stack, names, pipeline["topics"]) == sharing, timeout=90)
            eventually(lambda: len(settled_at()) >= 5, timeout=90)
            owners = _owner_pids(stack, names, pipeline["topics"])
            victim = next(m for m in members if m.process.pid in owners)
            killed_at = float(sql(stack, "SELECT extract(epoch FROM now())")[0][0])
            victim.kill()
            # Epochs written from now on need the dead member's partitions to have moved.
            first_after = len(written) + 1
            eventually(lambda: first_after in settled_at(), timeout=60)
            after = settled_at()[first_after]
            stop.set()
            writer.join(60)
            eventually(lambda: len(settled_at()) == len(written), timeout=90)
    finally:
        stop.set()
        for member in members:
            if member.process.poll() is None:
                member.kill()
    print(f"the next epoch was published {after - killed_at:.1f} s after the kill")
    assert after - killed_at <= 15, f"the next epoch came {after - killed_at:.1f} s after the kill"
    assert reader.partial == [], f"part of an epoch seen: {reader.partial[:5]}"
    assert counts(stack, pipeline) == (len(written) * TASKS * per_task,) * 2


def one_topic_records(
    topic: str, epoch: int, task: int, per_task: int
) -> list[tuple[str, int, bytes | None, bytes | None]]:
    """A task's records, all to `topic`, over all its partitions."""
    return [
        (topic, i % PARTITIONS, None,
         f'{{"id": {(epoch * TASKS + task) * per_task + i}, "epoch_no": {epoch}}}'.encode())
        for i in range(per_task)
    ]  # fmt: skip


def test_two_queries_spread_over_two_members_and_a_killed_members_query_moves_within_15_s(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], tmp_path: Path
) -> None:
    """Two Spark queries, each writing a topic of its own, an epoch of each every 0.3 s; two
    member processes of one default group. Each member reads one query (its partitions, and
    `bridge_consumer_epochs_owner{query}`), and publishes its epochs whole. The owner of the
    first query is SIGKILLed: the other member reads both, the first query's next epoch is
    published within 15 s of the kill, and nothing is lost, doubled or seen in part."""
    (topic_a, topic_b), (table_a, table_b) = pipeline["topics"], pipeline["tables"]
    sinks = {topic: HandSink(stack, manifest_topic=pipeline["manifest"], query=f"q-{uuid.uuid4()}")
             for topic in (topic_a, topic_b)}  # fmt: skip
    per_task = 16
    config = tmp_path / "consumer.yaml"
    routes = [{"topic": t, "table": table}
              for t, table in zip(pipeline["topics"], pipeline["tables"], strict=True)]  # fmt: skip
    config.write_text(yaml.safe_dump(plain_config(
        stack, names, routes=routes, epochs_topic=pipeline["manifest"], http_port=0)))  # fmt: skip
    logs = [tmp_path / f"member-{i}.log" for i in range(2)]
    members = [Member(config, log) for log in logs]
    written: list[int] = []
    stop = threading.Event()

    def flow() -> None:
        while not stop.is_set():
            epoch = len(written)
            for topic, sink in sinks.items():
                for task in range(TASKS):
                    sink.task(epoch, task, one_topic_records(topic, epoch, task, per_task))
                sink.commit(epoch, list(range(TASKS)))
            written.append(epoch)
            stop.wait(0.3)

    def settled_at(topic: str) -> dict[int, float]:
        rows = sql(stack, f"SELECT epoch, extract(epoch FROM settled_at) FROM "
                          f"{names['schema']}.epochs WHERE query = '{sinks[topic].query}' "
                          "AND outcome = 'published'")  # fmt: skip
        return {int(epoch): float(at) for epoch, at in rows}

    def owner_metric(log: Path, topic: str) -> float:
        """The member's `bridge_consumer_epochs_owner` for the topic's query; -1: none yet."""
        port = _http_port(log)
        if port is None:
            return -1.0
        _, body = http_get(f"http://127.0.0.1:{port}/metrics")
        line = f'{METRIC_EPOCHS_OWNER}{{query="{sinks[topic].query}"}} '
        found = [float(row[len(line) :]) for row in body.splitlines() if row.startswith(line)]
        return found[0] if found else -1.0

    def spread() -> bool:
        """One query each: each topic's partitions with one member, not the same one."""
        a, b = (_owner_pids(stack, names, [t]) for t in (topic_a, topic_b))
        return len(a) == len(b) == 1 and a != b

    readers = [Reader(stack.dsn, [table], dict.fromkeys(range(10_000), TASKS * per_task))
               for table in (table_a, table_b)]  # fmt: skip
    writer = threading.Thread(target=flow, daemon=True)
    try:
        eventually(lambda: all('"consumer started"' in _text(log) for log in logs), timeout=90)
        with reading(readers[0]), reading(readers[1]):
            writer.start()
            eventually(spread, timeout=90)
            eventually(lambda: sorted((owner_metric(log, topic_a), owner_metric(log, topic_b))
                                      for log in logs) == [(0.0, 1.0), (1.0, 0.0)])  # fmt: skip
            eventually(lambda: min(len(settled_at(t)) for t in sinks) >= 5, timeout=90)
            (owner_a,) = _owner_pids(stack, names, [topic_a])
            victim = next(m for m in members if m.process.pid == owner_a)
            killed_at = float(sql(stack, "SELECT extract(epoch FROM now())")[0][0])
            victim.kill()
            first_after = len(written) + 1  # needs the dead member's query to have moved
            eventually(lambda: first_after in settled_at(topic_a), timeout=60)
            after = settled_at(topic_a)[first_after]
            stop.set()
            writer.join(60)
            eventually(lambda: all(len(settled_at(t)) == len(written) for t in sinks), timeout=90)
            survivor = next(m for m in members if m is not victim)
            assert _owner_pids(stack, names, pipeline["topics"]) == {survivor.process.pid}
    finally:
        stop.set()
        for member in members:
            if member.process.poll() is None:
                member.kill()
    print(f"the first query's next epoch was published {after - killed_at:.1f} s after the kill")
    assert after - killed_at <= 15, f"the next epoch came {after - killed_at:.1f} s after the kill"
    for reader in readers:
        assert reader.partial == [], f"part of an epoch seen: {reader.partial[:5]}"
    assert counts(stack, pipeline) == (2 * len(written) * TASKS * per_task,) * 2


def test_another_producers_topic_spreads_over_the_members_and_the_sinks_has_one_reader(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """A default group of two members reads a topic a Spark query writes through the sink and
    a topic another producer writes (Kafka Connect, say: no provenance, in no manifest), both
    routes whole by default. Once the query has had epochs, one member reads its topic and
    publishes them whole, while the other producer's topic's partitions stay spread over both
    members, its records landing as their batches commit. (Kafka's assignor balances the
    partitions each member holds, so the other producer's topic has more partitions than the
    query's: the member that reads the query takes fewer of them.)"""
    sink_topic = pipeline["topics"][0]
    other_topic = f"{pipeline['topics'][1]}-connect"
    create_topic(stack.bootstrap_servers, other_topic, partitions=3 * PARTITIONS)
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    topics = (sink_topic, other_topic)
    routes = [{"topic": t, "table": table}
              for t, table in zip(topics, pipeline["tables"], strict=True)]  # fmt: skip
    config = settings_for(
        stack, names, consumer={"routes": routes, "epochs_topic": pipeline["manifest"]}
    )
    per_task, epochs, others = 20, 3, 100

    def holding(member: ConsumerService, topic: str) -> int:
        return sum(name.rsplit("[", 1)[0] == topic for name in member.context()["partitions"])

    def other_producers(first: int) -> None:
        produce(stack, other_topic, [(f"k{i}", {"id": first + i, "epoch_no": -1})
                                     for i in range(others)])  # fmt: skip

    with running(config) as first, running(config) as second:
        members = (first, second)
        for epoch in range(epochs):
            for task in range(TASKS):
                sink.task(epoch, task, one_topic_records(sink_topic, epoch, task, per_task))
            sink.commit(epoch, list(range(TASKS)))
        eventually(lambda: published(stack.dsn, names["schema"], query) == epochs, timeout=90)
        # The query's topic with one member; the other producer's with both.
        eventually(lambda: sorted(holding(m, sink_topic) for m in members) == [0, PARTITIONS])
        eventually(lambda: all(holding(m, other_topic) > 0 for m in members))
        other_producers(10_000_000)
        for epoch in range(epochs, 2 * epochs):
            for task in range(TASKS):
                sink.task(epoch, task, one_topic_records(sink_topic, epoch, task, per_task))
            sink.commit(epoch, list(range(TASKS)))
        eventually(lambda: published(stack.dsn, names["schema"], query) == 2 * epochs)
        total = 2 * epochs * TASKS * per_task + others
        eventually(lambda: counts(stack, pipeline) == (total, total))
        assert sorted(holding(m, sink_topic) for m in members) == [0, PARTITIONS]
        assert all(holding(m, other_topic) > 0 for m in members)
        # The records of the sink's topic were read by the member that published them.
        reader = next(m for m in members if holding(m, sink_topic))
        assert sample(reader, "bridge_consumer_records_read_total", topic=sink_topic) > 0
    assert dead_letters(stack, names) == 0


def test_a_route_moved_between_staging_and_publication_plans_the_staged_records_again(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any]
) -> None:
    """Epoch 1's records are staged with their plans, made for the route's tables; the member
    stops, the routes move to other tables, and the epoch record comes. The staged plans were
    made for another route (their fingerprint): the records land where the routes now say."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    per_task = 20
    with running(settings(stack, names, pipeline, "whole", epochs_hold_ms=0)):
        for task in range(TASKS):
            sink.task(1, task, epoch_records(pipeline, 1, task, per_task))
        eventually(lambda: staged(stack.dsn, names["schema"], query, 1) == TASKS * per_task)
    planned = sql(
        stack,
        f'SELECT count(*) FILTER (WHERE plan IS NOT NULL), count(*) FROM "{names["schema"]}"'
        f".epoch_chunks WHERE query = '{query}'",
    )
    assert planned[0][0] == planned[0][1] > 0, planned  # what a stale plan would have written
    moved = dict(pipeline, tables=[f"{t}_moved" for t in pipeline["tables"]])
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        for table in moved["tables"]:
            conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, epoch_no int)")
            conn.execute(f"GRANT ALL ON {table} TO PUBLIC")
    with running(settings(stack, names, moved, "whole")):
        sink.commit(1, list(range(TASKS)))
        eventually(lambda: published(stack.dsn, names["schema"], query) == 1)
    assert counts(stack, moved) == (TASKS * per_task,) * 2
    assert counts(stack, pipeline) == (0, 0)


def _owners(stack: Endpoints, names: dict[str, str], topics: list[str]) -> int:
    """How many members own partitions of `topics`; 0 before the offsets table exists."""
    if not _exists(stack, f"{names['schema']}.offsets"):
        return 0
    rows = sql(stack, f"SELECT count(DISTINCT owner) FROM {names['schema']}.offsets "
               f"WHERE group_id = '{names['group']}' AND topic = ANY(ARRAY{topics})")  # fmt: skip
    return int(rows[0][0])


def _locks(stack: Endpoints, names: dict[str, str]) -> int:
    """The advisory locks the group's sessions hold: each member's slot, and each unit's."""
    rows = sql(stack, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
               f"WHERE l.locktype = 'advisory' AND l.granted "
               f"AND a.application_name = '{application_name(names['group'])}'")  # fmt: skip
    return int(rows[0][0])


def _owner_pids(stack: Endpoints, names: dict[str, str], topics: list[str]) -> set[int]:
    """The process ids of the members that own partitions of `topics` (owners are host:pid; a
    partition released and not claimed again has none)."""
    rows = sql(stack, f"SELECT DISTINCT owner FROM {names['schema']}.offsets "
               f"WHERE group_id = '{names['group']}' AND topic = ANY(ARRAY{topics}) "
               "AND owner IS NOT NULL")  # fmt: skip
    return {int(str(owner).rsplit(":", 1)[1]) for (owner,) in rows}


def _exists(stack: Endpoints, table: str) -> bool:
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    return row is not None and row[0] is not None


Row = tuple[int, str, int]  # id, v, epoch_no


@pytest.mark.parametrize("mode", ["upsert", "replace", "insert_if_absent", "update"])
def test_every_keyed_mode_publishes_whole_and_ends_as_its_records_say(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], mode: str
) -> None:
    """Keys written again in later epochs and within one, and deleted by tombstones: the table
    a reader sees is always the table after some whole epoch, and at the end the one the
    records say, mode by mode."""
    topic, table = pipeline["topics"][0], f"public.{names['table']}"
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text, epoch_no int)")
        conn.execute(f"GRANT ALL ON {table} TO PUBLIC")
        if mode == "update":  # update mode only changes rows that are there
            conn.execute(f"INSERT INTO {table} SELECT i, 'seed', -1 FROM generate_series(0, 29) i")
    model: dict[int, Row] = {i: (i, "seed", -1) for i in range(30)} if mode == "update" else {}
    states = [dict(model)]  # the table after each whole epoch
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    epochs = 5
    plan: list[list[list[tuple[int, Row | None]]]] = []  # epoch -> task -> (key, row or delete)
    for epoch in range(epochs):
        tasks = []
        for task in range(TASKS):
            writes: list[tuple[int, Row | None]] = []
            for key in range(task * 7 + epoch * 3, task * 7 + epoch * 3 + 12):
                key %= 30
                deleted = (key + epoch) % 11 == 0
                writes.append((key, None if deleted else (key, f"e{epoch}t{task}", epoch)))
            tasks.append(writes)
        plan.append(tasks)
        for writes in tasks:
            for key, row in writes:
                if row is None:
                    model.pop(key, None)
                elif mode in ("upsert", "replace") or (mode == "insert_if_absent") != (
                    key in model
                ):
                    model[key] = row
        states.append(dict(model))
    snapshots = [frozenset(state.values()) for state in states]
    seen_partial: list[int] = []

    def poll(conn: psycopg.Connection[Any]) -> None:
        rows = frozenset(conn.execute(f"SELECT id, v, epoch_no FROM {table}").fetchall())
        if rows not in snapshots:
            seen_partial.append(len(rows))

    route = {"topic": topic, "table": table, "epochs": "whole", "mode": mode, "key_columns": ["id"]}
    manifest = pipeline["manifest"]
    config = settings_for(stack, names, consumer={"routes": [route], "epochs_topic": manifest})
    with running(config), polling(stack.dsn, poll):
        for epoch, tasks in enumerate(plan):
            for task, writes in enumerate(tasks):
                sink.task(epoch, task, [
                    (topic, key % PARTITIONS, json.dumps({"id": key}).encode(),
                     None if row is None else json.dumps(
                         {"id": row[0], "v": row[1], "epoch_no": row[2]}).encode())
                    for key, row in writes
                ])  # fmt: skip
            sink.commit(epoch, list(range(TASKS)))
        eventually(lambda: published(stack.dsn, names["schema"], query) == epochs)
    assert seen_partial == [], f"{len(seen_partial)} polls saw a table no whole epoch makes"
    assert set(sql(stack, f"SELECT id, v, epoch_no FROM {table}")) == set(model.values())


@pytest.mark.parametrize("on_record_error", ["dead_letter", "stop"])
def test_a_record_the_table_refuses_at_publication_never_publishes_part_of_its_epoch(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], on_record_error: str
) -> None:
    """A record that decodes but that the table refuses (a CHECK), found only when its epoch's
    plan runs: dead-lettered with its coordinates and the rest of the epoch published at once;
    or, with `on_record_error: stop`, nothing of the epoch published, /readyz naming the
    record, until the table is fixed."""
    topic, table = pipeline["topics"][0], pipeline["tables"][0]
    sql(stack, f"ALTER TABLE {table} ADD CONSTRAINT not_13 CHECK (id <> 13)")
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    route = {"topic": topic, "table": table, "epochs": "whole", "on_record_error": on_record_error}
    config = settings_for(stack, names, consumer={
        "routes": [route], "epochs_topic": pipeline["manifest"], "http_port": 0})  # fmt: skip
    rows = [(topic, i % PARTITIONS, None, json.dumps({"id": i, "epoch_no": 0}).encode())
            for i in range(40)]  # fmt: skip
    reader = Reader(stack.dsn, [table], {0: 40 if on_record_error == "stop" else 39})
    with running(config) as service, reading(reader):
        sink.task(0, 0, rows[:20])
        sink.task(0, 1, rows[20:])
        sink.commit(0, [0, 1])
        if on_record_error == "stop":
            url = f"http://127.0.0.1:{service.http_port}/readyz"
            eventually(lambda: "an epoch cannot be published" in http_get(url)[1])
            assert f"query {query} epoch 0" in http_get(url)[1]
            assert visible(stack, pipeline, 0) == 0
            sql(stack, f"ALTER TABLE {table} DROP CONSTRAINT not_13")
        eventually(lambda: published(stack.dsn, names["schema"], query) == 1, timeout=90)
    assert reader.partial == [], reader.partial[:5]
    dead = sql(
        stack, f'SELECT topic, partition, "offset", error FROM {names["schema"]}.dead_letters'
    )
    if on_record_error == "stop":
        assert dead == [] and visible(stack, pipeline, 0) == 40
    else:
        assert len(dead) == 1 and dead[0][0] == topic and "23514" in dead[0][3], dead
        assert visible(stack, pipeline, 0) == 39


def _text(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def _http_port(log: Path) -> int | None:
    """The metrics port a member logged at start, or None before it did."""
    for line in log.read_text().splitlines() if log.exists() else []:
        if '"consumer started"' in line:
            port = json.loads(line).get("http_port")
            return int(port) if port else None
    return None


def _held(log: Path) -> float:
    port = _http_port(log)
    if port is None:
        return -1
    code, body = http_get(f"http://127.0.0.1:{port}/metrics")
    for line in body.splitlines() if code == 200 else []:
        if line.startswith("bridge_consumer_epoch_records_held "):
            return float(line.split()[1])
    return -1


def _published_by(log: Path) -> dict[str, float] | None:
    """The epochs a member published, by path (`in_batch`, `staged`), from its metrics; None
    before it serves them."""
    port = _http_port(log)
    if port is None:
        return None
    code, body = http_get(f"http://127.0.0.1:{port}/metrics")
    if code != 200:
        return None
    found = {"in_batch": 0.0, "staged": 0.0}
    for line in body.splitlines():
        for path in found:
            if line.startswith(f'bridge_consumer_epochs_published_total{{path="{path}"}} '):
                found[path] = float(line.split()[1])
    return found


def test_one_member_holding_every_partition_publishes_epochs_in_their_batches_through_kills(
    stack: Endpoints, names: dict[str, str], pipeline: dict[str, Any], tmp_path: Path
) -> None:
    """One member holds every partition, so an epoch's records wait in its memory and go to
    their tables once, with the epoch's settlement, in the batch that completes it. It is
    SIGKILLed while it holds an epoch's records (nothing of them committed: they are read
    again) and while that batch waits inside its COPY into a table; then the ledger disagrees
    with it (an earlier epoch open that it never saw), and the batch is refused and staged, to
    publish once the operator discards that epoch. Epoch 3 comes from a sink whose parts name
    no offsets, as before this version (the member finds its records' epochs in their headers).
    The reader never sees part of an epoch, and every id lands once."""
    query = f"q-{uuid.uuid4()}"
    sink = HandSink(stack, manifest_topic=pipeline["manifest"], query=query)
    older = HandSink(stack, manifest_topic=pipeline["manifest"], query=query, name_offsets=False)
    per_task, epochs = 40, 4
    # Held until whole, however slow the machine: the hold's time bound has a unit test.
    config = member_config(stack, names, pipeline, tmp_path, http_port=0, epochs_hold_ms=600_000)
    expected = dict.fromkeys(range(epochs), TASKS * per_task)
    expected[11] = TASKS * per_task
    reader = Reader(stack.dsn, pipeline["tables"], expected)
    logs = [tmp_path / f"member-{i}.log" for i in range(4)]
    member = Member(config, logs[0])
    schema = ["--group", names["group"], "--schema", names["schema"]]

    def write(epoch: int, *, commit: bool = True) -> None:
        writer = older if epoch == 3 else sink
        for task in range(TASKS):
            writer.task(epoch, task, epoch_records(pipeline, epoch, task, per_task))
        if commit:
            writer.commit(epoch, list(range(TASKS)))

    try:
        with reading(reader):
            write(0)
            eventually(lambda: published(stack.dsn, names["schema"], query) == 1, timeout=90)
            eventually(lambda: _published_by(logs[0]) == {"in_batch": 1, "staged": 0})

            # Killed holding epoch 1's records: its manifest has not come.
            write(1, commit=False)
            eventually(lambda: _held(logs[0]) == TASKS * per_task)
            assert visible(stack, pipeline, 1) == 0
            assert staged(stack.dsn, names["schema"], query, 1) == 0  # in memory only
            member.kill()
            member = Member(config, logs[1])
            sink.commit(1, list(range(TASKS)))
            eventually(lambda: published(stack.dsn, names["schema"], query) == 2, timeout=90)
            eventually(lambda: _published_by(logs[1]) == {"in_batch": 1, "staged": 0})

            # Killed with epoch 2's batch inside its COPY into the first table.
            with psycopg.connect(stack.dsn) as holder:
                holder.execute(f"LOCK TABLE {pipeline['tables'][0]} IN ACCESS EXCLUSIVE MODE")
                write(2)
                eventually(lambda: client_port_waiting_on(stack.dsn, names["group"], "COPY")
                           is not None)  # fmt: skip
                member.kill()
                holder.rollback()
            member = Member(config, logs[2])
            write(3)
            eventually(lambda: published(stack.dsn, names["schema"], query) == epochs, timeout=90)
            # Each of epochs 0-3 by its batch: one by each member killed, two by this one.
            eventually(lambda: _published_by(logs[2]) == {"in_batch": 2, "staged": 0})

            # The ledger holds epoch 10 open, as another member's staging would leave it: the
            # batch that holds epoch 11 whole is refused, stages it, and it waits.
            sql(stack, f"INSERT INTO {names['schema']}.epochs (group_id, query, epoch) "
                f"VALUES ('{names['group']}', '{query}', 10)")  # fmt: skip
            write(11)
            eventually(lambda: staged(stack.dsn, names["schema"], query, 11) == TASKS * per_task)
            assert visible(stack, pipeline, 11) == 0
            done = bridge(stack, "epochs", "discard", "--query", query, "--epoch", "10", *schema,
                          "--execute")  # fmt: skip
            assert done.returncode == 0, done.stderr
            eventually(lambda: published(stack.dsn, names["schema"], query) == epochs + 1)
            # Epoch 11 from the ledger, by the publisher, not by its batch.
            eventually(lambda: _published_by(logs[2]) == {"in_batch": 2, "staged": 1})
    finally:
        if member.process.poll() is None:
            member.kill()
    assert reader.partial == [], f"part of an epoch seen: {reader.partial[:5]}"
    assert any("cannot be published by its batch" in log.read_text() for log in logs[2:3])
    assert counts(stack, pipeline) == ((epochs + 1) * TASKS * per_task,) * 2


@pytest.mark.parametrize("member", ["same", "restarted"])
def test_an_epoch_written_again_after_it_was_published_lands_nothing_twice(
    stack: Endpoints, names: dict[str, str], member: str
) -> None:
    """What a driver restarted from a checkpoint that lacks an epoch's commit writes once its
    markers expired (issue 68: "markers expired"): the epoch's tasks again, records and parts,
    and its record again. The group published it already: its watermark says so, whether or
    not its row is still kept, and the copy is skipped, counted and named; the next epoch is
    not held behind it. Tables without a key, so that a row twice shows."""
    suffix = uuid.uuid4().hex[:8]
    lines: dict[str, Any] = {"topics": [f"wr-a-{suffix}", f"wr-b-{suffix}"],
             "tables": [f"public.wr_a_{suffix}", f"public.wr_b_{suffix}"],
             "manifest": f"wr-epochs-{suffix}"}  # fmt: skip
    for topic in lines["topics"]:
        create_topic(stack.bootstrap_servers, topic, partitions=PARTITIONS)
    create_topic(stack.bootstrap_servers, lines["manifest"], partitions=1)
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        for table in lines["tables"]:
            conn.execute(f"CREATE TABLE {table} (id bigint, epoch_no int)")
            conn.execute(f"GRANT ALL ON {table} TO PUBLIC")
    query = f"q-{suffix}"
    sink = HandSink(stack, manifest_topic=lines["manifest"], query=query)
    config = settings(stack, names, lines, "whole")
    per_task = 50

    def epoch(number: int) -> None:
        for task in range(TASKS):
            sink.task(number, task, epoch_records(lines, number, task, per_task))
        sink.commit(number, list(range(TASKS)))

    def landed(epochs: int) -> bool:
        return counts(stack, lines) == (epochs * TASKS * per_task,) * 2

    replayed = "bridge_consumer_replayed_epoch_records_total"
    with running(config) as service:
        epoch(0)
        epoch(1)
        eventually(lambda: landed(2), timeout=60)
        if member == "same":
            epoch(1)  # the replay
            epoch(2)
            eventually(lambda: landed(3), timeout=60)
            eventually(lambda: sample(service, replayed, query=query) == TASKS * per_task)
    if member == "restarted":
        epoch(1)
        epoch(2)
        with running(config) as service:
            eventually(lambda: landed(3), timeout=60)
            eventually(lambda: sample(service, replayed, query=query) == TASKS * per_task)
    assert counts(stack, lines) == (3 * TASKS * per_task,) * 2
    assert dead_letters(stack, names) == 0
