"""The producer job on a real Spark standalone cluster (a master and two workers, each its own
JVM started with spark-class, as `bridge stack up --spark-workers 2` starts them): what the
executors need is shipped with the job, and the exactly-once guarantee holds when an executor,
a whole worker or the driver is killed mid-epoch. Totals are checked by an independent
read_committed reader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.kafka_admin import create_topic
from bridge_shell.spark.executor_env import default_executor_python
from bridge_shell.spark.spark_home import installed_spark_home
from bridge_shell.stack import process
from bridge_shell.stack.spark import DaemonPorts, SparkCluster
from tests.cli import run_bridge
from tests.harness import Endpoints
from tests.integration.test_producer_faults import (
    Producer,
    assert_exactly,
    kill_group,
    started_to_fault,
)
from tests.integration.test_sink import write_orders

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.xdist_group("spark-cluster")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    def ports() -> DaemonPorts:
        return DaemonPorts(rpc=process.free_port(), web_ui=process.free_port())

    spark = SparkCluster(
        home=tmp_path_factory.mktemp("spark-cluster"),
        master=ports(),
        workers=[ports(), ports()],
        worker_cores=2,
        worker_memory="1g",
    )
    spark.start()
    try:
        spark.wait_ready(timeout=120)
        yield spark
    finally:
        spark.stop()
        assert process.wait_until(lambda: not spark.executor_pids(), timeout=30)


# The first attempt of one task of the second epoch stops after 300 of its rows, its transaction
# open, until its process is killed.
HANG_MID_EPOCH = {"point": "mid-produce", "partition": 0, "epoch": 1, "attempt": 0,
                  "after_rows": 300, "action": "hang"}  # fmt: skip


def on_cluster(cluster: SparkCluster, tmp_path: Path) -> tuple[str, ...]:
    """The producer's options for the cluster; the fault rules reach the executors through
    their environment (`Producer.start` writes them to tmp_path/faults.json)."""
    rules = tmp_path / "faults.json"
    return ("--master", cluster.master_url,
            "--spark-conf", f"spark.executorEnv.BRIDGE_SINK_FAULTS={rules}",
            "--spark-conf", "spark.executor.memory=768m")  # fmt: skip


def executor_of(cluster: SparkCluster, worker_pid: int) -> int:
    """The executor JVM a Python worker runs under (its parent daemon's parent)."""
    executors = set(cluster.executor_pids())
    pid = worker_pid
    while pid > 1:
        if pid in executors:
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    raise AssertionError(f"Python worker {worker_pid} runs under no executor of the cluster")


def fired_pid(producer: Producer) -> int:
    return int(Path(f"{producer.rules}.0.fired").read_text())


def test_an_executor_killed_mid_epoch_is_replaced_and_the_retried_task_writes_once(
    cluster: SparkCluster, stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    producer, job, expected = started_to_fault(
        stack, tmp_path, topic_name, HANG_MID_EPOCH, *on_cluster(cluster, tmp_path)
    )
    worker = fired_pid(producer)
    os.kill(executor_of(cluster, worker), signal.SIGKILL)

    assert job.wait(240) == 0, producer.log.read_text()[-3000:]
    assert_exactly(stack, topic_name, 3, expected)
    # The hung attempt went with its executor: nothing of it is left running.
    assert process.wait_until(lambda: process.cmdline(worker) is None, timeout=30)
    # The write tasks ran in executors, from the environment the job shipped them.
    logs = [path.read_text() for path in cluster.home.glob("worker-*/work/app-*/*/stderr")]
    assert any("Committed partition" in log for log in logs), "no write task ran on an executor"
    assert list(cluster.home.glob("worker-*/work/app-*/*/bridge-env/spark_jobs/sink.py"))


def test_a_worker_lost_with_its_executor_mid_epoch_leaves_the_job_to_the_other(
    cluster: SparkCluster, stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    producer, job, expected = started_to_fault(
        stack, tmp_path, topic_name, HANG_MID_EPOCH, *on_cluster(cluster, tmp_path)
    )
    executor = executor_of(cluster, fired_pid(producer))
    cwd = Path(f"/proc/{executor}/cwd").resolve()
    lost = next(w for w in cluster.workers if cwd.is_relative_to(w.home))
    lost.kill()  # the machine goes: its worker daemon and its executor at once
    os.kill(executor, signal.SIGKILL)
    try:
        assert job.wait(240) == 0, producer.log.read_text()[-3000:]
        assert_exactly(stack, topic_name, 3, expected)
    finally:
        cluster.start()  # the worker comes back for the tests after this one
        cluster.wait_ready(timeout=120)


def test_the_driver_killed_mid_epoch_restarts_from_its_checkpoint_on_the_cluster(
    cluster: SparkCluster, stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    """The epoch the dead driver left half committed was planned with both workers' executors
    registered; the restarted driver plans it again with none (the workers come back only once
    it has), as a driver restarted on a busy cluster can. The replay skips the partitions the
    markers name, so it must split the epoch exactly as before (`epoch_splits`): Spark alone
    sizes a file source's splits from the cores registered, and wrote rows twice here."""
    rule = {"point": "before-commit", "partition": 0, "epoch": 1, "action": "hang"}
    producer, job, expected = started_to_fault(
        stack, tmp_path, topic_name, rule, *on_cluster(cluster, tmp_path)
    )
    kill_group(job)
    # The master ends the dead driver's application, and its executors with it.
    deadline = time.monotonic() + 60
    while cluster.executor_pids():
        assert time.monotonic() < deadline, "the dead driver's executors kept running"
        time.sleep(0.5)

    for worker in cluster.workers:
        worker.kill()
    start = producer.log.stat().st_size
    replay = producer.start()
    try:
        # Spark says so once the replayed epoch's tasks wait for executors: it is planned.
        deadline = time.monotonic() + 180
        while "has not accepted any resources" not in producer.log.read_text()[start:]:
            assert replay.poll() is None, producer.log.read_text()[-3000:]
            assert time.monotonic() < deadline, producer.log.read_text()[-3000:]
            time.sleep(0.5)
    finally:
        cluster.start()
        cluster.wait_ready(timeout=120)
    assert replay.wait(240) == 0, producer.log.read_text()[-3000:]
    assert_exactly(stack, topic_name, 3, expected)


def test_plain_spark_submit_runs_the_job_with_the_environment_bridge_packs(
    cluster: SparkCluster, stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    """The README's standalone command line: `bridge executor-env`, then spark-submit with the
    options it prints, from the directory that holds the unpacked copy."""
    # The executors' Python has none of the sink's libraries: all comes in the archive.
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = [default_executor_python(), "-c", "import confluent_kafka"]
    assert subprocess.run(probe, env=bare, capture_output=True, check=False).returncode != 0

    packed = run_bridge("executor-env", "--output", str(tmp_path / "bridge-env"))
    assert packed.returncode == 0, packed.stdout + packed.stderr
    options = packed.stdout.strip().splitlines()[-1].split()
    assert options[0] == "--archives", packed.stdout

    create_topic(stack.bootstrap_servers, topic_name, partitions=3)
    expected = write_orders(tmp_path / "in", files=2, rows_per_file=2500)
    home = installed_spark_home()
    assert home is not None
    repo = Path(__file__).resolve().parents[2]
    argv = [
        str(home / "bin" / "spark-submit"), "--master", cluster.master_url, *options,
        "--conf", f"spark.pyspark.driver.python={sys.executable}",
        str(repo / "bridge_shell" / "cli" / "spark_submit.py"),
        # Hadoop URIs, as a cluster's storage would be named (file: is the one here).
        "--source", "files", "--input", (tmp_path / "in").as_uri(), "--topic", topic_name,
        "--key-field", "id", "--checkpoint", (tmp_path / "checkpoint").as_uri(),
        "--bootstrap-servers", stack.bootstrap_servers, "--stack-dir", str(tmp_path / "none"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "PYSPARK_"))}
    env["SPARK_HOME"] = str(home)
    submitted = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-3000:]
    assert "produced 5000 rows" in submitted.stdout, submitted.stdout
    assert_exactly(stack, topic_name, 3, expected)
    assert (tmp_path / "checkpoint" / "commits" / "0").exists()  # the URI's checkpoint
