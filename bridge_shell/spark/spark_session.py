"""The Spark session of the producer job, the tests and the benchmark, built one way."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from bridge.private_apis import detach_accumulator_server
from bridge_shell.spark.executor_env import build_executor_env, default_executor_python
from bridge_shell.spark.spark_home import precompiled_spark_home
from spark_jobs.sink import register

log = logging.getLogger("bridge.spark")

# Two cores, and up to four attempts per task as on a cluster (plain local[N] never retries).
DEFAULT_MASTER = "local[2,4]"


# Keys whose values Spark hides in plans, its UI and event logs: the Kafka client's secrets, and
# the schema registry client's (`schema.registry.basic.auth.user.info`, bearer tokens, secrets).
REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|jaas|sasl\.|ssl\.key|user[.]info"


def build_session(
    app_name: str,
    *,
    master: str | None = None,
    jars: Sequence[str] = (),
    conf: dict[str, str] | None = None,
    executor_python: str | None = None,
) -> Any:
    """A session with the bridge-kafka sink registered.

    `jars`: extra jars for the driver and executors, such as Spark's Kafka connector for the
    kafka source (the shell resolves them; under spark-submit, `--jars` or `--packages` do).
    Under spark-submit the master and the Python interpreter come from spark-submit; run as a plain
    Python program, the workers must use this interpreter (the virtualenv's), or they import from
    the system Python and fail, and Spark runs from a home whose PySpark is compiled (see
    spark_home.py) unless SPARK_HOME names another.

    On a cluster master (not local[...]) the job ships what its executors need (see
    executor_env.py): they run `executor_python`, else PYSPARK_PYTHON, else the interpreter
    this one was made from. Under spark-submit, its own options do that.
    """
    under_spark_submit = started_by_spark_submit()
    shipped: dict[str, str] = {}
    if master is not None and on_cluster(master) and not under_spark_submit:
        shipped = _shipped_environment(executor_python)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
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
        **shipped,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        # A Python worker that dies (the sink runs there) prints its traceback, not only a code.
        "spark.python.worker.faulthandler.enabled": "true",
        # Spark's default, plus the Kafka client's JAAS line and SASL settings, which hold a
        # password: redacted by key (and by value) in plans, the UI and event logs.
        "spark.redaction.regex": REDACTION_REGEX,
        "spark.sql.redaction.options.regex": f"(?i)url|{REDACTION_REGEX.removeprefix('(?i)')}",
        **(conf or {}),
    }
    if conf and "spark.archives" in conf and "spark.archives" in shipped:
        # The user's archives and ours both travel.
        settings["spark.archives"] = f"{conf['spark.archives']},{shipped['spark.archives']}"
    if jars:
        settings["spark.jars"] = ",".join(jars)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("BRIDGE_SPARK_LOG_LEVEL", "WARN"))
    register(spark)
    return spark


def stop_session(spark: Any) -> None:
    """`spark.stop()`, without waiting for PySpark's accumulator server to notice.

    Once a Python worker has run, that server's request handler polls the JVM's connection once
    a second, and `SparkContext.stop` waits for its next poll before it returns: 0.75-0.9 s of
    every `bridge produce` run, measured, where Spark's own JVM sink (no Python worker) pays
    nothing. The server is shut down in the background instead; its thread is a daemon."""
    server = detach_accumulator_server(spark.sparkContext)
    spark.stop()
    if server is not None:
        threading.Thread(
            target=server.shutdown, name="bridge-accumulator-server-stop", daemon=True
        ).start()


def started_by_spark_submit() -> bool:
    """Whether spark-submit started this Python (its JVM is already up, its options rule)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def on_cluster(master: str) -> bool:
    """Whether executors run apart from the driver (anything but local[...])."""
    return not master.startswith("local")


def _shipped_environment(executor_python: str | None) -> dict[str, str]:
    """The settings that ship the executors' environment, and the driver's own environment
    for it: Spark starts some of the sink's Python processes beside the driver (creating the
    writer, committing an epoch) with the executors' interpreter, so they get the same files
    on their path, from the unpacked copy here."""
    env = build_executor_env()
    # The job's own setting first, then the environment's, then the default.
    python = executor_python or os.environ.get("PYSPARK_PYTHON") or default_executor_python()
    os.environ["PYSPARK_PYTHON"] = python
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(env.directory) not in path:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(env.directory), *path])
    return env.spark_conf(python)
