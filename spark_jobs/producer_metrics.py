"""Prometheus metrics of the producer job, served by its driver.

A `StreamingQueryListener` in the driver's Python process hears of every micro-batch when Spark
has finished it. Spark's own figures come with the event (input and processing rates, the
batch's duration); the sink's (rows and bytes of each epoch, partitions skipped on replay,
aborted epochs, the per-task transaction overhead) are read from the progress file its commit
and abort hooks keep (`spark_jobs/progress.py`): those hooks run in short-lived Python workers,
where no metric could live.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from bridge.names import (
    METRIC_PRODUCER_BATCH_SECONDS,
    METRIC_PRODUCER_EPOCH_BYTES,
    METRIC_PRODUCER_EPOCH_ROWS,
    METRIC_PRODUCER_EPOCHS,
    METRIC_PRODUCER_INPUT_RATE,
    METRIC_PRODUCER_LAST_EPOCH,
    METRIC_PRODUCER_PARTITIONS_SKIPPED,
    METRIC_PRODUCER_PROCESSING_RATE,
    METRIC_PRODUCER_QUERY_ACTIVE,
    METRIC_PRODUCER_ROWS,
    METRIC_PRODUCER_TXN_OVERHEAD_SECONDS,
)
from spark_jobs.progress import SinkCounters

log = logging.getLogger("bridge.produce")

_SIZES = (1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8)
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ProducerMetrics:
    """The job's metrics, in a registry of its own."""

    def __init__(self, query_name: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.epochs = Counter(
            METRIC_PRODUCER_EPOCHS, "Epochs the sink committed or that Spark aborted.",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.rows = Counter(METRIC_PRODUCER_ROWS, "Rows written to Kafka.", registry=r)
        self.skipped = Counter(
            METRIC_PRODUCER_PARTITIONS_SKIPPED,
            "Partition-epochs a replay found already committed and wrote nothing for.",
            registry=r,
        )
        self.epoch_rows = Histogram(
            METRIC_PRODUCER_EPOCH_ROWS, "Rows per committed epoch.", buckets=_SIZES, registry=r
        )
        self.epoch_bytes = Histogram(
            METRIC_PRODUCER_EPOCH_BYTES, "Bytes of keys and values per committed epoch.",
            buckets=_SIZES, registry=r,
        )  # fmt: skip
        self.overhead = Histogram(
            METRIC_PRODUCER_TXN_OVERHEAD_SECONDS,
            "Per write task: init_transactions, the marker read and the commit.",
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.batch_seconds = Histogram(
            METRIC_PRODUCER_BATCH_SECONDS, "Micro-batch duration, as Spark measures it.",
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.input_rate = Gauge(
            METRIC_PRODUCER_INPUT_RATE, "Rows/s arriving, in the last micro-batch.", registry=r
        )
        self.processing_rate = Gauge(
            METRIC_PRODUCER_PROCESSING_RATE, "Rows/s processed, in the last micro-batch.",
            registry=r,
        )  # fmt: skip
        self.last_epoch = Gauge(
            METRIC_PRODUCER_LAST_EPOCH, "The last epoch the sink committed.", registry=r
        )
        self.active = Gauge(
            METRIC_PRODUCER_QUERY_ACTIVE, "1 while the query runs.", ["query"], registry=r
        )
        self.active.labels(query=query_name).set(0)
        self._query_name = query_name
        self._totals = SinkCounters()  # the file's cumulative counters, as last seen
        self._seen: set[tuple[object, ...]] = set()  # epoch summaries already observed

    def baseline(self, counters: SinkCounters) -> None:
        """What the progress file held before this driver started: earlier runs of the query
        (from the same checkpoint) are not counted again."""
        self._totals = counters
        self._seen = {_identity(summary) for summary in counters.recent}

    def progress(self, progress: Any, counters: SinkCounters) -> None:
        """One finished micro-batch: Spark's figures, the sink's counters' growth, and each
        epoch summary not yet observed."""
        self.input_rate.set(progress.inputRowsPerSecond or 0.0)
        self.processing_rate.set(progress.processedRowsPerSecond or 0.0)
        duration_ms = (progress.durationMs or {}).get("triggerExecution")
        if duration_ms is not None:
            self.batch_seconds.observe(duration_ms / 1000)
        before, self._totals = self._totals, counters
        self.epochs.labels(outcome="committed").inc(
            max(0, counters.epochs_committed - before.epochs_committed)
        )
        self.epochs.labels(outcome="aborted").inc(
            max(0, counters.epochs_aborted - before.epochs_aborted)
        )
        self.rows.inc(max(0, counters.rows_written - before.rows_written))
        self.skipped.inc(max(0, counters.partitions_skipped - before.partitions_skipped))
        for summary in counters.recent:
            identity = _identity(summary)
            if identity not in self._seen:
                self._seen.add(identity)
                self._observe(summary)
        if counters.last_committed_epoch is not None:
            self.last_epoch.set(counters.last_committed_epoch)

    def _observe(self, summary: dict[str, Any]) -> None:
        for overhead_ms in summary["transaction_overhead_ms"]:
            self.overhead.observe(overhead_ms / 1000)
        if summary["committed"]:
            self.epoch_rows.observe(summary["rows"])
            self.epoch_bytes.observe(summary.get("bytes", 0))

    def running(self, active: bool) -> None:
        self.active.labels(query=self._query_name).set(1 if active else 0)


class MetricsListener(StreamingQueryListener):
    """Feeds `ProducerMetrics` from Spark's query events."""

    def __init__(self, metrics: ProducerMetrics, progress_path: Path) -> None:
        self._metrics = metrics
        self._progress_path = progress_path

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        self._metrics.running(True)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        # An exception here would only be logged by Spark; a metric must never stop the query.
        try:
            self._metrics.progress(event.progress, SinkCounters.load(self._progress_path))
        except Exception:
            log.exception("producer metrics: a progress event could not be counted")

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        return

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        self._metrics.running(False)


def _identity(summary: dict[str, Any]) -> tuple[object, ...]:
    """Tells one epoch summary from another: a replay of an epoch has other partitions and
    other timings than the attempt before it."""
    return (
        summary["epoch"],
        summary["committed"],
        summary["rows"],
        tuple(summary["partitions_written"]),
        tuple(summary["transaction_overhead_ms"]),
    )


def serve_metrics(
    spark: Any, *, port: int, host: str, progress_path: Path, query_name: str
) -> tuple[ProducerMetrics, int]:
    """Register the listener and serve `/metrics` on `host:port` (0: any free port); returns
    the metrics and the port taken."""
    metrics = ProducerMetrics(query_name)
    metrics.baseline(SinkCounters.load(progress_path))
    server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    taken = int(server.server_address[1])
    spark.streams.addListener(MetricsListener(metrics, progress_path))
    log.info("producer metrics on http://%s:%d/metrics", host, taken)
    return metrics, taken
