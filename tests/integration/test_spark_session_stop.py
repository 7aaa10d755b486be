"""`stop_session`: the producer job's way to stop its Spark session without PySpark's wait for
its accumulator server. In a process of its own: the tests' shared session must stay up."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Runs a Python worker (so that the JVM connects to the accumulator server, which is what made
# stop() wait), stops the session, then checks that the context is gone, that the server does
# shut down in the background, and that a new session in the same process runs a job.
_SCRIPT = textwrap.dedent(
    """
    import threading
    from pyspark import SparkContext
    from bridge_shell.spark.spark_session import build_session, stop_session

    spark = build_session("stop-session-test", master="local[2]")
    server = spark.sparkContext._accumulatorServer
    assert spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).sum() == 10
    stop_session(spark)
    assert SparkContext._active_spark_context is None, "the context is still active"
    for stopper in threading.enumerate():  # gone already if it was quick
        if stopper.name == "bridge-accumulator-server-stop":
            stopper.join(timeout=30)
            assert not stopper.is_alive(), "the accumulator server did not shut down"
    assert server.server_shutdown
    assert server.socket.fileno() == -1, "the accumulator server still listens"
    again = build_session("stop-session-test-again", master="local[2]")
    assert again.sparkContext.parallelize(range(4), 2).map(lambda x: x * 2).sum() == 12
    stop_session(again)
    print("stopped twice")
    """
)


def test_stop_session_stops_spark_and_its_accumulator_server() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stopped twice" in done.stdout
