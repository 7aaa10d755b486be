"""Faults under the producer job, a real `bridge produce` process: its driver killed with SIGKILL
(the whole process group: Python driver, JVM and Python workers) at chosen and at random
moments, then restarted from its checkpoint; stopped with SIGTERM; the broker restarted
mid-epoch; the link to Kafka silent past the transaction timeout."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.kafka_admin import create_topic, offset_range
from bridge.names import DEFAULT_MARKER_TOPIC, DEFAULT_TRANSACTIONAL_ID_HEAD
from spark_jobs.epoch_markers import MarkerReader
from tests.harness import Endpoints
from tests.integration.test_sink import write_orders
from tests.kafka_helpers import header_map, read_all, read_messages
from tests.toxiproxy import Proxy

pytestmark = pytest.mark.slow

# Small splits, so that a few small files make several write tasks per epoch.
SPLITS = ["--spark-conf", "spark.sql.files.maxPartitionBytes=65536",
          "--spark-conf", "spark.sql.files.openCostInBytes=0"]  # fmt: skip


class Producer:
    """`bridge produce` as a separate process group, for one input directory and checkpoint."""

    def __init__(self, stack: Endpoints, tmp_path: Path, topic: str, *extra: str) -> None:
        self.stack = stack
        self.tmp_path = tmp_path
        self.checkpoint = tmp_path / "checkpoint"
        self.rules = tmp_path / "faults.json"
        self.log = tmp_path / "producer.log"
        self.argv = [
            sys.executable, "-m", "bridge_shell.cli", "produce", "--source", "files",
            "--input", str(tmp_path / "in"), "--topic", topic, "--key-field", "id",
            "--checkpoint", str(self.checkpoint), "--stack-dir", str(tmp_path / "no-stack"),
            *extra,
        ]  # fmt: skip

    def start(self, rules: list[dict[str, object]] | None = None) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
        env["BRIDGE_KAFKA__BOOTSTRAP_SERVERS"] = self.stack.bootstrap_servers
        if rules is not None:
            self.rules.write_text(json.dumps(rules))
            env["BRIDGE_SINK_FAULTS"] = str(self.rules)
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def run_to_end(self, timeout: float = 240) -> None:
        process = self.start()
        assert process.wait(timeout) == 0, self.log.read_text()[-3000:]

    def fired(self, rule: int = 0) -> bool:
        """Whether the rule fired: its file is created exclusively, then the pid it fired in is
        written, so an empty file is a firing still under way."""
        path = Path(f"{self.rules}.{rule}.fired")
        return path.exists() and path.read_text().endswith("\n")

    def wait_fired(self, process: subprocess.Popen[bytes], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not self.fired():
            assert process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"the fault point was never reached in {timeout:.0f} s; the job's log ends:\n"
                + self.log.read_text()[-3000:]
            )
            time.sleep(0.2)


def wait_for_marker(
    stack: Endpoints, producer: Producer, *, partition: int, epoch: int, timeout: float = 60
) -> None:
    """Until (partition, epoch) is committed in Kafka: its marker says so. The sink's default
    prefix comes from the query id, which Spark keeps in the checkpoint's metadata file."""
    deadline = time.monotonic() + timeout
    metadata = producer.checkpoint / "metadata"
    while not metadata.exists():  # written when the query starts
        assert time.monotonic() < deadline, "the query never started"
        time.sleep(0.2)
    query_id = json.loads(metadata.read_text())["id"]
    reader = MarkerReader(
        {"bootstrap.servers": stack.bootstrap_servers},
        prefix=DEFAULT_TRANSACTIONAL_ID_HEAD + query_id,
        partition=partition,
        marker_topic=DEFAULT_MARKER_TOPIC,
    )
    try:
        while (marker := reader.read(timeout=10)) is None or marker.epoch < epoch:
            assert time.monotonic() < deadline, f"partition {partition} never committed {epoch}"
            time.sleep(0.2)
    finally:
        reader.close()


def kill_group(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def assert_exactly(stack: Endpoints, topic: str, partitions: int, expected: list[bytes]) -> None:
    seen = Counter(read_all(stack.bootstrap_servers, topic, partitions=partitions, timeout=60))
    doubled = sum(1 for n in seen.values() if n > 1)
    assert doubled == 0, f"{doubled} records written more than once"
    assert set(seen) == set(expected), f"{len(set(expected) - set(seen))} records missing"


def started_to_fault(
    stack: Endpoints,
    tmp_path: Path,
    topic: str,
    rule: dict[str, object],
    *extra: str,
    partitions: int = 3,
) -> tuple[Producer, subprocess.Popen[bytes], list[bytes]]:
    """8,000 orders in 4 files, 2 files per epoch, and a job started with `rule`, once the
    rule has fired: the producer, its process and the records expected in the end."""
    create_topic(stack.bootstrap_servers, topic, partitions=partitions)
    expected = write_orders(tmp_path / "in", files=4, rows_per_file=2000)
    producer = Producer(stack, tmp_path, topic, "--max-files-per-trigger", "2", *extra, *SPLITS)
    process = producer.start([rule])
    producer.wait_fired(process)
    return producer, process, expected


def test_driver_killed_after_kafka_commit_before_spark_commit_log(
    stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    create_topic(stack.bootstrap_servers, topic_name, partitions=3)
    expected = write_orders(tmp_path / "in", files=4, rows_per_file=2000)
    producer = Producer(stack, tmp_path, topic_name, "--max-files-per-trigger", "2", *SPLITS)

    # Partition 0 of epoch 1 commits its transaction, then hangs: Spark never logs epoch 1.
    process = producer.start(
        [{"point": "after-commit", "partition": 0, "epoch": 1, "action": "hang"}]
    )
    producer.wait_fired(process)
    wait_for_marker(stack, producer, partition=1, epoch=1)  # another task of epoch 1 committed
    kill_group(process)
    assert (producer.checkpoint / "offsets" / "1").exists()
    assert not (producer.checkpoint / "commits" / "1").exists()

    producer.run_to_end()

    assert_exactly(stack, topic_name, 3, expected)
    progress = json.loads((producer.checkpoint / "bridge-sink-progress.json").read_text())
    replayed = [e for e in progress["recent"] if e["epoch"] == 1]
    assert replayed and 0 in replayed[-1]["partitions_skipped"], replayed


def test_driver_killed_mid_epoch_replay_releases_read_committed_readers(
    stack: Endpoints,
    topic_name: str,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    # One Kafka partition: the dead attempt's open transaction holds back everything after it.
    # A long transaction timeout, so that only the replay's fencing can release the readers.
    producer, process, expected = started_to_fault(
        stack, tmp_path, topic_name,
        {"point": "before-commit", "partition": 1, "epoch": 1, "action": "hang"},
        "--transaction-timeout-ms", "600000", partitions=1,
    )  # fmt: skip
    wait_for_marker(stack, producer, partition=0, epoch=1)  # committed, while partition 1 is open
    kill_group(process)
    killed_at = time.monotonic()

    stuck = _first_offset_of(stack, topic_name, partition=1, epoch=1)
    assert _last_stable_offset(stack, topic_name) <= stuck, "the open transaction holds nothing"

    # Only two things end the dead attempt's transaction: the replay's init_transactions on its
    # id, or the 600 s transaction timeout. Readers released within 240 s of the restart (and
    # still held just before it, above) were released by the replay's fencing.
    restarted_at = time.monotonic()
    process = producer.start()
    released_at = None
    while process.poll() is None or released_at is None:
        if released_at is None and _last_stable_offset(stack, topic_name) > stuck:
            released_at = time.monotonic()
        assert time.monotonic() - restarted_at < 240, (
            "read_committed readers still held 240 s after the restart: the replay did not fence "
            "the dead attempt\n" + producer.log.read_text()[-3000:]
        )
        time.sleep(0.1)
    assert process.returncode == 0, producer.log.read_text()[-3000:]

    held = released_at - killed_at
    print(f"read_committed held {held:.1f}s after the kill, {released_at - restarted_at:.1f}s "
          "after the restart")  # fmt: skip
    record_property("held_after_kill_s", round(held, 1))
    assert_exactly(stack, topic_name, 1, expected)


def _first_offset_of(stack: Endpoints, topic: str, *, partition: int, epoch: int) -> int:
    offsets = [
        m.offset()
        for m in read_messages(stack.bootstrap_servers, topic, isolation="read_uncommitted")
        if header_map(m).get("bridge.partition") == str(partition).encode()
        and header_map(m).get("bridge.epoch") == str(epoch).encode()
    ]
    assert offsets, f"no record of partition {partition} epoch {epoch} in the log"
    return min(o for o in offsets if o is not None)


def _last_stable_offset(stack: Endpoints, topic: str) -> int:
    return offset_range(stack.bootstrap_servers, [(topic, 0)])[(topic, 0)][1]


# A line an operator would have to read: Spark's or Hadoop's WARN or ERROR, a Java stack frame
# or exception, a Python traceback, or one of bridge's own JSON lines at WARNING or above.
_NOISE = re.compile(
    r' (WARN|ERROR) |^\s+at |Exception|Traceback|"level": "(warning|error|critical)"'
)


# Spark's word that an epoch took longer than the trigger: about the epoch (a slow machine, a
# test's pause), said whether or not a stop follows it.
_EPOCH_SLOWER_THAN_ITS_TRIGGER = "WARN ProcessingTimeExecutor: Current batch is falling behind"


def noisy_lines(output: str) -> list[str]:
    return [
        line
        for line in output.splitlines()
        if _NOISE.search(line) and _EPOCH_SLOWER_THAN_ITS_TRIGGER not in line
    ]


def committed_epochs(checkpoint: Path) -> int:
    """Epochs in Spark's commit log: the job's progress, whatever the machine's speed."""
    commits = checkpoint / "commits"
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.is_dir() else 0


@pytest.mark.heavy
def test_driver_killed_at_random_moments_until_done(
    stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("BRIDGE_TEST_SEED", time.time()))
    chance = random.Random(seed)  # noqa: S311 - test timing, not secrets
    create_topic(stack.bootstrap_servers, topic_name, partitions=3)
    expected = write_orders(tmp_path / "in", files=30, rows_per_file=10_000)
    producer = Producer(stack, tmp_path, topic_name, "--max-files-per-trigger", "2", *SPLITS)

    # Moments drawn from the job's progress rather than the clock, which a faster job or
    # machine outruns: in its start-up, or 1-2 epochs on and then anywhere in an epoch, within
    # its commit or between epochs. 15 epochs outlast three kills of up to ~4 epochs each.
    kills = 0
    for _ in range(3):
        process = producer.start()
        epochs_on = chance.randint(0, 2)
        if epochs_on == 0:
            time.sleep(chance.uniform(1, 6))
        else:
            target = committed_epochs(producer.checkpoint) + epochs_on
            deadline = time.monotonic() + 180
            while committed_epochs(producer.checkpoint) < target and process.poll() is None:
                assert time.monotonic() < deadline, producer.log.read_text()[-3000:]
                time.sleep(0.1)
            time.sleep(chance.uniform(0, 1.5))
        if process.poll() is not None:  # finished before the kill
            assert process.returncode == 0, producer.log.read_text()[-3000:]
            break
        kill_group(process)
        kills += 1
    producer.run_to_end(timeout=300)

    assert kills >= 2, f"seed {seed}: the run finished before most kills"
    assert_exactly(stack, topic_name, 3, expected)


@pytest.mark.heavy
def test_sigterms_at_random_moments_each_stop_quietly_and_the_records_land_once(
    stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    """A deploy's SIGTERM, four times, each at a random moment of a running query: inside an
    epoch's tasks, in its commit hook, or between epochs. Each run exits 0, and after its line
    "stopping the query at its next epoch boundary" says nothing an operator would have to read
    (no WARN or ERROR, no Java stack trace, no Python traceback); the records land once."""
    seed = int(os.environ.get("BRIDGE_TEST_SEED", time.time()))
    chance = random.Random(seed)  # noqa: S311 - test timing, not secrets
    create_topic(stack.bootstrap_servers, topic_name, partitions=3)
    expected: list[bytes] = []
    streaming = ("--max-files-per-trigger", "1", *SPLITS)
    producer = Producer(stack, tmp_path, topic_name, *streaming, "--trigger", "1 second")
    for stop in range(4):
        # Files of each run's own: a run on a loaded machine, behind its trigger, takes epoch
        # after epoch before its stop lands, and must not leave the next run nothing to read.
        expected += write_orders(tmp_path / "in", files=3, rows_per_file=1000, first_file=3 * stop)
        start = producer.log.stat().st_size if producer.log.exists() else 0
        before = committed_epochs(producer.checkpoint)
        process = producer.start()
        try:
            deadline = time.monotonic() + 180
            while committed_epochs(producer.checkpoint) <= before:
                assert process.poll() is None, producer.log.read_text()[-3000:]
                assert time.monotonic() < deadline, producer.log.read_text()[-3000:]
                time.sleep(0.1)
        except BaseException:
            kill_group(process)  # not left running for the tests after this one
            raise
        time.sleep(chance.uniform(0, 2.5))
        process.send_signal(signal.SIGTERM)
        code = process.wait(120)
        said = producer.log.read_bytes()[start:].decode(errors="replace")
        where = f"seed {seed}, stop {stop}:\n{said[-4000:]}"
        assert code == 0, where
        _, found, stopping = said.partition("stopping the query at its next epoch boundary")
        assert found, where
        assert noisy_lines(stopping) == [], where
    Producer(stack, tmp_path, topic_name, *streaming).run_to_end()
    assert_exactly(stack, topic_name, 3, expected)


def test_a_streaming_producer_stopped_with_sigterm_exits_cleanly(
    stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    """How a supervisor stops it (systemd, Kubernetes, the soak): SIGTERM to the driver, while
    its main thread waits on the query inside a Py4J call."""
    create_topic(stack.bootstrap_servers, topic_name, partitions=3)
    expected = write_orders(tmp_path / "in", files=2, rows_per_file=500)
    producer = Producer(stack, tmp_path, topic_name, "--trigger", "1 second")
    process = producer.start()
    deadline = time.monotonic() + 120
    while not (producer.checkpoint / "commits" / "0").exists():  # Spark committed epoch 0
        assert process.poll() is None and time.monotonic() < deadline, producer.log.read_text()
        time.sleep(0.2)
    time.sleep(2)  # the query waits for its next trigger, with nothing new to read
    process.send_signal(signal.SIGTERM)
    code = process.wait(60)
    output = producer.log.read_text()
    assert code == 0, output[-3000:]
    assert "stopping the query" in output and "produced 1000 rows" in output, output[-3000:]
    assert_exactly(stack, topic_name, 3, expected)


def test_broker_restarted_mid_epoch_under_the_producer_job(
    stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    """The broker, which is also the transaction coordinator, SIGKILLed and started again while
    a write task holds an open transaction with its records sent: the task commits against the
    restarted broker, or fails and its retry fences it; either way each record once."""
    kafka = stack.kafka
    if kafka is None:
        pytest.skip("needs the local stack's Kafka process to kill it")
    producer, process, expected = started_to_fault(
        stack, tmp_path, topic_name,
        {"point": "before-commit", "partition": 0, "epoch": 1, "action": "pause", "seconds": 15},
    )  # fmt: skip
    kafka.kill()
    time.sleep(3)
    kafka.start()
    kafka.wait_ready(120)
    assert process.wait(240) == 0, producer.log.read_text()[-3000:]
    assert_exactly(stack, topic_name, 3, expected)


def test_kafka_link_silent_longer_than_the_transaction_timeout(
    stack: Endpoints, topic_name: str, tmp_path: Path, proxied_kafka: Proxy
) -> None:
    """No byte between the job and the broker for longer than `transaction.timeout.ms`, and no
    reset, while a task's transaction is open: the broker aborts it on its own; the task, back
    in touch, finds itself fenced or its commit refused, fails, and Spark's retry writes the
    partition again in a new transaction. Nothing is lost, nothing doubled, and the job ends."""
    through = replace(stack, bootstrap_servers=proxied_kafka.listen)
    producer, process, expected = started_to_fault(
        through, tmp_path, topic_name,
        {"point": "before-commit", "partition": 0, "epoch": 1, "action": "pause", "seconds": 3},
        "--transaction-timeout-ms", "10000",
    )  # fmt: skip
    proxied_kafka.silence()
    time.sleep(25)  # past the timeout and the broker's check for timed-out transactions (10 s)
    proxied_kafka.heal()
    healed = time.monotonic()
    assert process.wait(240) == 0, producer.log.read_text()[-3000:]
    print(f"the job ended {time.monotonic() - healed:.1f}s after the link healed")
    output = producer.log.read_text()
    # The paused task's first attempt failed (its transaction timed out on the broker) and a
    # retry wrote the partition.
    assert "partition 0 epoch 1 attempt 0" in output, output[-3000:]
    assert re.search(r"\[batchId = 1\] Lost task 0\.0 ", output), output[-3000:]
    assert_exactly(through, topic_name, 3, expected)
