"""The Spark session of the producer job, the tests and the benchmark, built one way."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from bridge.maven import cached_jars_dir, repo_root, resolve_jars
from spark_jobs.sink import register

ENV_SPARK_KAFKA_JARS = "BRIDGE_SPARK_KAFKA_JARS"
# Two cores, and up to four attempts per task as on a cluster (plain local[N] never retries).
DEFAULT_MASTER = "local[2,4]"


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka connector (source and built-in sink), resolved from Maven Central once."""
    pom = repo_root() / "spark_jobs" / "jars" / "pom.xml"
    jars_dir = resolve_jars(
        pom,
        cached_jars_dir(pom, "spark-kafka-jars", ENV_SPARK_KAFKA_JARS),
        override_env=ENV_SPARK_KAFKA_JARS,
    )
    return sorted(str(jar) for jar in jars_dir.glob("*.jar"))


def build_session(
    app_name: str,
    *,
    master: str | None = None,
    with_kafka_connector: bool = False,
    conf: dict[str, str] | None = None,
) -> Any:
    """A session with the bridge-kafka sink registered.

    Under spark-submit the master and the Python interpreter come from spark-submit; run as a plain
    Python program, the workers must use this interpreter (the virtualenv's), or they import from
    the system Python and fail.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is not None or not under_spark_submit:
        builder = builder.master(master or DEFAULT_MASTER)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        # A Python worker that dies (the sink runs there) prints its traceback, not only a code.
        "spark.python.worker.faulthandler.enabled": "true",
        **(conf or {}),
    }
    if with_kafka_connector:
        settings["spark.jars"] = ",".join(spark_kafka_jars())
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("BRIDGE_SPARK_LOG_LEVEL", "WARN"))
    register(spark)
    return spark


def checkpoint_progress_path(checkpoint: Path) -> Path:
    """Where the producer job keeps the sink's per-epoch counters: beside Spark's own logs."""
    return checkpoint / "bridge-sink-progress.json"
