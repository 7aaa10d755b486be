"""The parts of running on a cluster that need no cluster: where things are, what is shipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.errors import ConfigError
from bridge.settings import load_settings
from bridge_shell.spark.executor_env import ARCHIVE_ALIAS, ExecutorEnv, _members
from bridge_shell.spark.locations import local_path, progress_path, spark_location
from bridge_shell.stack.local import StackState


@pytest.mark.parametrize(
    ("location", "local"),
    [
        ("/data/in", Path("/data/in")),
        ("relative/in", Path("relative/in")),
        ("file:///data/in", Path("/data/in")),
        ("s3a://bucket/orders/", None),
        ("hdfs://namenode:8020/checkpoints/q1", None),
        ("abfss://c@account.dfs.core.windows.net/x", None),
    ],
)
def test_a_location_is_local_only_without_a_remote_scheme(
    location: str, local: Path | None
) -> None:
    assert local_path(location) == local


def test_a_remote_location_reaches_spark_unchanged_and_a_local_one_absolute() -> None:
    assert spark_location("s3a://bucket/orders/") == "s3a://bucket/orders/"
    assert spark_location("relative/in") == str(Path("relative/in").resolve())


def test_progress_stays_beside_a_local_checkpoint_and_on_the_driver_for_a_remote_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert progress_path(tmp_path / "cp") == tmp_path / "cp" / "bridge-sink-progress.json"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    remote = progress_path("hdfs://nn/checkpoints/q1")
    assert remote.parent == tmp_path / "state" / "bridge" / "progress"
    # The same query (a trailing slash aside) finds its counters again; another does not.
    assert progress_path("hdfs://nn/checkpoints/q1/") == remote
    assert progress_path("hdfs://nn/checkpoints/q2") != remote


MASTERS = ["local", "local[4]", "local[2,4]", "local[*]", "spark://10.0.0.1:7077", "yarn",
           "k8s://https://api:6443"]  # fmt: skip


@pytest.mark.parametrize("master", MASTERS)
def test_spark_masters_users_write_are_accepted(tmp_path: Path, master: str) -> None:
    assert (
        load_settings(env_file=tmp_path / "none", spark={"master": master}).spark.master == master
    )


def test_a_spark_master_that_is_not_one_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(env_file=tmp_path / "none", spark={"master": "127.0.0.1:7077"})
    assert "spark.master" in str(raised.value)


def test_the_stack_env_names_the_spark_master(tmp_path: Path) -> None:
    env = tmp_path / "stack.env"
    env.write_text("BRIDGE_SPARK__MASTER=spark://127.0.0.1:7077\n")
    assert load_settings(env_file=env).spark.master == "spark://127.0.0.1:7077"


def test_spark_workers_are_added_and_removed_keeping_the_ports_of_those_kept() -> None:
    state = StackState(kafka_port=1, controller_port=2, postgres_port=3, cluster_id="c")
    two = state.with_spark_workers(2)
    assert len(two.spark_master) == 2 and len(two.spark_workers) == 2
    three = two.with_spark_workers(3)
    assert three.spark_master == two.spark_master
    assert three.spark_workers[:2] == two.spark_workers
    assert state.with_spark_workers(0) == state
    assert two.with_spark_workers(0).spark_master == []


def test_the_shipped_environment_holds_the_sink_and_its_libraries_only() -> None:
    members = _members()
    tops = {name.split("/", 1)[0] for name in members}
    assert {"bridge", "spark_jobs", "confluent_kafka", "pyarrow", "tenacity"} <= tops
    # What the executors never import stays behind: the consumer, the database driver, Spark.
    assert not {"consumers", "psycopg", "pyspark", "pandas"} & tops
    assert "spark_jobs/sink.py" in members
    assert not any("__pycache__" in name for name in members if name.startswith("bridge/"))


def test_the_spark_settings_ship_the_archive_under_its_alias(tmp_path: Path) -> None:
    env = ExecutorEnv(directory=tmp_path / "env", archive=tmp_path / "env.tar")
    conf = env.spark_conf("/usr/bin/python3.11")
    assert conf["spark.archives"] == f"{tmp_path / 'env.tar'}#{ARCHIVE_ALIAS}"
    assert conf["spark.executorEnv.PYTHONPATH"] == ARCHIVE_ALIAS
    assert conf["spark.pyspark.python"] == "/usr/bin/python3.11"
