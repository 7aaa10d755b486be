"""A user's own PySpark job, as the docs give it, from a topic made with `bridge topics create`
to a table the consumer makes: Avro keys and values through the registry, a tombstone that
deletes a row, run once from an activated virtualenv and once as `.venv/bin/python job.py`
without activating it (another `python3` first on PATH, as on a machine whose system Python
lacks the sink's packages)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from tests.consumer_helpers import drained, running, settings_for, sql
from tests.harness import Endpoints
from tests.integration.test_producer_faults import noisy_lines

PARTITIONS = 3

# docs/sink.md (a tombstone), docs/typed-records.md (encode, spark_packages) and the README's
# register(spark), put together as a user would.
JOB = """
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.registry_frames import encode
from spark_jobs.sink import register
from spark_jobs.spark_packages import spark_packages

source, checkpoint, bootstrap, topic, registry = sys.argv[1:6]
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.jars.packages", spark_packages())
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
register(spark)
options = {
    "kafka.bootstrap.servers": bootstrap,
    "topic": topic,
    "key.format": "avro",
    "value.format": "avro",
    "schema.registry.url": registry,
}
orders = (
    spark.readStream.schema("id BIGINT, amount DECIMAL(12,2), deleted BOOLEAN")
    .option("maxFilesPerTrigger", 1)  # an epoch a file
    .json(source)
)
rows = orders.select(
    F.struct("id").alias("key"),
    F.when(F.col("deleted"), F.lit(None))  # a tombstone for deleted rows
    .otherwise(F.struct("id", "amount"))
    .alias("value"),
)
query = (
    encode(rows, options)
    .writeStream.format("bridge-kafka")
    .options(**options)
    .option("checkpointLocation", checkpoint)
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
spark.stop()
"""


def _inputs(directory: Path, lines: list[dict[str, object]], files: int = 1) -> Path:
    directory.mkdir()
    for n in range(files):
        of_file = lines[n::files]
        (directory / f"orders-{n}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in of_file))
    return directory


def _repeated_warnings(output: str, epochs: int) -> list[str]:
    """WARN lines (Spark's log4j, or a Python logger's WARNING) said once an epoch or more:
    noise a user learns to ignore, and then misses the one that matters."""
    said = Counter(
        re.sub(r"\d+", "N", line.split(" WARN", 1)[1])
        for line in output.splitlines()
        if " WARN" in line
    )
    return [line for line, times in said.items() if times >= epochs]


def _run(command: list[str], env: dict[str, str]) -> str:
    ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, f"{' '.join(command)}:\n{ran.stdout[-2000:]}{ran.stderr[-4000:]}"
    return ran.stdout + ran.stderr


@pytest.mark.heavy
def test_a_users_own_avro_job_with_a_tombstone_runs_with_and_without_an_activated_virtualenv(
    stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    topic, table = names["topic"], f"public.{names['table']}"
    venv_bin = Path(sys.executable).parent  # the virtualenv's bin, not the interpreter it links
    job = tmp_path / "job.py"
    job.write_text(JOB)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("BRIDGE_", "PYSPARK_", "VIRTUAL_ENV"))}  # fmt: skip
    tools = {"BRIDGE_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap_servers,
             "BRIDGE_STACK_DIR": "/nonexistent"}  # fmt: skip

    # Activated: `bridge` and `python` are the virtualenv's, first on PATH.
    activated = clean | tools | {
        "VIRTUAL_ENV": str(venv_bin.parent), "PATH": f"{venv_bin}:/usr/bin:/bin"
    }  # fmt: skip
    made = _run(["bridge", "topics", "create", topic, "--partitions", str(PARTITIONS)], activated)
    assert f"created topic {topic} with {PARTITIONS} partitions" in made
    first = _inputs(tmp_path / "first", [{"id": i, "amount": f"{i}.25"} for i in range(50)])
    _run(["python", str(job), str(first), str(tmp_path / "ck-first"), stack.bootstrap_servers,
          topic, registry_url], activated)  # fmt: skip

    # Not activated: another python3 first on PATH (the virtualenv's base interpreter, which
    # lacks its packages); the user runs the virtualenv's interpreter by its path.
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    (bare / "python3").symlink_to(os.path.realpath(sys.executable))
    plain = clean | tools | {"PATH": f"{bare}:/usr/bin:/bin"}
    again = _run([str(venv_bin / "bridge"), "topics", "create", topic, "--partitions", "5"], plain)
    assert f"exists already, with {PARTITIONS} partitions: left as it is" in again
    second = _inputs(
        tmp_path / "second",
        [{"id": i, "amount": f"{i}.5"} for i in range(50, 100)]
        + [{"id": i, "deleted": True} for i in range(10)],
        files=4,
    )
    said = _run([str(venv_bin / "python"), str(job), str(second), str(tmp_path / "ck-second"),
                 stack.bootstrap_servers, topic, registry_url], plain)  # fmt: skip
    assert "Spark's Python workers would run python3" in said
    assert said.count("committed:") >= 4, said[-3000:]  # an epoch a file
    assert _repeated_warnings(said, epochs=4) == [], said[-3000:]
    assert "[Stage " not in said, said[-3000:]  # Spark's console progress bar, in a log

    settings = settings_for(stack, names, registry_url=registry_url, value_format="avro",
                            key_format="avro", key_source="record_key", auto_create=True,
                            mode="upsert", key_columns=["id"])  # fmt: skip
    with running(settings):
        drained(stack, names, PARTITIONS)
    assert sql(stack, f"SELECT count(*), min(id), max(id), sum(amount) FROM {table}") == [
        (
            90,
            10,
            99,
            sum(Decimal(f"{i}.25") for i in range(10, 50))
            + sum(Decimal(f"{i}.50") for i in range(50, 100)),
        )
    ]
    assert sql(stack, f"SELECT count(*) FROM {names['schema']}.dead_letters") == [(0,)]


# docs/sink.md's graceful stop, in a job of the user's own with whole epochs: one file an epoch.
STOPPABLE_JOB = """
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.graceful_stop import stop_on_signal
from spark_jobs.sink import register

source, checkpoint, bootstrap, topic = sys.argv[1:5]
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
register(spark)
orders = spark.readStream.schema("id BIGINT, amount INT").option("maxFilesPerTrigger", 1)
rows = orders.json(source).select(
    F.col("id").cast("string").alias("key"), F.to_json(F.struct("id", "amount")).alias("value")
)
query = (
    rows.writeStream.format("bridge-kafka")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("topic", topic)
    .option("epochs", "whole")
    .option("checkpointLocation", checkpoint)
    .trigger(processingTime="1 second")
    .start()
)
print("stopped by a signal" if stop_on_signal(query) else "ended")
spark.stop()
"""


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_users_own_job_stopped_mid_epoch_finishes_the_epoch_first_quietly(
    stack: Endpoints, names: dict[str, str], tmp_path: Path, how: str
) -> None:
    """While the driver's commit hook of epoch 1 is under way, SIGTERM from a supervisor to the
    job, or SIGINT to its whole process group as a terminal's Ctrl-C sends it (the JVM that
    PySpark starts too): the job's `stop_on_signal` lets the epoch finish, then stops; exit 0,
    no traceback (Python's or Java's), and every epoch in the manifest has its record."""
    from bridge.kafka_admin import create_topic
    from bridge.names import DEFAULT_EPOCHS_TOPIC
    from tests.integration.test_epoch_manifest import _query_of, manifest_of

    topic = names["topic"]
    create_topic(stack.bootstrap_servers, topic, partitions=PARTITIONS)
    source = tmp_path / "in"
    source.mkdir()
    for n in range(2):
        lines = [{"id": n * 100 + i, "amount": i} for i in range(100)]
        (source / f"part-{n}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    job = tmp_path / "job.py"
    job.write_text(STOPPABLE_JOB)
    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps([{"point": "manifest-before-commit", "epoch": 1,
                                  "action": "pause", "seconds": 4}]))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "PYSPARK_"))}
    env["BRIDGE_SINK_FAULTS"] = str(rules)
    checkpoint = tmp_path / "checkpoint"
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(job), str(source), str(checkpoint), stack.bootstrap_servers,
             topic], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        fired = Path(f"{rules}.0.fired")
        deadline = time.monotonic() + 180
        while not (fired.exists() and fired.read_text().endswith("\n")):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        if how == "sigterm":
            process.send_signal(signal.SIGTERM)
        else:
            os.killpg(process.pid, signal.SIGINT)
        code = process.wait(120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # the JVM with it
            process.wait(30)
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert "stopped by a signal" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "Exception" not in output, output[-3000:]  # a JVM's stack trace names one
    stopping = output.split("stopping the query at its next epoch boundary", 1)[-1]
    assert noisy_lines(stopping) == [], output[-3000:]
    parts, records = manifest_of(stack, DEFAULT_EPOCHS_TOPIC, _query_of(checkpoint))
    assert {epoch for epoch, _ in parts} == set(records) == {0, 1}
