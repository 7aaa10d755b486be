"""The Spark driver JVM's log4j2 levels, set from Python through Py4J.

Spark narrates a query's deliberate stop as if it were a fault: `query.stop()` cancels the
query's job group twice, and the DAGScheduler warns "Failed to cancel job group" each time no
job of it runs (which is every stop between epochs); a stop that meets an epoch as it begins
interrupts the stream thread inside Hadoop's `Shell` (a WARN with an `InterruptedException` and
~50 frames) or a broadcast (`ERROR TorrentBroadcast: Store broadcast ... fail`). An operator
learns to ignore such lines, then misses the one that matters. `quieted` silences exactly those
loggers around the stop, and gives them back their levels after it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger("bridge.sink")

# What a deliberate stop makes Spark and Hadoop log, and nothing else does at that moment.
STOP_NOISE = (
    "org.apache.spark.scheduler.DAGScheduler",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.broadcast.TorrentBroadcast",
    "org.apache.hadoop.util.Shell",
)
# How long the loggers stay off after the stop for the scheduler to reach the stop's
# cancellations: milliseconds when it has executors (measured 20-100 ms), never without.
_DRAIN_BOUND_S = 10.0


@contextlib.contextmanager
def quieted(loggers: Sequence[str] = STOP_NOISE) -> Iterator[None]:
    """`loggers` off inside the block, back to their own levels after it. The DAGScheduler
    handles a cancellation on its event loop, after `query.stop()` has returned: the block's
    end first waits for that loop to reach a one-task job of its own, submitted behind them.
    Nothing happens where this Python has no driver JVM (Spark Connect, an executor)."""
    jvm = _driver_jvm()
    if jvm is None:
        yield
        return
    previous = _levels(jvm, loggers)
    if not previous:  # levels it cannot read, it does not change
        yield
        return
    _set(jvm, dict.fromkeys(loggers, "OFF"))
    try:
        yield
    finally:
        _drain_scheduler(jvm)
        _set(jvm, previous)


def _driver_jvm() -> Any | None:
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    context = SparkContext._active_spark_context
    return None if context is None else SparkContext._jvm


def _levels(jvm: Any, loggers: Sequence[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in loggers:
        try:
            level = jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel()
        except Exception:  # noqa: BLE001 - a JVM without log4j2 keeps its own levels
            return {}
        found[name] = None if level is None else str(level.name())
    return found


def _set(jvm: Any, levels: dict[str, str | None]) -> None:
    for name, level in levels.items():
        if level is None:
            continue
        try:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                name, jvm.org.apache.logging.log4j.Level.toLevel(level)
            )
        except Exception as exc:  # noqa: BLE001 - quieter logs are not worth a failed stop
            log.debug("log level of %s not set: %s", name, exc)
            return


def _drain_scheduler(jvm: Any) -> None:
    """Run a one-element job in the JVM alone (no Python worker): the DAGScheduler's events are
    handled in order, so once it ends, the stop's cancellations have been handled. It runs in a
    thread of its own, waited for `_DRAIN_BOUND_S` at most: a cluster with no executor left
    would never run it, and a stop must end (the job is then cancelled with the context)."""

    def drain() -> None:
        with contextlib.suppress(Exception):  # a stopped context: nothing left to drain
            from pyspark import SparkContext

            context = SparkContext._active_spark_context
            if context is None:
                return
            one = jvm.java.util.ArrayList()
            one.add(0)
            context._jsc.parallelize(one, 1).count()

    runner = threading.Thread(target=drain, name="bridge-stop-drain", daemon=True)
    runner.start()
    runner.join(_DRAIN_BOUND_S)
