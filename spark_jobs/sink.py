"""`bridge-kafka`: an exactly-once Structured Streaming sink into Kafka, as a Python data source.

    spark.dataSource.register(BridgeKafkaSink)
    df.writeStream.format("bridge-kafka").option("kafka.bootstrap.servers", ...)
      .option("topic", "orders").option("checkpointLocation", ...).start()

Each write task runs one Kafka transaction for its (partition, epoch); see epoch_transaction.py.
With `.option("epochs", "whole")` the tasks and the driver also write the epoch manifest
(bridge/epoch_manifest.py, manifest_writer.py), from which a consumer publishes whole epochs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from bridge.errors import BridgeError
from bridge.kafka_admin import KafkaAdmin, TopicError
from bridge.logs import formatter
from bridge.names import DEFAULT_TRANSACTIONAL_ID_HEAD, SINK_FORMAT
from bridge.private_apis import (
    PrivateApiMoved,
    quiet_accumulator_eof,
    stop_console_progress_bar,
)
from spark_jobs.epoch_transaction import EpochOutcome, EpochTransaction, TaskCoordinates
from spark_jobs.kafka_rows import check_schema, record_chunks
from spark_jobs.manifest_writer import write_epoch
from spark_jobs.progress import record_epoch
from spark_jobs.sink_options import Epochs, SinkOptions

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
log = logging.getLogger("bridge.sink")


@dataclass(frozen=True)
class EpochCommitMessage(WriterCommitMessage):
    outcome: EpochOutcome


class BridgeKafkaSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return SINK_FORMAT

    def streamWriter(self, schema: StructType, overwrite: bool) -> BridgeKafkaStreamWriter:
        options = SinkOptions.parse(self.options)
        typed = tuple(
            column
            for column, chosen in (("value", options.value_format), ("key", options.key_format))
            if chosen.registered
        )
        check_schema(schema, default_topic=options.topic, typed=typed)
        _ensure_topic(options, options.marker_topic)
        if options.epochs is Epochs.WHOLE:
            _ensure_topic(options, options.epochs_topic, _manifest_settings(options))
        return BridgeKafkaStreamWriter(options)


# (bootstrap servers, topic) already known to exist in this process. Spark asks for a writer
# every epoch, often in a reused Python worker: the topic is created once, not every epoch.
_anchored: set[tuple[str, str]] = set()
_TOPIC_BUDGET_S = 120.0  # a broker restarting, or a leader moving, takes less


def _manifest_settings(options: SinkOptions) -> dict[str, str]:
    """The manifest topic's own settings: deleted by age, never compacted (its records are
    keyed by query: compaction would keep each query's last one only)."""
    return {"cleanup.policy": "delete", "retention.ms": str(options.epochs_retention_ms)}


class ManifestRetentionTooShort(BridgeError):
    """The manifest topic exists and keeps its records for less than `epochs.retention.ms`."""


def _check_manifest(options: SinkOptions) -> None:
    """An existing manifest topic keeps parts at least `epochs.retention.ms`, and by age: a
    consumer group lagging or starting behind that would find the parts of epochs whose
    records it reads deleted, and hold them (it names them on `/readyz`). Refused at start,
    with the command that mends it; not checked, with a WARNING, where the principal may not
    describe the topic's settings."""
    topic, wanted = options.epochs_topic, options.epochs_retention_ms
    try:
        found = KafkaAdmin(options.kafka).topic_configs(topic)
    except TopicError as exc:
        log.warning(
            "the epoch manifest's retention was not checked (%s): grant DescribeConfigs on "
            "topic %s to the sink's principal, and make sure it keeps records at least "
            "epochs.retention.ms=%s", exc, topic, wanted,
        )  # fmt: skip
        return
    kept = int(found.get("retention.ms", "-1"))
    policy = found.get("cleanup.policy", "delete")
    shorter = kept != -1 and (wanted == -1 or kept < wanted)
    if shorter or "compact" in policy:
        raise ManifestRetentionTooShort(
            f"the epoch manifest topic {topic!r} keeps its records with cleanup.policy="
            f"{policy} and retention.ms={kept}, where the sink's epochs.retention.ms is "
            f"{wanted}: a consumer group behind that would lose the parts of epochs whose "
            "records it reads. Mend the topic (kafka-configs.sh --alter --entity-type topics "
            f"--entity-name {topic} --add-config cleanup.policy=delete,retention.ms={wanted}), "
            "or set the sink option epochs.retention.ms to at most what the topic keeps, no "
            "less than the records' topics keep theirs"
        )


def _ensure_topic(options: SinkOptions, topic: str, settings: dict[str, str] | None = None) -> None:
    """The sink's own one-partition topics: the marker topic, which only anchors the marker
    groups' offsets (nothing is produced to it), and the epoch manifest's (`settings`: its
    own, when the sink creates it; checked when it exists). A cluster that does not answer is
    given a bounded while (a broker restart) before the epoch, and with it the query, fails
    with the error."""
    key = (options.bootstrap_servers, topic)
    if key in _anchored:
        return
    _log_to_stderr()
    created = False
    for attempt in Retrying(
        retry=retry_if_exception(lambda e: isinstance(e, TopicError) and e.retriable),
        stop=stop_after_delay(_TOPIC_BUDGET_S),
        wait=wait_exponential(multiplier=1, max=10),
        before_sleep=lambda state: log.warning(
            "topic %s not confirmed (%s); trying again",
            topic,
            state.outcome.exception() if state.outcome else None,
        ),
        reraise=True,
    ):
        with attempt:
            created = KafkaAdmin(options.kafka).create_topic(
                topic, partitions=1, replication_factor=-1, topic_config=settings
            )
    if settings is not None and not created:
        _check_manifest(options)
    _anchored.add(key)


class BridgeKafkaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> EpochCommitMessage:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("the bridge-kafka sink writes only inside a Spark task")
        epoch = context.getLocalProperty(BATCH_ID_PROPERTY)
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) or ""
        if epoch is None:
            raise RuntimeError(
                "no streaming batch id in this task: the bridge-kafka sink needs micro-batch "
                "mode (continuous processing is not supported)"
            )
        where = TaskCoordinates(
            query_id=query_id,
            prefix=self.options.prefix or DEFAULT_TRANSACTIONAL_ID_HEAD + query_id,
            partition=context.partitionId(),
            epoch=int(epoch),
            attempt=context.attemptNumber(),
        )
        _log_to_stderr()
        started_at, started = time.time(), time.monotonic()
        with EpochTransaction(self.options, where) as transaction:
            batches = (batch for batch in iterator if batch.num_rows > 0)
            first = next(batches, None)
            first_batch_seconds = time.monotonic() - started
            if first is None:
                return EpochCommitMessage(EpochOutcome.of_empty_input(where))
            outcome = transaction.write(
                lambda: record_chunks(
                    itertools.chain([first], batches),
                    default_topic=self.options.topic,
                    provenance=where.provenance(whole=self.options.epochs is Epochs.WHOLE),
                )
            )
        timed = replace(
            outcome,
            first_batch_seconds=first_batch_seconds,
            started_at=started_at,
            finished_at=time.time(),
        )
        return EpochCommitMessage(timed)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_to_stderr()
        if self.options.epochs is Epochs.WHOLE:
            # Before Spark logs the epoch as done: a driver killed before this replays it.
            write_epoch(self.options, batchId, _outcomes(messages))
        record_epoch(batchId, _outcomes(messages), committed=True, path=self.options.progress_path)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_to_stderr()
        record_epoch(batchId, _outcomes(messages), committed=False, path=self.options.progress_path)


def _outcomes(messages: Sequence[WriterCommitMessage | None]) -> list[EpochOutcome | None]:
    return [m.outcome if isinstance(m, EpochCommitMessage) else None for m in messages]


def _log_to_stderr() -> None:
    """Python workers start with no logging set up; send the sink's lines to stderr, once, as
    the JSON lines the driver's and the consumer's are (one format to collect)."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter())
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def register(spark: Any) -> None:
    """Make `format("bridge-kafka")` available in `spark`; in local mode its Python workers run
    the interpreter this sink is installed in (`_local_worker_python`)."""
    _local_worker_python(spark.sparkContext)
    _no_progress_bar_off_a_terminal(spark.sparkContext)
    with contextlib.suppress(PrivateApiMoved):  # a traceback more is not worth a failed job
        quiet_accumulator_eof(spark.sparkContext)
    spark.dataSource.register(BridgeKafkaSink)


def _no_progress_bar_off_a_terminal(context: Any) -> None:
    """A job run as `python job.py` is a PySpark "shell" to Spark, which then draws its console
    progress bar on stderr: carriage-returned `[Stage N:===>  (3 + 1) / 4]` lines in a log
    file or a pod's log. Stopped here unless stderr is a terminal (where it helps)."""
    if os.isatty(2):
        return
    try:
        stop_console_progress_bar(context)
    except PrivateApiMoved as exc:  # a progress bar left is not worth a failed job
        log.debug("%s", exc)


def _local_worker_python(context: Any) -> None:
    """Spark starts its Python workers with $PYSPARK_PYTHON, else `python3` from PATH, not the
    driver's interpreter: a job run as `.venv/bin/python job.py` without the virtualenv
    activated gets another Python for its workers, without the sink's packages, and every task
    fails with ModuleNotFoundError. In local mode the workers run on this machine, so, unless
    the user chose (PYSPARK_PYTHON), they are given this interpreter, and a line says so when
    that changes anything. On a cluster the executors' Python is theirs (docs/deploy.md).

    `pythonExec` is the SparkContext's public attribute the Python functions and data sources
    registered after this take their interpreter from."""
    if not str(context.master).startswith("local") or os.environ.get("PYSPARK_PYTHON"):
        return
    chosen = shutil.which(context.pythonExec)
    if chosen is not None and _same_python(chosen, sys.executable):
        return  # an activated virtualenv's `python3`, say
    _log_to_stderr()
    log.info(
        "Spark's Python workers would run %s (%s); they run %s, the interpreter the sink is "
        "installed in (set PYSPARK_PYTHON to choose another)",
        context.pythonExec,
        chosen or "not found on PATH",
        sys.executable,
    )
    context.pythonExec = sys.executable


def _same_python(one: str, other: str) -> bool:
    """The same interpreter with the same packages: a virtualenv's python is a link to its base
    interpreter, and only its own directory makes it see the virtualenv's packages."""
    return os.path.realpath(one) == os.path.realpath(other) and os.path.dirname(
        os.path.abspath(one)
    ) == os.path.dirname(os.path.abspath(other))
