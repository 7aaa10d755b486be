"""The epoch manifest on real Spark and the real broker: every epoch's record names the parts
that count its records, through an empty epoch, several topics, tasks without input, a driver
killed before, inside and after its commit hook, and an executor's worker killed mid-task; and
through the kills, a consumer group with whole epochs shows a reader only whole epochs."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from bridge.epoch_manifest import Epoch, Part, parse
from bridge.kafka_admin import create_topic
from bridge.names import DEFAULT_EPOCHS_TOPIC
from tests.consumer_helpers import eventually, running, settings_for, sql
from tests.epoch_helpers import Reader, reading
from tests.harness import Endpoints
from tests.integration.test_producer_faults import (
    assert_exactly,
    kill_group,
    started_to_fault,
    wait_for_marker,
)
from tests.kafka_helpers import header_map, read_messages


def manifest_of(
    stack: Endpoints, epochs_topic: str, query: str
) -> tuple[dict[tuple[int, int], list[Part]], dict[int, list[Epoch]]]:
    """The manifest's records of `query` a read_committed reader sees: parts by (epoch,
    partition), epoch records by epoch, each in log order."""
    parts: dict[tuple[int, int], list[Part]] = defaultdict(list)
    epochs: dict[int, list[Epoch]] = defaultdict(list)
    for message in read_messages(stack.bootstrap_servers, epochs_topic, config=stack.properties()):
        record = parse(message.value())
        if record.query != query:
            continue  # another test's query on the shared default topic
        if isinstance(record, Part):
            parts[record.epoch, record.partition].append(record)
        else:
            epochs[record.epoch].append(record)
    return dict(parts), dict(epochs)


Placed = dict[tuple[int, int], dict[str, dict[int, list[int]]]]


def records_by_epoch(
    stack: Endpoints, topics: dict[str, int], query: str
) -> tuple[dict[int, Counter[str]], Placed]:
    """How many records of `query` each epoch put in each topic (topic -> its partitions), and
    each task's records' offsets: (epoch, Spark partition) -> topic -> Kafka partition."""
    counts: dict[int, Counter[str]] = defaultdict(Counter)
    placed: Placed = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for topic, partitions in topics.items():
        for message in read_messages(
            stack.bootstrap_servers, topic, partitions=partitions, config=stack.properties()
        ):
            headers = header_map(message)
            if headers["bridge.query"].decode() == query:
                epoch, task = int(headers["bridge.epoch"]), int(headers["bridge.partition"])
                counts[epoch][topic] += 1
                placed[epoch, task][topic][message.partition()].append(message.offset())  # type: ignore[index, arg-type]
    return dict(counts), placed


def assert_whole(
    stack: Endpoints, epochs_topic: str, topics: dict[str, int], query: str, epochs: set[int]
) -> dict[int, list[Epoch]]:
    """Every epoch of `epochs` has a record; all its records say the same; it names exactly the
    parts written for it, once each, and their counts are its records in every topic; each
    part's offset ranges name exactly its task's records."""
    parts, records = manifest_of(stack, epochs_topic, query)
    written, placed = records_by_epoch(stack, topics, query)
    assert set(records) == epochs, f"epoch records for {sorted(records)}, expected {epochs}"
    for epoch, seen in records.items():
        assert len({record for record in seen}) == 1, f"epoch {epoch}: records differ: {seen}"
        named = set(seen[0].parts)
        assert named == {p for (e, p) in parts if e == epoch}, f"epoch {epoch}: {named}"
        counted: Counter[str] = Counter()
        for partition in named:
            (part,) = parts[epoch, partition]  # one part per task, whatever was replayed
            counted.update({t: n for t, n in part.records.items() if n})
            offsets = {
                topic: {p: [o for first, last in r for o in range(first, last + 1)]
                        for p, r in of_topic.items()}
                for topic, of_topic in part.offsets.items()
            }  # fmt: skip
            assert offsets == placed.get((epoch, partition), {}), f"part {epoch}/{partition}"
        assert counted == written.get(epoch, Counter()), f"epoch {epoch}"
    assert set(written) <= epochs
    return records


def _query_of(checkpoint: Path) -> str:
    return str(json.loads((checkpoint / "metadata").read_text())["id"])


def test_each_epoch_is_named_whole_across_topics_empty_tasks_and_an_empty_epoch(
    spark: Any, stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    orders, lines, epochs_topic = f"{topic_name}-o", f"{topic_name}-l", f"{topic_name}-epochs"
    for topic in (orders, lines):
        create_topic(stack.bootstrap_servers, topic, partitions=3, config=stack.properties())
    source = tmp_path / "in"
    source.mkdir()
    # Three files, one an epoch: one all dropped, so its epoch writes nothing.
    for number, (first, dropped) in enumerate([(0, False), (1000, True), (2000, False)]):
        rows = [{"id": first + i, "drop": dropped} for i in range(300)]
        (source / f"f{number}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    frame = (
        spark.readStream.schema("id BIGINT, drop BOOLEAN")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .where(~F.col("drop"))
        .select(
            F.when(F.col("id") % 3 == 0, F.lit(lines)).otherwise(F.lit(orders)).alias("topic"),
            F.to_json(F.struct("id")).alias("value"),
            F.col("id").cast("string").alias("key"),
        )
        .repartition(5)  # more tasks than 300 rows need: some have no input
    )
    checkpoint = tmp_path / "checkpoint"
    writer = frame.writeStream.format("bridge-kafka").option("checkpointLocation", str(checkpoint))
    for name, value in stack.properties("producer").items():
        writer = writer.option(f"kafka.{name}", value)
    query = (
        writer.option("kafka.bootstrap.servers", stack.bootstrap_servers)
        .option("epochs", "whole")
        .option("epochs.topic", epochs_topic)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()

    records = assert_whole(
        stack, epochs_topic, {orders: 3, lines: 3}, _query_of(checkpoint), {0, 1, 2}
    )
    # The epoch of the dropped file is whole with no part; the others name theirs.
    assert sorted(len(seen[0].parts) == 0 for seen in records.values()) == [False, False, True]


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize(
    ("rule", "records_of_epoch_1"),
    [
        # Before the hook: a task of epoch 1 committed and hangs; the replay's tasks skip.
        ({"point": "after-commit", "partition": 0, "epoch": 1, "action": "hang"}, 1),
        # Inside it: the epoch's transaction is open when the driver dies; the replay's shows.
        ({"point": "manifest-before-commit", "epoch": 1, "action": "hang"}, 1),
        # After it: the record is in Kafka; the replay writes the same record again.
        ({"point": "manifest-after-commit", "epoch": 1, "action": "hang"}, 2),
        # An executor's Python worker dies in the middle of a task: Spark retries the task.
        ({"point": "mid-produce", "partition": 1, "epoch": 1, "after_rows": 300,
          "action": "exit"}, 1),
    ],
    ids=["before-the-hook", "inside-the-hook", "after-the-hook", "executor-killed-mid-task"],
)  # fmt: skip
def test_a_driver_killed_around_its_commit_hook_leaves_every_epoch_whole(
    stack: Endpoints,
    names: dict[str, str],
    topic_name: str,
    tmp_path: Path,
    rule: dict[str, object],
    records_of_epoch_1: int,
) -> None:
    """The manifest stays whole through each kill; and a consumer group with whole epochs,
    running all along, shows a reader of its table each epoch at once, never part of one."""
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, amount int, note text, "
               "epoch_no bigint)")  # fmt: skip
    route = {"topic": topic_name, "table": table, "epochs": "whole",
             "metadata": {"epoch_no": "spark.epoch"}}  # fmt: skip
    reader = Reader(stack.dsn, [table], {0: 4000, 1: 4000})  # 2 files of 2,000 an epoch
    for topic, partitions in ((topic_name, 3), (DEFAULT_EPOCHS_TOPIC, 1)):
        create_topic(stack.bootstrap_servers, topic, partitions=partitions)  # before the group
    with running(settings_for(stack, names, consumer={"routes": [route]})), reading(reader):
        producer, process, expected = started_to_fault(
            stack, tmp_path, topic_name, rule, "--epochs", "whole"
        )
        if rule["point"] == "after-commit":
            wait_for_marker(stack, producer, partition=1, epoch=1)  # another task of it committed
        if rule["action"] == "hang":
            kill_group(process)
            assert not (producer.checkpoint / "commits" / "1").exists()  # Spark replays epoch 1
            producer.run_to_end()
        else:
            assert process.wait(240) == 0, producer.log.read_text()[-3000:]
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {table}")[0][0] == 8000)
    assert reader.partial == [], f"part of an epoch seen: {reader.partial[:5]}"
    assert sql(stack, f"SELECT count(DISTINCT id), count(*) FROM {table}") == [(8000, 8000)]

    assert_exactly(stack, topic_name, 3, expected)
    query = _query_of(producer.checkpoint)
    records = assert_whole(stack, DEFAULT_EPOCHS_TOPIC, {topic_name: 3}, query, {0, 1})
    assert len(records[1]) == records_of_epoch_1


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule",
    [
        # A task of epoch 1 has written its records and waits before its commit.
        {"point": "before-commit", "partition": 0, "epoch": 1, "action": "pause", "seconds": 4},
        # Every task of epoch 1 committed; the driver's commit hook waits before its record.
        {"point": "manifest-before-commit", "epoch": 1, "action": "pause", "seconds": 4},
    ],
    ids=["in-a-task", "in-the-hook"],
)
def test_a_deploys_sigterm_mid_epoch_lets_the_epoch_finish_then_stops(
    stack: Endpoints, topic_name: str, tmp_path: Path, rule: dict[str, object]
) -> None:
    """A supervisor's SIGTERM while epoch 1 is in flight: the job lets it finish, its tasks and
    its record, then stops with exit 0. Spark logged the epoch (nothing to replay), and every
    epoch in the manifest has its record: no consumer group waits on an open epoch."""
    producer, process, expected = started_to_fault(
        stack, tmp_path, topic_name, rule, "--epochs", "whole", "--trigger", "1 second"
    )
    process.send_signal(signal.SIGTERM)
    code = process.wait(120)
    output = producer.log.read_text()
    assert code == 0, output[-3000:]
    assert "the query stopped between epochs" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert not re.search(r"^%\d\|", output, re.MULTILINE), output[-3000:]  # raw librdkafka
    # One format for bridge's own lines, the Python workers' included; py4j's chatter is gone.
    assert '"logger": "bridge.sink", "message": "epoch 1 committed' in output, output[-3000:]
    assert "bridge-kafka INFO" not in output and '"logger": "py4j' not in output, output[-3000:]
    assert (producer.checkpoint / "commits" / "1").exists()  # Spark logged epoch 1
    query = _query_of(producer.checkpoint)
    parts, records = manifest_of(stack, DEFAULT_EPOCHS_TOPIC, query)
    assert {epoch for epoch, _ in parts} == set(records) == {0, 1}
    assert_exactly(stack, topic_name, 3, expected)
