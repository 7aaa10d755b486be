"""The Spark session of the producer job, the tests and the benchmark, built one way."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spark_jobs.sink import register
from spark_jobs.spark_home import precompiled_spark_home

log = logging.getLogger("bridge.spark")

# Two cores, and up to four attempts per task as on a cluster (plain local[N] never retries).
DEFAULT_MASTER = "local[2,4]"


def build_session(
    app_name: str,
    *,
    master: str | None = None,
    jars: Sequence[str] = (),
    conf: dict[str, str] | None = None,
) -> Any:
    """A session with the bridge-kafka sink registered.

    `jars`: extra jars for the driver and executors, such as Spark's Kafka connector for the
    kafka source (the shell resolves them; under spark-submit, `--jars` or `--packages` do).
    Under spark-submit the master and the Python interpreter come from spark-submit; run as a plain
    Python program, the workers must use this interpreter (the virtualenv's), or they import from
    the system Python and fail, and Spark runs from a home whose PySpark is compiled (see
    spark_home.py) unless SPARK_HOME names another.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if not under_spark_submit and "SPARK_HOME" not in os.environ:
        # Before the JVM starts: it hands SPARK_HOME to every Python process it launches.
        try:
            home = precompiled_spark_home()
        except OSError as exc:  # a cache that cannot be written: slower, not wrong
            log.warning("Spark runs from its installed home (%s); its Python processes "
                        "compile PySpark as they start", exc)  # fmt: skip
            home = None
        if home is not None:
            os.environ["SPARK_HOME"] = str(home)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
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
    if jars:
        settings["spark.jars"] = ",".join(jars)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("BRIDGE_SPARK_LOG_LEVEL", "WARN"))
    register(spark)
    return spark


def checkpoint_progress_path(checkpoint: Path) -> Path:
    """Where the producer job keeps the sink's per-epoch counters: beside Spark's own logs."""
    return checkpoint / "bridge-sink-progress.json"
