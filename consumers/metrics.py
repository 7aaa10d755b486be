"""The consumer's Prometheus metrics, and the HTTP endpoints that serve them with its health.

`/metrics` (Prometheus text format), `/healthz` (200 while the poll loop turns), `/readyz` (200
once the consumer is in its group and every partition it holds is progressing; else 503 with one
line per reason). Each service has its own registry, so several services in one process never
share counters.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from bridge.names import (
    METRIC_BATCH_SECONDS,
    METRIC_BATCHES,
    METRIC_DATABASE_RECONNECTS,
    METRIC_DATABASE_REFUSALS,
    METRIC_DEAD_LETTERS,
    METRIC_EPOCH_RECORDS_HELD,
    METRIC_EPOCHS_OWNER,
    METRIC_EPOCHS_PUBLISHED,
    METRIC_IGNORED_FIELDS,
    METRIC_INFO,
    METRIC_LAG,
    METRIC_LATENCY_SECONDS,
    METRIC_OLDEST_INCOMPLETE_EPOCH,
    METRIC_PARTITIONS,
    METRIC_RECORDS_APPLIED,
    METRIC_RECORDS_READ,
    METRIC_RECORDS_STAGED,
    METRIC_REGISTRY_UNAVAILABLE,
    METRIC_TABLE_MISMATCH,
)
from consumers.decoding.records import Record, timestamp_ms

# How many records of a batch feed the latency histogram: enough for p99, cheap per batch.
_LATENCY_SAMPLES_PER_BATCH = 100
_BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ConsumerMetrics:
    def __init__(self, group_id: str) -> None:
        self.registry = CollectorRegistry()
        # Per partition: the last stable offset the statistics gave, and the lag set from it.
        self._stable: dict[tuple[str, int], int] = {}
        self._lags: dict[tuple[str, int], int] = {}
        labels = {"group": group_id}
        self.records_applied = Counter(
            METRIC_RECORDS_APPLIED,
            "Records applied to PostgreSQL (inserted, upserted or deleted).",
            ["topic"],
            registry=self.registry,
        ).labels
        # With whole epochs the member that reads an epoch's records may not be the one that
        # publishes them (applied, above): this says who read them.
        self.records_read = Counter(
            METRIC_RECORDS_READ,
            "Records this member read and committed the offsets of (written, staged, dead-"
            "lettered or left out), by topic.",
            ["topic"],
            registry=self.registry,
        ).labels
        self.dead_letters = Counter(
            METRIC_DEAD_LETTERS,
            "Records written to the dead-letter table.",
            ["topic"],
            registry=self.registry,
        ).labels
        self.records_stopped = Counter(
            "bridge_consumer_records_stopped_total",
            "Tries that met a record of an `on_record_error: stop` route that cannot be "
            "written: its partition holds at it.",
            ["topic"],
            registry=self.registry,
        ).labels
        self.records_ahead_of_epochs = Counter(
            "bridge_consumer_records_ahead_of_epochs_total",
            "Records of no epoch (another producer's) written ahead of an epoch whose records "
            "lie before and after them in their partition, which overwrites them for a key "
            "of both once published.",
            ["topic"],
            registry=self.registry,
        ).labels
        self.replayed_epoch_records = Counter(
            "bridge_consumer_replayed_epoch_records_total",
            "Records staged of an epoch its group had settled (a driver replaying an epoch it "
            "had committed, its markers expired; an offsets reset below them): never written "
            "to their tables, which hold them already.",
            ["query"],
            registry=self.registry,
        ).labels
        self.records_skipped = Counter(
            "bridge_consumer_records_skipped_total",
            "Records their route's mode leaves unwritten, by design: in insert_if_absent a key "
            "already in the table or earlier in the batch, in update a key not in the table.",
            ["topic"],
            registry=self.registry,
        ).labels
        self.batches = Counter(
            METRIC_BATCHES, "Database transactions committed.", registry=self.registry
        )
        self.batch_seconds = Histogram(
            METRIC_BATCH_SECONDS,
            "Time of one batch's database transaction, offsets and rows.",
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.latency_seconds = Histogram(
            METRIC_LATENCY_SECONDS,
            "From a record's Kafka timestamp to the commit of its database transaction "
            f"(up to {_LATENCY_SAMPLES_PER_BATCH} records sampled per batch).",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.lag = Gauge(
            METRIC_LAG,
            "Records between the stored next offset and the last stable offset.",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.partitions = Gauge(
            METRIC_PARTITIONS,
            "Partitions this member holds, by state (consuming, in_flight, unresolved, fenced, "
            "out_of_range).",
            ["state"],
            registry=self.registry,
        )
        self.refusals = Counter(
            METRIC_DATABASE_REFUSALS,
            "Times the database answered and refused to write (read-only, out of resources, a "
            "statement timeout), by SQLSTATE.",
            ["sqlstate"],
            registry=self.registry,
        ).labels
        self.reconnects = Counter(
            METRIC_DATABASE_RECONNECTS,
            "Times the database connection was lost and opened again.",
            registry=self.registry,
        )
        self.ignored_fields = Counter(
            METRIC_IGNORED_FIELDS,
            "Fields left out of a topic's records because its table has no column for them "
            "(unknown_fields: ignore): each field of each record (the log names them).",
            ["topic"],
            registry=self.registry,
        ).labels
        self.registry_unavailable = Counter(
            METRIC_REGISTRY_UNAVAILABLE,
            "Batches held back because the schema registry could not answer for their schemas "
            "(unreachable, timed out, or answering with an error of its own).",
            registry=self.registry,
        )
        self.table_mismatch = Counter(
            METRIC_TABLE_MISMATCH,
            "Batches held back because a writer schema does not fit a followed table in a way "
            "adding a column can mend (a type change, a required new field, a missing key).",
            registry=self.registry,
        )
        self.records_staged = Counter(
            METRIC_RECORDS_STAGED,
            "Records of a route with whole epochs staged until their epoch is whole; they "
            "count as applied once it is published.",
            ["topic"],
            registry=self.registry,
        ).labels
        # `path`: `in_batch`, by the batch that completed the epoch in memory; `staged`, from
        # the ledger by the publisher, once the epoch's staged parts are whole.
        self.epochs_published = Counter(
            METRIC_EPOCHS_PUBLISHED,
            "Spark epochs published whole, each in one transaction (by this member), by path.",
            ["path"],
            registry=self.registry,
        ).labels
        self.epoch_records_held = Gauge(
            METRIC_EPOCH_RECORDS_HELD,
            "Records held in memory, their offsets not advanced, until their epoch is whole "
            "(consumer.epochs_hold_records bounds them).",
            registry=self.registry,
        )
        self.oldest_incomplete_epoch = Gauge(
            METRIC_OLDEST_INCOMPLETE_EPOCH,
            "Age of the group's oldest epoch not yet published (0: none), from its first "
            "record or manifest entry.",
            registry=self.registry,
        )
        self.epochs_owner = Gauge(
            METRIC_EPOCHS_OWNER,
            "Per Spark query of the group's whole routes (epochs_members: one): 1 when this "
            "member reads its topics, 0 when another member does. No series until the group "
            "has had an epoch (every member reads every whole route).",
            ["query"],
            registry=self.registry,
        )
        Gauge(METRIC_INFO, "The consumer group.", list(labels), registry=self.registry).labels(
            **labels
        ).set(1)

    def committed(self, records: Sequence[Record], seconds: float) -> None:
        """After a batch's commit: its duration, and the latency of a sample of its records."""
        self.batches.inc()
        self.batch_seconds.observe(seconds)
        self._latencies(records)

    @staticmethod
    def sample(records: Sequence[Record]) -> Sequence[Record]:
        """The records of a batch whose latency is observed: a caller that must filter a
        batch's records first filters only these (a Python loop over every record of a batch
        cost a seventh of the service's rate, bench/results/consumer-20261127T235943Z.json)."""
        return records[:: max(1, len(records) // _LATENCY_SAMPLES_PER_BATCH)]

    def _latencies(self, records: Sequence[Record]) -> None:
        now_ms = time.time() * 1000
        for record in self.sample(records):
            sent_ms = timestamp_ms(record)
            if sent_ms is not None:
                self.latency_seconds.observe(max(0.0, now_ms - sent_ms) / 1000)

    def visible(self, timestamps_ms: Sequence[int], seconds: float) -> None:
        """After an epoch's publication: its duration, and the latency of a sample of its
        records (their Kafka timestamps), which became visible only now."""
        self.batch_seconds.observe(seconds)
        now_ms = time.time() * 1000
        for sent_ms in timestamps_ms:
            if sent_ms > 0:
                self.latency_seconds.observe(max(0.0, now_ms - sent_ms) / 1000)

    def statistics(
        self, report: str, next_offsets: dict[tuple[str, int], int], caught_up: set[tuple[str, int]]
    ) -> dict[str, str]:
        """librdkafka's statistics callback: lag = last stable offset - our position.

        The stored next offset stops after the last record; the commit marker of its transaction
        takes one more offset. For a partition whose delivered records are all applied
        (`caught_up`), the consumer's own position, which steps over those markers, counts."""
        stats: dict[str, Any] = json.loads(report)
        for topic, topic_stats in stats.get("topics", {}).items():
            for name, partition in topic_stats.get("partitions", {}).items():
                key = (topic, int(name))
                stable = partition.get("ls_offset", -1)
                if key not in next_offsets or stable < 0:
                    continue
                self._stable[key] = stable
                position = next_offsets[key]
                if key in caught_up:
                    position = max(position, partition.get("app_offset", -1))
                self._set_lag(key, max(0, stable - position))
        # Each broker's connection state (UP, DOWN, CONNECT, ...), for the caller's liveness.
        return {name: str(b.get("state")) for name, b in stats.get("brokers", {}).items()}

    def advanced(
        self, next_offsets: dict[tuple[str, int], int], caught_up: set[tuple[str, int]]
    ) -> None:
        """After a commit: the lag of its partitions against the last stable offsets the
        statistics gave, so that the gauge is as fresh as the stored offsets, not up to a
        statistics interval behind. A partition whose delivered records are all applied has no
        lag the consumer knows of; the next statistics say if more came."""
        for key, position in next_offsets.items():
            stable = self._stable.get(key)
            if stable is not None:
                self._set_lag(key, 0 if key in caught_up else max(0, stable - position))

    def total_lag(self) -> int:
        """The lag of every partition held, summed, as the gauges have it."""
        return sum(self._lags.values())

    def _set_lag(self, key: tuple[str, int], lag: int) -> None:
        self._lags[key] = lag
        self.lag.labels(topic=key[0], partition=str(key[1])).set(lag)

    def states(self, counts: dict[str, int]) -> None:
        for state, count in counts.items():
            self.partitions.labels(state=state).set(count)

    def forget(self, keys: Sequence[tuple[str, int]]) -> None:
        for topic, partition in keys:
            self._stable.pop((topic, partition), None)
            self._lags.pop((topic, partition), None)
            with contextlib.suppress(KeyError):  # never reported for this partition
                self.lag.remove(topic, str(partition))


class HealthServer:
    """/metrics, /healthz and /readyz on a background thread: one small WSGI app in front of
    prometheus-client's own (content negotiation, gzip), served by the standard library's WSGI
    server with a thread per request, so a slow scrape never holds a health check."""

    def __init__(
        self,
        metrics: ConsumerMetrics,
        *,
        host: str,
        port: int,
        healthy: Callable[[], bool],
        not_ready: Callable[[], list[str]],
    ) -> None:
        scrape = make_wsgi_app(metrics.registry)
        checks: dict[str, Callable[[], tuple[int, bytes]]] = {
            "/healthz": lambda: _verdict(healthy()),
            "/readyz": lambda: _readiness(not_ready()),
        }

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return cast(Iterable[bytes], scrape(environ, start_response))
            check = checks.get(path)
            status, body = check() if check else (404, b"not found\n")
            start_response(
                f"{status} {HTTPStatus(status).phrase}",
                [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))],
            )
            return [body]

        self._server = make_server(
            host, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="bridge-health", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return  # scrapes every few seconds would drown the service's own logs


def _verdict(ok: bool) -> tuple[int, bytes]:
    return (200, b"ok\n") if ok else (503, b"not ok\n")


def _readiness(reasons: list[str]) -> tuple[int, bytes]:
    if not reasons:
        return _verdict(True)
    return 503, ("not ready\n" + "".join(f"{r}\n" for r in reasons)).encode()
