"""How the driver's metrics follow the sink's counters: earlier runs not counted again, a
replayed epoch not counted twice, every new summary observed once."""

from __future__ import annotations

from types import SimpleNamespace

from spark_jobs.producer_metrics import ProducerMetrics
from spark_jobs.progress import EpochSummary, SinkCounters

# The fields of Spark's StreamingQueryProgress that the metrics read.
PROGRESS = SimpleNamespace(
    inputRowsPerSecond=100.0, processedRowsPerSecond=250.0, durationMs={"triggerExecution": 800}
)


def summary(
    epoch: int, rows: int, written: tuple[int, ...], skipped: tuple[int, ...] = ()
) -> EpochSummary:
    return EpochSummary(
        epoch=epoch, rows=rows, bytes=rows * 100, partitions_written=written,
        partitions_skipped=skipped, transaction_overhead_ms=tuple(50.0 + p for p in written),
    )  # fmt: skip


def value(metrics: ProducerMetrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_earlier_runs_are_not_counted_and_a_replay_counts_its_epoch_once() -> None:
    counters = SinkCounters()
    counters.add(summary(0, 1000, (0, 1)), committed=True)  # a run before this driver
    metrics = ProducerMetrics("orders")
    metrics.baseline(SinkCounters(**vars(counters)))

    counters.add(summary(1, 600, (0, 1)), committed=False)  # Spark aborted epoch 1 ...
    counters.add(summary(1, 400, (2,), skipped=(0, 1)), committed=True)  # ... its replay
    metrics.progress(PROGRESS, counters)
    metrics.progress(PROGRESS, counters)  # the same file read again changes nothing

    assert value(metrics, "bridge_producer_epochs_total", outcome="committed") == 1
    assert value(metrics, "bridge_producer_epochs_total", outcome="aborted") == 1
    assert value(metrics, "bridge_producer_rows_written_total") == 1000
    assert value(metrics, "bridge_producer_partitions_skipped_total") == 2
    assert value(metrics, "bridge_producer_epoch_rows_count") == 1
    assert value(metrics, "bridge_producer_epoch_rows_sum") == 400
    assert value(metrics, "bridge_producer_epoch_bytes_sum") == 40_000
    assert value(metrics, "bridge_producer_transaction_overhead_seconds_count") == 3
    assert value(metrics, "bridge_producer_batch_duration_seconds_sum") == 1.6
    assert value(metrics, "bridge_producer_last_committed_epoch") == 1
    assert value(metrics, "bridge_producer_processed_rows_per_second") == 250
