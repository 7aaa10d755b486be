"""The bridge-kafka sink on real Spark (local[2]) and the real broker: exactly once per row."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from bridge.kafka_admin import KafkaAdmin, create_topic
from bridge_shell.spark.producer_job import ProducerJob, Source, run
from spark_jobs.epoch_markers import MarkerReader
from spark_jobs.epoch_transaction import (
    EpochTransaction,
    EpochWriteError,
    TaskCoordinates,
)
from spark_jobs.kafka_rows import RecordChunk
from spark_jobs.progress import SinkCounters
from spark_jobs.sink_options import SinkOptions
from tests.conftest import FaultRules
from tests.harness import Endpoints
from tests.kafka_helpers import header_map, read_all, read_messages, transactional_producer

PARTITIONS = 3


def write_orders(
    directory: Path, files: int, rows_per_file: int, *, first_file: int = 0
) -> list[bytes]:
    """JSON-lines files of orders with unique ids; returns the lines the sink should write.
    `first_file`: the number of the first file, for files added to a directory later."""
    directory.mkdir(parents=True, exist_ok=True)
    lines: list[bytes] = []
    for f in range(first_file, first_file + files):
        chunk = [
            json.dumps({"id": f * rows_per_file + i, "amount": i % 97, "note": "x" * 20})
            for i in range(rows_per_file)
        ]
        (directory / f"orders-{f:03d}.jsonl").write_text("\n".join(chunk) + "\n")
        lines.extend(line.encode() for line in chunk)
    return lines


def files_job(stack: Endpoints, tmp_path: Path, topic: str, **extra: Any) -> ProducerJob:
    return ProducerJob(
        source=Source.FILES,
        input=tmp_path / "in",
        topic=topic,
        checkpoint=tmp_path / "checkpoint",
        bootstrap_servers=stack.bootstrap_servers,
        kafka_properties=stack.properties("producer"),
        key_field="id",
        max_files_per_trigger=2,
        **extra,
    )


@pytest.fixture
def topic(stack: Endpoints, topic_name: str) -> str:
    create_topic(
        stack.bootstrap_servers, topic_name, partitions=PARTITIONS, config=stack.properties()
    )
    return topic_name


def assert_exactly(stack: Endpoints, topic: str, expected: list[bytes]) -> None:
    seen = Counter(
        read_all(stack.bootstrap_servers, topic, partitions=PARTITIONS, config=stack.properties())
    )
    doubled = {value: n for value, n in seen.items() if n > 1}
    assert not doubled, (
        f"{len(doubled)} records written more than once, e.g. {next(iter(doubled))!r}"
    )
    assert set(seen) == set(expected), (
        f"{len(set(expected) - set(seen))} missing, {len(set(seen) - set(expected))} unexpected"
    )


@pytest.mark.secured
def test_every_row_lands_once_with_its_provenance(
    spark: Any, stack: Endpoints, topic: str, tmp_path: Path
) -> None:
    expected = write_orders(tmp_path / "in", files=6, rows_per_file=1500)
    counters = run(files_job(stack, tmp_path, topic), spark)

    assert_exactly(stack, topic, expected)
    assert counters.rows_written == len(expected)
    assert counters.epochs_committed == 3  # 6 files, 2 per trigger
    assert counters.partitions_written > counters.epochs_committed  # several tasks per epoch

    messages = read_messages(
        stack.bootstrap_servers, topic, partitions=PARTITIONS, config=stack.properties()
    )
    query_ids = {header_map(m)["bridge.query"] for m in messages}
    assert len(query_ids) == 1
    assert {int(header_map(m)["bridge.epoch"]) for m in messages} == {0, 1, 2}
    first = messages[0]
    assert first.key() == str(json.loads(first.value() or b"")["id"]).encode()


@pytest.mark.secured
def test_failed_attempt_is_retried_and_its_records_stay_invisible(
    spark: Any, stack: Endpoints, topic: str, tmp_path: Path, fault_rules: FaultRules
) -> None:
    expected = write_orders(tmp_path / "in", files=2, rows_per_file=2000)
    prefix = f"retry-{uuid.uuid4().hex[:8]}"
    rules = fault_rules(
        [{"point": "mid-produce", "prefix": prefix, "partition": 1, "epoch": 0, "attempt": 0,
          "after_rows": 300, "action": "fail"}]
    )  # fmt: skip

    run(files_job(stack, tmp_path, topic, transactional_id_prefix=prefix), spark)

    assert Path(f"{rules}.0.fired").exists(), "the first attempt did not reach the fault"
    assert_exactly(stack, topic, expected)
    # The failed attempt did write 300 records before it failed: only its abort hides them.
    everything = read_all(
        stack.bootstrap_servers,
        topic,
        partitions=PARTITIONS,
        isolation="read_uncommitted",
        config=stack.properties(),
    )
    assert len(everything) == len(expected) + 300


@pytest.mark.secured
def test_replayed_epoch_writes_nothing(
    spark: Any, stack: Endpoints, topic: str, tmp_path: Path
) -> None:
    """Spark replays an epoch that is in its offset log but not in its commit log (the driver died
    between the Kafka commits and its own). Here the commit log entry is removed by hand, which
    leaves the checkpoint as such a crash does; test_producer_faults.py kills a real driver."""
    expected = write_orders(tmp_path / "in", files=4, rows_per_file=1000)
    job = files_job(stack, tmp_path, topic)
    first = run(job, spark)
    assert first.epochs_committed == 2
    for entry in ("1", ".1.crc"):  # the entry and the checksum Hadoop's file system keeps
        (Path(job.checkpoint) / "commits" / entry).unlink(missing_ok=True)

    again = run(job, spark)

    assert_exactly(stack, topic, expected)
    assert again.rows_written == first.rows_written  # the replay added no rows
    assert again.partitions_skipped == first.partitions_written - _written_in_epoch(first, 0)


def _written_in_epoch(counters: SinkCounters, epoch: int) -> int:
    written = [e["partitions_written"] for e in counters.recent if e["epoch"] == epoch]
    return sum(len(partitions) for partitions in written if isinstance(partitions, list))


@pytest.mark.parametrize("epochs", ["per-partition", "whole"])
def test_zombie_cannot_commit_after_a_newer_holder_initialised_its_id(
    stack: Endpoints, topic: str, epochs: str
) -> None:
    """With `whole`, the zombie's part of the manifest waits for its delivery reports first:
    the flush of a fenced producer fails the task as any write of it does."""
    options = SinkOptions.parse(
        {"kafka.bootstrap.servers": stack.bootstrap_servers, "topic": topic, "epochs": epochs}
    )
    create_topic(stack.bootstrap_servers, options.marker_topic)
    create_topic(stack.bootstrap_servers, options.epochs_topic)
    prefix = f"zombie-{uuid.uuid4().hex[:8]}"

    def coordinates(attempt: int) -> TaskCoordinates:
        return TaskCoordinates(query_id="q", prefix=prefix, partition=0, epoch=5, attempt=attempt)

    successor_done = threading.Event()
    zombie_started = threading.Event()

    def zombie_rows() -> Iterator[RecordChunk]:
        yield RecordChunk.of([(topic, f"zombie-{i}".encode(), None, 0, []) for i in range(100)])
        zombie_started.set()
        successor_done.wait(60)  # paused, as a GC pause or a lost executor would pause it
        yield RecordChunk.of([(topic, b"zombie-late", None, 0, [])])

    failure: list[BaseException] = []

    def zombie() -> None:
        try:
            with EpochTransaction(options, coordinates(0)) as transaction:
                transaction.write(zombie_rows)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    thread = threading.Thread(target=zombie)
    thread.start()
    assert zombie_started.wait(60)
    with EpochTransaction(options, coordinates(1)) as successor:
        outcome = successor.write(
            lambda: iter(
                [RecordChunk.of([(topic, f"successor-{i}".encode(), None, 0, [])
                                 for i in range(200)])]
            )
        )  # fmt: skip
    successor_done.set()
    thread.join(60)

    assert outcome.rows == 200 and not outcome.skipped
    assert len(failure) == 1 and isinstance(failure[0], EpochWriteError), failure
    assert failure[0].fatal, failure[0]
    values = read_all(stack.bootstrap_servers, topic, partitions=PARTITIONS)
    assert sorted(values) == sorted(f"successor-{i}".encode() for i in range(200))

    # A third holder finds the marker of epoch 5 and writes nothing.
    with EpochTransaction(options, coordinates(2)) as third:
        again = third.write(lambda: iter([]))
    assert again.skipped
    reader = MarkerReader(
        options.kafka, prefix=prefix, partition=0, marker_topic=options.marker_topic
    )
    marker = reader.read(timeout=30)
    reader.close()
    assert marker is not None and marker.epoch == 5 and marker.details["rows"] == 200


def test_per_partition_naming_replays_exactly_too(
    spark: Any, stack: Endpoints, topic: str, tmp_path: Path
) -> None:
    expected = write_orders(tmp_path / "in", files=4, rows_per_file=1000)
    prefix = f"bounded-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"

    def run_query() -> None:
        query = (
            spark.readStream.option("maxFilesPerTrigger", 2)
            .text(str(tmp_path / "in"))
            .writeStream.format("bridge-kafka")
            .option("kafka.bootstrap.servers", stack.bootstrap_servers)
            .option("topic", topic)
            .option("transactional.id.prefix", prefix)
            .option("transactional.id.naming", "per-partition")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run_query()
    for entry in ("1", ".1.crc"):
        (checkpoint / "commits" / entry).unlink(missing_ok=True)
    run_query()

    assert_exactly(stack, topic, expected)


@pytest.mark.secured
def test_kafka_source_feeds_the_sink(
    spark: Any, stack: Endpoints, topic: str, tmp_path: Path
) -> None:
    """The producer job's kafka source: Spark's connector from spark_jobs/jars/pom.xml."""
    source = f"src-{uuid.uuid4().hex[:8]}"
    create_topic(stack.bootstrap_servers, source, partitions=2, config=stack.properties())
    feeder = transactional_producer(stack.bootstrap_servers, config=stack.properties())
    feeder.begin_transaction()
    for i in range(1000):
        feeder.produce(source, key=str(i).encode(), value=json.dumps({"id": i}).encode())
    feeder.commit_transaction(30)

    job = ProducerJob(
        source=Source.KAFKA,
        source_topic=source,
        topic=topic,
        checkpoint=tmp_path / "checkpoint",
        bootstrap_servers=stack.bootstrap_servers,
        kafka_properties=stack.properties("producer"),
        key_field="key",
    )
    counters = run(job, spark)

    assert counters.rows_written == 1000
    values = read_all(
        stack.bootstrap_servers, topic, partitions=PARTITIONS, config=stack.properties()
    )
    rows = [json.loads(v) for v in values]
    assert sorted(json.loads(r["value"])["id"] for r in rows) == list(range(1000))
    assert {r["source_topic"] for r in rows} == {source}


def test_a_record_larger_than_kafka_accepts_stops_the_query_with_a_clear_error(
    spark: Any, stack: Endpoints, topic: str, tmp_path: Path
) -> None:
    """Nothing is written, and the error names the row, its size and the limit: the task's
    retries fail alike and the query stops, rather than retrying forever."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "big.txt").write_text("small\n" + "x" * 2_000_000 + "\n")
    query = (
        spark.readStream.text(str(tmp_path / "in"))
        .writeStream.format("bridge-kafka")
        .option("kafka.bootstrap.servers", stack.bootstrap_servers)
        .option("topic", topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(
        StreamingQueryException, match=r"larger than message\.max\.bytes"
    ) as failure:
        query.awaitTermination()
    assert "2000000 bytes of key and value" in str(failure.value)
    assert read_all(stack.bootstrap_servers, topic, partitions=PARTITIONS) == []


def test_a_null_value_from_spark_is_a_tombstone_that_deletes_its_key(
    spark: Any, stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    """As docs/sink.md says: a row whose `value` is null and whose `key` is set becomes a
    tombstone, and a keyed route deletes the row of that key."""
    from pyspark.sql import functions as F

    from tests.consumer_helpers import drained, running, settings_for, sql

    create_topic(stack.bootstrap_servers, names["topic"], partitions=2, config=stack.properties())
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, amount int)")
    stack.let_consumer_write(table, schema=names["schema"])
    source = tmp_path / "in"
    source.mkdir()
    for number, rows in enumerate([
        [{"id": 1, "amount": 5}, {"id": 2, "amount": 7}, {"id": 3, "amount": 9}],
        [{"id": 1, "deleted": True}, {"id": 3, "amount": 10}],  # a later epoch
    ]):  # fmt: skip
        (source / f"f{number}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    frame = (
        spark.readStream.schema("id BIGINT, amount INT, deleted BOOLEAN")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .select(
            F.col("id").cast("string").alias("key"),
            F.when(F.col("deleted"), F.lit(None).cast("string"))
            .otherwise(F.to_json(F.struct("id", "amount")))
            .alias("value"),
        )
    )
    writer = frame.writeStream.format("bridge-kafka")
    for name, value in stack.properties("producer").items():
        writer = writer.option(f"kafka.{name}", value)
    query = (
        writer.option("kafka.bootstrap.servers", stack.bootstrap_servers)
        .option("topic", names["topic"])
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()

    settings = settings_for(
        stack, names, mode="upsert", key_columns=["id"], key_source="record_key"
    )
    with running(settings):
        drained(stack, names, 2)
    assert sql(stack, f"SELECT id, amount FROM {table} ORDER BY id") == [(2, 7), (3, 10)]


def test_a_job_run_by_the_virtualenvs_python_without_activating_it_writes_its_rows(
    stack: Endpoints, topic: str, tmp_path: Path
) -> None:
    """`.venv/bin/python job.py` with another `python3` first on PATH (the virtualenv's own
    base interpreter, without its packages): Spark would start its workers with that one; the
    sink's registration gives them the driver's interpreter instead, and says so."""
    import os
    import subprocess
    import sys

    expected = write_orders(tmp_path / "in", files=1, rows_per_file=200)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    job = tmp_path / "job.py"
    job.write_text(f"""
from pyspark.sql import SparkSession
from spark_jobs.sink import register

spark = SparkSession.builder.master("local[1]").getOrCreate()
register(spark)
orders = spark.readStream.schema("id BIGINT, amount INT, note STRING").json(
    {str(tmp_path / "in")!r}
)
query = (
    orders.selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")
    .writeStream.format("bridge-kafka")
    .option("kafka.bootstrap.servers", {stack.bootstrap_servers!r})
    .option("topic", {topic!r})
    .option("checkpointLocation", {str(tmp_path / "checkpoint")!r})
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
spark.stop()
""")
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("BRIDGE_", "PYSPARK_", "VIRTUAL_ENV"))
    }  # fmt: skip
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    ran = subprocess.run(
        [sys.executable, str(job)], env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "Spark's Python workers would run python3" in ran.stderr
    written = read_all(
        stack.bootstrap_servers, topic, partitions=PARTITIONS, config=stack.properties()
    )
    assert sorted(json.loads(v)["id"] for v in written) == sorted(
        json.loads(line)["id"] for line in expected
    )


def test_the_manifest_topic_keeps_its_parts_as_long_as_the_sink_says(
    spark: Any, stack: Endpoints, topic: str, tmp_path: Path
) -> None:
    """Created by the sink with `epochs.retention.ms` (7 days, Kafka's default for every topic)
    and deleted by age; one that exists and keeps them less, or compacts them, refuses the
    query at start, naming the option and the command that mends the topic."""
    write_orders(tmp_path / "in", files=1, rows_per_file=10)

    def started(epochs_topic: str, run_name: str, **options: str) -> None:
        writer = (
            spark.readStream.text(str(tmp_path / "in"))
            .writeStream.format("bridge-kafka")
            .option("kafka.bootstrap.servers", stack.bootstrap_servers)
            .option("topic", topic)
            .option("epochs.topic", epochs_topic)
            .option("checkpointLocation", str(tmp_path / run_name))
        )
        for name, value in {**stack.properties("producer"), **options}.items():
            writer = writer.option(name if name.startswith("epochs.") else f"kafka.{name}", value)
        writer.trigger(availableNow=True).start().awaitTermination(120)

    admin = KafkaAdmin({"bootstrap.servers": stack.bootstrap_servers, **stack.properties()})
    created = f"{topic}-epochs"
    started(created, "created")
    settings = admin.topic_configs(created)
    assert (settings["cleanup.policy"], settings["retention.ms"]) == ("delete", str(7 * 86_400_000))

    hour = f"{topic}-hour"
    create_topic(stack.bootstrap_servers, hour, config=stack.properties(),
                 topic_config={"retention.ms": "3600000"})  # fmt: skip
    with pytest.raises(StreamingQueryException) as refused:
        started(hour, "refused")
    message = str(refused.value)
    assert "epochs.retention.ms" in message and "retention.ms=3600000" in message, message
    assert f"--entity-name {hour}" in message, message
    # Told to take what the topic keeps, the query runs.
    started(hour, "told", **{"epochs.retention.ms": "3600000"})
    assert len(read_all(stack.bootstrap_servers, topic, partitions=PARTITIONS,
                        config=stack.properties())) == 20  # fmt: skip
