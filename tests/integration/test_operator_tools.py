"""`bridge offsets` and `bridge txn` against the real stack, as an operator runs them."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from bridge.kafka_admin import KafkaAdmin, create_topic, offset_range
from spark_jobs.epoch_markers import MarkerReader, marker_position
from spark_jobs.epoch_transaction import TaskCoordinates
from spark_jobs.sink_options import IdNaming
from tests.cli import run_bridge
from tests.consumer_helpers import (
    drained,
    eventually,
    produce,
    running,
    settings_for,
    sql,
)
from tests.harness import Endpoints
from tests.kafka_helpers import read_all, transactional_producer


def bridge(stack: Endpoints, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line against the test stack, whatever BRIDGE_* the caller's shell holds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    if stack.secure:
        # As a user of the secured stack runs them: the tools' principal and role, from the
        # files the stack wrote (stack.env and stack.tools.env).
        env["BRIDGE_STACK_DIR"] = str(stack.stack_dir)
    else:
        env |= {"BRIDGE_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap_servers,
                "BRIDGE_POSTGRES__DSN": stack.dsn, "BRIDGE_STACK_DIR": "/nonexistent"}  # fmt: skip
    return run_bridge(*args, env=env, timeout=120)


def show(stack: Endpoints, names: dict[str, str]) -> list[dict[str, Any]]:
    result = bridge(stack, "offsets", "show", "--group", names["group"],
                    "--schema", names["schema"], "--format", "json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    positions: list[dict[str, Any]] = json.loads(result.stdout)
    return [p for p in positions if p["topic"] == names["topic"]]  # the manifest's are beside


def stored(stack: Endpoints, names: dict[str, str]) -> list[tuple[Any, ...]]:
    """The group's positions in the test's topic (the epoch manifest's are beside them: its
    routes publish whole epochs by default)."""
    return sql(
        stack,
        f"SELECT partition, next_offset FROM {names['schema']}.offsets "
        f"WHERE group_id = '{names['group']}' AND topic = '{names['topic']}' ORDER BY partition",
    )


def setup_applied(stack: Endpoints, names: dict[str, str]) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2, config=stack.properties())
    sql(stack, f"CREATE TABLE public.{names['table']} (id int, body text)")  # no key
    stack.let_consumer_write(f"public.{names['table']}", schema=names["schema"])
    produce(stack, names["topic"], [(i, {"id": i}) for i in range(20)])
    produce(stack, names["topic"], [(i, {"id": i}) for i in range(20, 40)])


def count(stack: Endpoints, names: dict[str, str]) -> int:
    return int(sql(stack, f"SELECT count(*) FROM public.{names['table']}")[0][0])


@pytest.mark.secured
def test_offsets_show_reports_positions_lag_and_the_live_member(
    stack: Endpoints, names: dict[str, str]
) -> None:
    setup_applied(stack, names)
    ranges = offset_range(
        stack.bootstrap_servers, [(names["topic"], p) for p in (0, 1)], config=stack.properties()
    )
    with running(settings_for(stack, names)):
        eventually(lambda: count(stack, names) == 40)
        live = show(stack, names)
        table = bridge(stack, "offsets", "show", "--group", names["group"],
                       "--schema", names["schema"])  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert names["topic"] in table.stdout and "next offset" in table.stdout

    assert [(p["topic"], p["partition"]) for p in live] == [
        (names["topic"], 0),
        (names["topic"], 1),
    ]
    for position in live:
        log_start, stable = ranges[(names["topic"], position["partition"])]
        assert position["group"] == names["group"]
        assert position["log_start_offset"] == log_start == 0
        assert position["last_stable_offset"] == stable
        # Caught up: only the last transaction's commit marker lies beyond the stored offset.
        assert position["next_offset"] == stable - 1
        assert position["lag"] == 0
        assert position["out_of_range"] is False
        assert position["live_owner"], "the running member holds the partition"
        assert position["owner"] and position["owner_epoch"] >= 1

    produce(stack, names["topic"], [(0, {"id": 99})])  # partition of key 0 now lags by one
    after = show(stack, names)
    # Lag counts offsets: the earlier commit marker, the new record and its own commit marker.
    assert sorted(p["lag"] for p in after) == [0, 3]
    assert all(p["live_owner"] is None and p["owner"] is None for p in after)


def test_topics_create_makes_the_topic_with_its_settings_once(
    stack: Endpoints, names: dict[str, str]
) -> None:
    topic = names["topic"]
    made = bridge(stack, "topics", "create", topic, "--partitions", "3",
                  "--topic-config", "retention.ms=3600000")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert f"created topic {topic} with 3 partitions" in made.stdout
    admin = KafkaAdmin(stack.properties() | {"bootstrap.servers": stack.bootstrap_servers})
    assert admin.partitions(topic) == [0, 1, 2]
    resource = ConfigResource(ResourceType.TOPIC, topic)
    raw = AdminClient({**stack.properties(), "bootstrap.servers": stack.bootstrap_servers})
    settings = raw.describe_configs([resource])[resource].result(30)
    assert settings["retention.ms"].value == "3600000"
    again = bridge(stack, "topics", "create", topic, "--partitions", "5")
    assert again.returncode == 0, again.stderr
    assert "exists already, with 3 partitions: left as it is" in again.stdout
    refused = bridge(stack, "topics", "create", topic, "--topic-config", "retention.ms")
    assert refused.returncode == 2, refused.stderr
    assert "--topic-config: 'retention.ms' is not KEY=VALUE" in refused.stderr


def test_the_tools_that_read_no_record_need_no_registry_for_a_typed_route(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    setup_applied(stack, names)
    with running(settings_for(stack, names)):  # the state tables and positions exist
        drained(stack, names, 2)
    config = tmp_path / "bridge.yaml"
    route = {"topic": names["topic"], "table": f"public.{names['table']}", "value_format": "avro"}
    consumer = {"group_id": names["group"], "state_schema": names["schema"], "routes": [route]}
    config.write_text(yaml.safe_dump({"consumer": consumer}))
    shown = bridge(stack, "offsets", "show", "--config", str(config), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    status = bridge(stack, "status", "--config", str(config))
    assert "schema_registry" not in status.stdout + status.stderr, status.stderr
    assert status.returncode in (0, 1), status.stderr  # 1: nothing consumes the group now


@pytest.mark.secured
def test_offsets_reset_is_a_dry_run_refused_with_a_live_owner_and_forced_on_request(
    stack: Endpoints, names: dict[str, str]
) -> None:
    setup_applied(stack, names)
    with running(settings_for(stack, names)):
        eventually(lambda: count(stack, names) == 40)
        before = stored(stack, names)
        reset = ("offsets", "reset", "--group", names["group"], "--schema", names["schema"],
                 "--topic", names["topic"], "--to", "earliest")  # fmt: skip

        dry = bridge(stack, *reset)
        assert dry.returncode == 0, dry.stderr
        assert "dry run" in dry.stdout
        assert stored(stack, names) == before

        refused = bridge(stack, *reset, "--execute")
        assert refused.returncode == 2
        assert "live members" in refused.stderr and "--force" in refused.stderr
        assert stored(stack, names) == before

        forced = bridge(stack, *reset, "--execute", "--force")
        assert forced.returncode == 0, forced.stderr
        # The member is fenced, finds the partitions released by the reset, claims them again
        # and replays from the start: every record twice, as the operator asked.
        eventually(lambda: count(stack, names) == 80)
        eventually(lambda: stored(stack, names) == before)

    audit = sql(
        stack,
        f"SELECT partition, old_offset, new_offset, forced, target, old_owner IS NOT NULL "
        f"FROM {names['schema']}.offset_resets WHERE group_id = '{names['group']}' "
        "ORDER BY partition",
    )
    assert audit == [(p, old, 0, True, "earliest", True) for p, old in before]
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM public.{names['table']}") == [
        (80, 40)
    ]


@pytest.mark.secured
def test_offsets_reset_targets_and_refusals_with_the_group_stopped(
    stack: Endpoints, names: dict[str, str]
) -> None:
    setup_applied(stack, names)
    with running(settings_for(stack, names)):
        eventually(lambda: count(stack, names) == 40)
    ranges = offset_range(
        stack.bootstrap_servers, [(names["topic"], p) for p in (0, 1)], config=stack.properties()
    )
    base = ("offsets", "reset", "--group", names["group"], "--schema", names["schema"],
            "--topic", names["topic"], "--execute")  # fmt: skip

    assert bridge(stack, *base, "--to", "earliest").returncode == 0
    assert stored(stack, names) == [(0, 0), (1, 0)]
    assert bridge(stack, *base, "--to", "latest").returncode == 0
    assert stored(stack, names) == [(p, ranges[(names["topic"], p)][1]) for p in (0, 1)]
    assert bridge(stack, *base, "--to", "3", "--partition", "1").returncode == 0
    assert stored(stack, names)[1] == (1, 3)
    assert bridge(stack, *base, "--to", "2020-01-01T00:00:00Z").returncode == 0
    assert stored(stack, names) == [(0, 0), (1, 0)]  # every record is newer
    assert bridge(stack, *base, "--to", "2999-01-01").returncode == 0
    assert stored(stack, names) == [(p, ranges[(names["topic"], p)][1]) for p in (0, 1)]

    beyond = bridge(stack, *base, "--to", "999999")
    assert beyond.returncode == 2 and "holds offsets" in beyond.stderr
    nonsense = bridge(stack, *base, "--to", "yesterday")
    assert nonsense.returncode == 2 and "--to 'yesterday'" in nonsense.stderr
    no_partition = bridge(stack, *base, "--to", "0", "--partition", "7")
    assert no_partition.returncode == 2 and "--partition 7" in no_partition.stderr
    missing = f"missing-{names['topic']}"
    no_topic = bridge(stack, "offsets", "reset", "--group", names["group"], "--schema",
                      names["schema"], "--topic", missing, "--to", "0")  # fmt: skip
    assert no_topic.returncode == 2 and "missing-" in no_topic.stderr
    moves = sql(stack, f"SELECT count(*) FROM {names['schema']}.offset_resets")[0][0]
    assert moves == 2 + 2 + 1 + 2 + 2  # one audit row per partition moved, none for refusals


@pytest.mark.secured
def test_txn_show_reads_committed_epochs_and_abort_fences_a_lingering_transaction(
    stack: Endpoints, names: dict[str, str]
) -> None:
    prefix, markers, data = f"tx-{uuid.uuid4().hex[:8]}", f"m-{names['topic']}", names["topic"]
    create_topic(stack.bootstrap_servers, markers, config=stack.properties())
    create_topic(stack.bootstrap_servers, data, config=stack.properties())
    kafka = stack.client("producer")

    def sink_id(partition: int, epoch: int) -> str:  # as the sink's default naming has it
        where = TaskCoordinates(query_id="q", prefix=prefix, partition=partition, epoch=epoch,
                                attempt=0)  # fmt: skip
        return where.transactional_id(IdNaming.POOLED)

    for partition, epoch in ((0, 0), (0, 1), (1, 0)):
        producer = transactional_producer(
            stack.bootstrap_servers,
            sink_id(partition, epoch),
            config=stack.properties("producer"),
        )
        reader = MarkerReader(kafka, prefix=prefix, partition=partition, marker_topic=markers)
        producer.begin_transaction()
        producer.produce(data, value=f"{partition}/{epoch}".encode())
        producer.send_offsets_to_transaction(
            marker_position(markers, epoch, {"rows": 1}), reader.group_metadata(), 30
        )
        producer.commit_transaction(30)
        reader.close()

    shown = bridge(stack, "txn", "show", "--prefix", prefix, "--marker-topic", markers,
                   "--format", "json")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    epochs = json.loads(shown.stdout)
    assert [(e["partition"], e["epoch"], e["details"]["rows"]) for e in epochs] == [
        (0, 1, 1),
        (1, 0, 1),
    ]

    lingering = transactional_producer(
        stack.bootstrap_servers, sink_id(1, 1), config=stack.properties("producer")
    )
    lingering.begin_transaction()
    lingering.produce(data, value=b"never")
    lingering.flush(30)
    admin = KafkaAdmin(stack.client())
    held = admin.log_ranges([(data, 0)])[(data, 0)]
    assert held.last_stable < held.high_watermark, "the open transaction holds read_committed"

    aborted = bridge(stack, "txn", "abort", "--prefix", prefix, "--epoch", "1",
                     "--partitions", "1")  # fmt: skip
    assert aborted.returncode == 0, aborted.stderr
    assert f"fenced {prefix}-p1-s1" in aborted.stdout and f"{prefix}-p1-s0" not in aborted.stdout
    eventually(lambda: admin.log_ranges([(data, 0)])[(data, 0)].last_stable > held.last_stable)
    assert sorted(read_all(stack.bootstrap_servers, data, config=stack.properties())) == [
        b"0/0", b"0/1", b"1/0"
    ]  # fmt: skip
    with pytest.raises(KafkaException):
        lingering.commit_transaction(30)  # fenced: the zombie cannot commit any more

    pool = bridge(stack, "txn", "abort", "--prefix", prefix, "--partitions", "1")
    assert pool.returncode == 0, pool.stderr  # no epoch: each id of the partition's pool
    assert f"fenced {prefix}-p1-s0" in pool.stdout and f"fenced {prefix}-p1-s1" in pool.stdout
    refused = bridge(stack, "txn", "abort", "--prefix", prefix, "--partitions", "1",
                     "--naming", "per-epoch")  # fmt: skip
    assert refused.returncode == 2 and "--epoch is required" in refused.stderr


@pytest.mark.secured
def test_a_stored_offset_below_the_log_start_pauses_until_an_operator_resets_it(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], config=stack.properties())
    sql(stack, f"CREATE TABLE public.{names['table']} (id int)")
    stack.let_consumer_write(f"public.{names['table']}", schema=names["schema"])
    settings = settings_for(stack, names)
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(10)])
    with running(settings):
        eventually(lambda: count(stack, names) == 10)
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(10, 20)])  # never applied
    admin = AdminClient(stack.client())
    deleted = admin.delete_records([TopicPartition(names["topic"], 0, 15)])  # retention did it
    for future in deleted.values():
        future.result(30)

    with running(settings) as service:
        eventually(lambda: not service.ready and service.applied_total == 0 and
                   show(stack, names)[0]["out_of_range"])  # fmt: skip
        produce(stack, names["topic"], [(None, {"id": i}) for i in range(20, 25)])
        # Nothing must happen: the member's loop turns thrice after the records are committed.
        turned = service.turns
        eventually(lambda: service.turns >= turned + 3)
        assert count(stack, names) == 10, "no silent jump over the lost records"

        reset = bridge(stack, "offsets", "reset", "--group", names["group"], "--schema",
                       names["schema"], "--topic", names["topic"], "--to", "earliest",
                       "--execute", "--force")  # fmt: skip
        assert reset.returncode == 0, reset.stderr
        # The member claims the partition again at the log start and applies what is left.
        # Offsets: 0-9 ids 0-9, 10 a commit marker, 11-20 ids 10-19: ids 14-19 survive.
        eventually(lambda: count(stack, names) == 10 + 6 + 5 and service.ready)
    assert sql(stack, f"SELECT min(id), max(id) FROM public.{names['table']} WHERE id >= 10") == [
        (14, 24)
    ]
