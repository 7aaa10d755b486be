"""`bridge status` against the real stack: healthy, a stalled partition, a consumer down."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import pytest

from bridge.kafka_admin import create_topic
from bridge_shell.stack.process import free_port
from spark_jobs.epoch_markers import MarkerReader, marker_position
from spark_jobs.sink_options import IdNaming
from spark_jobs.txn_admin import transactional_ids
from tests.cli import run_bridge
from tests.consumer_helpers import eventually, produce, running, settings_for, sql
from tests.harness import Endpoints
from tests.integration.test_operator_tools import bridge, count
from tests.kafka_helpers import transactional_producer

pytestmark = pytest.mark.slow


def status(stack: Endpoints, *args: str) -> tuple[int, dict[str, Any]]:
    result = bridge(stack, "status", "--format", "json", *args)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def commit_epoch_marker(stack: Endpoints, prefix: str, marker_topic: str, data: str) -> None:
    """What a write task of the sink commits for Spark partition 0, epoch 3: a record and the
    epoch's marker in one transaction."""
    [task_id] = transactional_ids(prefix, [0], 3, IdNaming.POOLED)
    producer = transactional_producer(stack.bootstrap_servers, task_id)
    reader = MarkerReader(
        {"bootstrap.servers": stack.bootstrap_servers}, prefix=prefix, partition=0,
        marker_topic=marker_topic,
    )  # fmt: skip
    producer.begin_transaction()
    producer.produce(data, value=b'{"id": -1}')
    producer.send_offsets_to_transaction(
        marker_position(marker_topic, 3, {"rows": 1}), reader.group_metadata(), 30
    )
    producer.commit_transaction(30)
    reader.close()


def test_status_healthy_then_a_stalled_partition_then_a_consumer_down(
    stack: Endpoints, names: dict[str, str]
) -> None:
    topic, table = names["topic"], names["table"]
    prefix, markers = f"st-{uuid.uuid4().hex[:8]}", f"m-{topic}"
    create_topic(stack.bootstrap_servers, topic, partitions=2)
    create_topic(stack.bootstrap_servers, markers)
    sql(stack, f"CREATE TABLE public.{table} (id int)")
    produce(stack, topic, [(i, {"id": i}) for i in range(100)])
    commit_epoch_marker(stack, prefix, markers, topic)
    common = ("--schema", names["schema"], "--prefix", prefix, "--marker-topic", markers)
    # Its route publishes whole epochs by default, so the group reads an epoch manifest too:
    # its own, which no other test writes to, for the lag and the stalls to be this test's.
    epochs_topic = f"e-{topic}"
    create_topic(stack.bootstrap_servers, epochs_topic)
    consumer = {"http_port": 0, "epochs_topic": epochs_topic}

    with running(settings_for(stack, names, consumer=consumer)) as service:
        url = f"http://127.0.0.1:{service.http_port}"
        eventually(lambda: count(stack, names) == 101 and service.ready)
        code, healthy = status(stack, *common, "--consumer", url)
        assert code == 0, healthy["problems"]
        parts = {c["name"]: c for c in healthy["components"]}
        assert parts["postgresql"]["ok"] and parts[f"consumer {url}"]["ok"]
        assert any(name.startswith("kafka broker") for name in parts)
        if stack.secure:  # the stack's registry, named in its stack.env
            assert parts[f"schema registry {stack.registry_url}"]["ok"], parts
        group = next(g for g in healthy["groups"] if g["group"] == names["group"])
        assert (group["lag"], group["partitions"], group["stalled"]) == (0, 2 + 1, [])
        assert healthy["producers"] == [
            {"prefix": prefix, "epochs": [{"partition": 0, "epoch": 3, "problem": None}]}
        ]

    # The consumer is gone: new records wait, nothing is committed for them.
    produce(stack, topic, [(i, {"id": i}) for i in range(100, 150)])
    time.sleep(2)
    code, stalled = status(stack, *common, "--stall-after", "1")
    assert code == 1
    group = next(g for g in stalled["groups"] if g["group"] == names["group"])
    # Lag counts offsets: the 50 records and the transaction markers after them.
    assert group["lag"] >= 50 and len(group["stalled"]) == 2, group
    assert all("behind and nothing committed" in s for s in group["stalled"])

    code, down = status(stack, *common, "--consumer", url, "--stall-after", "3600")
    assert code == 1
    assert len(down["problems"]) == 1, down["problems"]
    assert down["problems"][0].startswith(f"consumer {url}: not answering"), down["problems"]
    shown = bridge(stack, "status", *common, "--consumer", url)
    assert shown.returncode == 1 and "problem(s)" in shown.stdout, shown.stdout


def test_status_with_kafka_unreachable_names_the_cause_and_prints_no_raw_client_lines(
    stack: Endpoints,
) -> None:
    """The table says why Kafka is down (the address and the refusal, from librdkafka's own
    lines) and stderr carries none of librdkafka's raw `%3|...` lines."""
    unreachable = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    env |= {"BRIDGE_KAFKA__BOOTSTRAP_SERVERS": unreachable, "BRIDGE_POSTGRES__DSN": stack.dsn,
            "BRIDGE_STACK_DIR": "/nonexistent"}  # fmt: skip
    result = run_bridge("status", "--format", "json", env=env, timeout=120)

    assert result.returncode != 0
    kafka = [c for c in json.loads(result.stdout)["components"] if c["name"] == "kafka"]
    assert kafka and not kafka[0]["ok"], result.stdout
    assert f"Connect to ipv4#{unreachable} failed: Connection refused" in kafka[0]["detail"]
    assert "%3|" not in result.stderr + result.stdout, result.stderr[-2000:]


def test_an_abandoned_group_is_judged_only_when_asked_and_deleted_with_an_audit_row(
    stack: Endpoints, names: dict[str, str]
) -> None:
    topic, table, group, schema = names["topic"], names["table"], names["group"], names["schema"]
    prefix, markers = f"ab-{uuid.uuid4().hex[:8]}", f"m-{topic}"
    create_topic(stack.bootstrap_servers, topic, partitions=2)
    create_topic(stack.bootstrap_servers, markers)
    sql(stack, f"CREATE TABLE public.{table} (id int)")
    produce(stack, topic, [(i, {"id": i}) for i in range(10)])
    commit_epoch_marker(stack, prefix, markers, topic)
    common = ("--schema", schema, "--prefix", prefix, "--marker-topic", markers)
    delete = ("offsets", "delete", "--group", group, "--schema", schema)
    epochs_topic = f"e-{topic}"  # the group's epoch manifest, its own (see the test above)
    create_topic(stack.bootstrap_servers, epochs_topic)

    with running(settings_for(stack, names, consumer={"epochs_topic": epochs_topic})):
        eventually(lambda: count(stack, names) == 11)
        refused = bridge(stack, *delete, "--execute")
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 2 and "live members holding" in said, refused.stderr

    # The group is gone and its topic moves on: it is stalled for good.
    produce(stack, topic, [(i, {"id": i}) for i in range(10, 15)])

    def judged() -> bool:
        code, found = status(stack, *common, "--stall-after", "1", "--group", group)
        return code == 1 and bool(found["groups"] and found["groups"][0]["stalled"])

    eventually(judged)
    code, ignored = status(stack, *common, "--stall-after", "1", "--ignore-idle-after", "1")
    assert code == 0, ignored["problems"]
    [shown] = [g for g in ignored["groups"] if g["group"] == group]
    assert shown["stalled"] and shown["ignored_idle_s"] > 1
    code, others = status(stack, *common, "--stall-after", "1", "--group", "another-group")
    assert (code, others["groups"]) == (0, [])

    dry = bridge(stack, *delete)
    assert dry.returncode == 0 and "dry run" in dry.stdout, dry.stderr
    deleted = bridge(stack, *delete, "--execute")
    assert deleted.returncode == 0, deleted.stderr
    assert f"deleted 3 position(s) of group {group!r}" in deleted.stdout  # the manifest's too
    assert sql(stack, f"SELECT count(*) FROM {schema}.offsets WHERE group_id = '{group}'") == [(0,)]
    audit = sql(stack, f"SELECT topic, partition, forced FROM {schema}.offset_deletions "
                       "ORDER BY topic, partition")  # fmt: skip
    assert sorted(audit) == sorted([(epochs_topic, 0, False), (topic, 0, False), (topic, 1, False)])
    code, after = status(stack, *common, "--stall-after", "1", "--group", group)
    assert (code, after["groups"]) == (0, [])


def test_the_registry_line_says_how_many_subjects_or_why_it_does_not_answer(
    stack: Endpoints, registry_url: str
) -> None:
    from bridge_shell.stack.process import free_port
    from bridge_shell.status import _registry

    found = _registry({"url": registry_url, **stack.registry_properties})
    assert found.ok and found.detail.endswith("subject(s)"), found
    gone = _registry({"url": f"http://127.0.0.1:{free_port()}"})
    assert not gone.ok and gone.detail.startswith("not answering"), gone
