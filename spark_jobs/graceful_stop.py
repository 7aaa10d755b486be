"""Stopping a streaming query between its epochs, so that a deploy is not a crash.

Spark's `query.stop()` interrupts the epoch in flight. Its write tasks may have committed their
Kafka transactions while the driver's commit hook has not written the epoch's record: with whole
epochs that epoch stays open in every consumer group's ledger, holding back every later epoch of
its query, until the query runs again and replays it. So a supervisor's SIGTERM (Kubernetes,
systemd) should let the epoch in flight finish first.

`stop_gracefully` waits, within a bound, for an epoch boundary and stops the query there:

- no trigger active (`StreamingQueryStatus.isTriggerActive` false: between triggers, or waiting
  for data), or
- a progress report for an epoch after the one in flight when the stop was asked: Spark reports
  an epoch's progress only once its sink has committed it (the tasks and the commit hook) and
  its commit log is written. A query whose next epoch starts at once is stopped as that epoch
  begins, before its tasks can have committed anything.

Past the bound it stops the query anyway and says so: the epoch in flight is replayed by the
next run, exactly as after a crash. `stop_on_signal` is what `bridge produce` runs, and what a
user's own job calls instead of `query.awaitTermination()` (docs/sink.md).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

from spark_jobs.jvm_loggers import quieted

log = logging.getLogger("bridge.sink")

# The one bound of a graceful stop: docs/sink.md quotes it, and the grace periods of the
# manifests and compose files that run the producer are above it
# (tests/unit/test_graceful_stop_bound.py), for Spark's own shutdown after it.
DEFAULT_TIMEOUT_S = 45.0
_POLL_S = 0.02  # how often the query's status is read while waiting for a boundary


def stop_gracefully(query: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Stop `query` (a PySpark `StreamingQuery`) at its next epoch boundary, waiting at most
    `timeout_s`; True when it stopped between epochs (or had already ended), False when the
    bound ran out and the epoch in flight was interrupted. Call it from the driver's main
    thread, never from a signal handler (see `stop_on_signal`)."""
    deadline = time.monotonic() + timeout_s
    in_flight = _batch_id(query)
    while query.isActive:
        status = query.status
        if not status["isTriggerActive"] or _batch_id(query) != in_flight:
            with quieted():  # a deliberate stop, not the faults Spark's lines would say
                query.stop()
            log.info("the query stopped between epochs")
            return True
        if time.monotonic() >= deadline:
            query.stop()
            log.warning(
                "the epoch in flight did not finish within %.0fs: the query was stopped inside "
                "it, and its next run replays it", timeout_s,
            )  # fmt: skip
            return False
        time.sleep(_POLL_S)
    return True


def stop_on_signal(query: Any, timeout_s: float = DEFAULT_TIMEOUT_S, poll_s: float = 1.0) -> bool:
    """Run until `query` ends on its own (raising its error if it failed), or until SIGTERM or
    SIGINT, then stop it between epochs (`stop_gracefully`). Returns whether a signal stopped
    it. The handlers only flag the request: the main thread may be inside a Py4J call, and a
    second call from a signal handler on the same connection breaks it (Py4J's "reentrant
    call"). Must be called from the main thread, where Python runs signal handlers."""
    requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not query.awaitTermination(poll_s):
            if requested.is_set():
                log.info("stopping the query at its next epoch boundary")
                stop_gracefully(query, timeout_s)
                return True
        return False
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _batch_id(query: Any) -> int | None:
    progress = query.lastProgress
    return None if progress is None else int(progress["batchId"])
