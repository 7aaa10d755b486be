"""An executor pod's command: the environment Spark's Kubernetes scheduler sets, as the
executor's JVM command line Spark's own image would run, and a clear refusal without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.errors import ConfigError
from bridge_shell.spark.pod_executor import BACKEND, executor_command, with_init

POD = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@bridge-producer-driver.ns.svc:7078",
    "SPARK_EXECUTOR_ID": "3", "SPARK_EXECUTOR_CORES": "1", "SPARK_EXECUTOR_MEMORY": "1024m",
    "SPARK_APPLICATION_ID": "spark-1f", "SPARK_EXECUTOR_POD_IP": "10.0.0.7",
    "SPARK_RESOURCE_PROFILE_ID": "0", "SPARK_EXECUTOR_POD_NAME": "bridge-producer-exec-3",
    "SPARK_JAVA_OPT_10": "-Dspark.b=2", "SPARK_JAVA_OPT_2": "-Dspark.a=1",
    "JAVA_HOME": "/usr/lib/jvm/java-17",
}  # fmt: skip


def test_the_pod_environment_becomes_spark_s_executor_command() -> None:
    home = Path("/opt/cache/bridge/spark-home-abc")
    assert executor_command(POD, home) == [
        "/usr/lib/jvm/java-17/bin/java", "-Dspark.a=1", "-Dspark.b=2", "-Xms1024m", "-Xmx1024m",
        "-cp", f"{home}/conf:{home}/jars/*", BACKEND,
        "--driver-url", POD["SPARK_DRIVER_URL"], "--executor-id", "3", "--cores", "1",
        "--app-id", "spark-1f", "--hostname", "10.0.0.7", "--resourceProfileId", "0",
        "--podName", "bridge-producer-exec-3",
    ]  # fmt: skip


def test_without_the_pods_environment_it_is_refused_naming_each_setting() -> None:
    with pytest.raises(ConfigError) as refused:
        executor_command({"SPARK_EXECUTOR_ID": "3"}, Path("/h"))
    said = str(refused.value)
    assert "SPARK_DRIVER_URL" in said and "SPARK_EXECUTOR_MEMORY" in said
    assert "SPARK_EXECUTOR_ID" not in said
    assert "Kubernetes scheduler sets it" in said


def test_tini_comes_first_only_as_the_containers_first_process() -> None:
    command = ["java", "-version"]
    assert with_init(command, first_process=False) == command
    wrapped = with_init(command, first_process=True)
    assert wrapped == command or (wrapped[1:4] == ["-s", "--", "java"])
