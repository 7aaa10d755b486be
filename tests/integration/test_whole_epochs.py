"""Whole epochs on the real broker and database: a reader polling the tables never sees part of
an epoch when its route wants whole epochs, through two members, a rebalance between staging and
publishing, and a member killed while it publishes; and it does see parts on the per-partition
mode, the same run otherwise. Every record lands exactly once either way."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import eventually, http_get, running, sample, settings_for, sql
from tests.epoch_helpers import HandSink, Reader, published, reading, staged
from tests.harness import Endpoints
from tests.integration.test_operator_tools import bridge
from tests.integration.test_status import status

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
        eventually(lambda: visible(stack, pipeline, 1) == per_task)
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
    config = settings(stack, names, pipeline, "whole")
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
