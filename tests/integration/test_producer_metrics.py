"""The producer job's Prometheus metrics, scraped from a real `bridge produce` driver."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.kafka_admin import create_topic
from bridge_shell.stack.process import free_port
from tests.consumer_helpers import eventually
from tests.harness import Endpoints
from tests.integration.test_producer_faults import SPLITS, Producer
from tests.integration.test_sink import write_orders

pytestmark = pytest.mark.slow


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_driver_exports_epochs_rows_bytes_overhead_and_spark_rates(
    stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    create_topic(stack.bootstrap_servers, topic_name, partitions=3)
    lines = write_orders(tmp_path / "in", files=4, rows_per_file=500)
    port = free_port()
    producer = Producer(
        stack, tmp_path, topic_name, "--trigger", "1 second", "--max-files-per-trigger", "2",
        "--metrics-port", str(port), *SPLITS,
    )  # fmt: skip
    process = producer.start()
    try:

        def both_epochs_counted() -> bool:
            # The listener reads the sink's counters when Spark reports an epoch's progress,
            # so they can show epoch 1 at the report of epoch 0, before Spark's own report of
            # epoch 1 has arrived: wait for both.
            try:
                now = scrape(port)
            except OSError:
                return False  # not serving yet
            return (
                now.get(("bridge_producer_last_committed_epoch", ())) == 1
                and now.get(("bridge_producer_batch_duration_seconds_count", ()), 0) >= 2
            )

        eventually(both_epochs_counted, timeout=180)
        metrics = scrape(port)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    assert code == 0, producer.log.read_text()[-3000:]

    def value(name: str, **labels: str) -> float:
        return metrics[(name, tuple(sorted(labels.items())))]

    assert value("bridge_producer_epochs_total", outcome="committed") == 2
    assert value("bridge_producer_rows_written_total") == 2000
    assert value("bridge_producer_epoch_rows_count") == 2
    assert value("bridge_producer_epoch_rows_sum") == 2000
    # Each record: the line as its value, the order's id as its key.
    size = sum(len(line) + len(str(json.loads(line)["id"])) for line in lines)
    assert value("bridge_producer_epoch_bytes_sum") == size
    # One transaction per non-empty write task, at least one task per epoch.
    assert value("bridge_producer_transaction_overhead_seconds_count") >= 2
    assert value("bridge_producer_partitions_skipped_total") == 0
    assert value("bridge_producer_batch_duration_seconds_count") >= 2
    assert value("bridge_producer_query_active", query=topic_name) == 1
    assert value("bridge_producer_processed_rows_per_second") >= 0
