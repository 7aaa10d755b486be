"""The producer job: a streaming query from a replayable source into Kafka through bridge-kafka.

Each input row becomes one Kafka record whose value is the row as a JSON object (for the files
source, the line itself: each line of a JSON-lines file already is one). A line that is not JSON
still goes through, unchanged: the consumer dead-letters it with its coordinates, so nothing is
lost and the operator sees it where the other bad records are.

With `value_format` avro (or json-schema, or protobuf), each value is a typed record instead,
registered and framed in the schema registry's wire format (`spark_jobs.registry_frames`): the
rate source's own columns, or for the files and kafka sources each JSON line read by
`value_schema` (a Spark DDL string such as `id BIGINT, amount DECIMAL(12,2), at TIMESTAMP`).
A line that is not JSON or does not fit the schema goes through unchanged and unframed, for the
consumer to dead-letter as above.

With `key_format` avro (or json-schema, or protobuf) and `key_field`, each key is a typed
record of that one field, registered under the topic's `-key` subject and framed the same way;
the field keeps the type the value gives it (a string where the value stays JSON).

Run it with `bridge produce ...`, or `spark-submit bridge_shell/cli/spark_submit.py ...` (same
options).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from bridge.errors import ConfigError
from bridge.names import SINK_FORMAT
from bridge_shell.spark.epoch_splits import FILE_SPLIT_SETTINGS, settled_parallelism
from bridge_shell.spark.locations import local_path, progress_path, spark_location
from bridge_shell.spark.spark_session import build_session, stop_session
from spark_jobs.graceful_stop import stop_on_signal
from spark_jobs.progress import SinkCounters
from spark_jobs.spark_kafka_options import java_client_options

log = logging.getLogger("bridge.produce")

AVAILABLE_NOW = "available-now"
# The columns of the kafka source's rows (`_read`), the ones --key-field may name.
KAFKA_SOURCE_COLUMNS = (
    "key", "value", "source_topic", "source_partition", "source_offset", "timestamp",
)  # fmt: skip
_INTERVAL = re.compile(r"^\d+(\.\d+)?\s*(ms|milliseconds?|s|seconds?|m|minutes?|h|hours?)$")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_FORMATS = ("json", "avro", "json-schema", "protobuf")  # the sink's value.format / key.format
_FORMAT_NAMES = "json, avro, json-schema or protobuf"
_CORRUPT = "_bridge_unreadable_line"  # where from_json puts a line it cannot read by the schema


class Source(StrEnum):
    FILES = "files"
    RATE = "rate"
    KAFKA = "kafka"


@dataclass(frozen=True, kw_only=True)
class ProducerJob:
    source: Source
    topic: str
    checkpoint: Path | str  # a local directory or a Hadoop URI (s3a://, hdfs://, ...)
    bootstrap_servers: str
    # Never in a repr: it may hold secrets (sasl.password, ...).
    kafka_properties: dict[str, str] = field(default_factory=dict, repr=False)
    input: Path | str | None = None  # the same
    source_topic: str | None = None
    rows_per_second: int = 1000
    key_field: str | None = None
    trigger: str = AVAILABLE_NOW
    max_files_per_trigger: int | None = None
    transactional_id_prefix: str | None = None
    transactional_id_naming: str | None = None  # the sink's default (pooled) when not set
    epochs: str | None = None  # the sink's default (per-partition) when not set
    transaction_timeout_ms: int | None = None
    master: str | None = None
    executor_python: str | None = None  # on a cluster; see bridge_shell/spark/executor_env.py
    spark_conf: dict[str, str] = field(default_factory=dict)
    jars: tuple[str, ...] = ()  # for the kafka source: Spark's connector
    metrics_port: int | None = None  # Prometheus /metrics from the driver; 0: any free port
    metrics_host: str = "0.0.0.0"  # noqa: S104 - scraped from elsewhere
    progress_file: Path | None = None  # default: see locations.progress_path
    value_format: str = "json"  # or avro, json-schema, protobuf: see the module's docstring
    key_format: str = "json"  # the same, for the key: a record of `key_field`
    value_schema: str | None = None  # a Spark DDL string: the JSON lines' fields, for avro
    # The schema registry client's settings (url, credentials): never in a repr.
    registry: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def progress_path(self) -> Path:
        return self.progress_file or progress_path(self.checkpoint)

    def check(self) -> None:
        """Refuse a job that cannot run, before a Spark session is started for it."""
        problems: list[tuple[str, str]] = []
        if self.source is Source.FILES:
            local_input = local_path(self.input) if self.input is not None else None
            if self.input is None:
                problems.append(("--input", "the files source needs a directory"))
            elif local_input is not None and not local_input.is_dir():
                problems.append(("--input", f"{self.input} is not a directory"))
        elif self.input is not None:
            problems.append(("--input", f"only the files source reads files, not {self.source}"))
        if self.source is Source.KAFKA and not self.source_topic:
            problems.append(("--source-topic", "the kafka source needs a topic to read"))
        if self.source is Source.KAFKA:
            try:
                java_client_options(self.kafka_properties)
            except ConfigError as exc:
                problems.extend(exc.problems)
            if self.key_field is not None and self.key_field not in KAFKA_SOURCE_COLUMNS:
                # Refused here, not by Spark's analysis after its start-up.
                problems.append(("--key-field", f"{self.key_field!r}: the kafka source's rows "
                                 f"are {', '.join(KAFKA_SOURCE_COLUMNS)} (the source record's "
                                 "key is `key`)"))  # fmt: skip
        if self.trigger != AVAILABLE_NOW and not _INTERVAL.match(self.trigger):
            problems.append(
                (
                    "--trigger",
                    f"{self.trigger!r}: use available-now or an interval like '5 seconds'",
                )
            )
        if self.key_field is not None and not _FIELD.match(self.key_field):
            problems.append(("--key-field", f"{self.key_field!r} is not a field name"))
        if self.max_files_per_trigger is not None and self.max_files_per_trigger < 1:
            problems.append(("--max-files-per-trigger", "must be at least 1"))
        if self.rows_per_second < 1:
            problems.append(("--rows-per-second", "must be at least 1"))
        if self.value_format not in _FORMATS:
            problems.append(("--value-format", f"{self.value_format!r} is not {_FORMAT_NAMES}"))
        if self.value_format != "json":
            if not self.registry.get("url"):
                problems.append(
                    (
                        "schema_registry.url",
                        f"--value-format {self.value_format} needs the schema registry",
                    )
                )
            if self.source is not Source.RATE and not self.value_schema:
                problems.append(
                    ("--value-schema", f"the {self.source} source's lines need a schema for "
                     f"{self.value_format}, e.g. 'id BIGINT, amount DECIMAL(12,2), at TIMESTAMP'")
                )  # fmt: skip
        elif self.value_schema is not None:
            problems.append(("--value-schema", "only a registry format reads lines by a schema"))
        if self.key_format not in _FORMATS:
            problems.append(("--key-format", f"{self.key_format!r} is not {_FORMAT_NAMES}"))
        elif self.key_format != "json":
            if self.key_field is None:
                problems.append(("--key-format", "a typed key is a record of --key-field: name it"))
            if not self.registry.get("url"):
                problems.append(
                    ("schema_registry.url", f"--key-format {self.key_format} needs the schema "
                     "registry")
                )  # fmt: skip
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65_535:
            problems.append(("--metrics-port", f"{self.metrics_port} is not a TCP port"))
        if problems:
            raise ConfigError(problems, source="bridge produce")


def run(job: ProducerJob, spark: Any | None = None) -> SinkCounters:
    """Run the query until it has consumed what is available (available-now) or until SIGTERM
    or SIGINT, which stop it at its next epoch boundary (`spark_jobs.graceful_stop`).

    `spark`: a session to run in (left running); by default the job starts and stops its own."""
    job.check()
    own = spark is None
    if spark is None:
        spark = build_session(
            "bridge-produce",
            master=job.master,
            jars=job.jars,
            conf=job.spark_conf,
            executor_python=job.executor_python,
        )
    try:
        if job.metrics_port is not None:
            from spark_jobs.producer_metrics import serve_metrics

            serve_metrics(
                spark,
                port=job.metrics_port,
                host=job.metrics_host,
                progress_path=job.progress_path,
                query_name=job.topic,
            )
        query = _start(spark, job)
        log.info("query %s started (checkpoint %s)", query.id, job.checkpoint)
        # Until the query ends (available-now: when it has read what was there), or a signal
        # stops it between two epochs (a deploy is not a crash).
        stop_on_signal(query)
    finally:
        if own:
            stop_session(spark)
    return SinkCounters.load(job.progress_path)


def _start(spark: Any, job: ProducerJob) -> Any:
    from pyspark.sql import functions as F

    rows = _read(spark, job)
    options = {
        "kafka.bootstrap.servers": job.bootstrap_servers,
        "topic": job.topic,
        "progress.path": str(job.progress_path),
        **{f"kafka.{name}": setting for name, setting in job.kafka_properties.items()},
    }
    if job.value_format != "json" or job.key_format != "json":
        options.update({f"schema.registry.{k}": v for k, v in job.registry.items()})
        options.update({"value.format": job.value_format, "key.format": job.key_format})
        records = _typed(rows, job, options)
    else:
        value = F.col("value") if job.source is Source.FILES else F.to_json(F.struct("*"))
        columns = [value.alias("value")]
        if job.key_field is not None:
            if job.source is Source.FILES:
                key = F.get_json_object(F.col("value"), f"$.{job.key_field}")
            else:
                key = F.col(job.key_field).cast("string")
            columns.append(key.alias("key"))
        records = rows.select(*columns)
    writer = (
        records.writeStream.format(SINK_FORMAT)
        .options(**options)
        .option("checkpointLocation", spark_location(job.checkpoint))
    )
    if job.transactional_id_prefix:
        writer = writer.option("transactional.id.prefix", job.transactional_id_prefix)
    if job.transactional_id_naming:
        writer = writer.option("transactional.id.naming", job.transactional_id_naming)
    if job.epochs:
        writer = writer.option("epochs", job.epochs)
    if job.transaction_timeout_ms is not None:
        writer = writer.option("transaction.timeout.ms", job.transaction_timeout_ms)
    if job.trigger == AVAILABLE_NOW:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=job.trigger)
    return writer.start()


def _typed(rows: Any, job: ProducerJob, options: dict[str, str]) -> Any:
    """The rows with a typed value, a typed key, or both, framed for the registry (see the
    module's docstring)."""
    from pyspark.sql import functions as F

    from spark_jobs.registry_frames import encode

    typed_value, typed_key = job.value_format != "json", job.key_format != "json"

    def keyed(field: Any) -> list[Any]:
        """The key column from the key field: a record of it, or its text."""
        if job.key_field is None:
            return []
        key = F.struct(field.alias(job.key_field)) if typed_key else field.cast("string")
        return [key.alias("key")]

    keys = ["key"] if job.key_field is not None else []
    if job.source is Source.RATE:
        value = F.struct("*") if typed_value else F.to_json(F.struct("*"))
        field = F.col(job.key_field) if job.key_field is not None else None
        return encode(rows.select(value.alias("value"), *keyed(field)), options)
    line = F.col("value")
    if not typed_value:  # the line as it is; the key field read from it as text
        field = F.get_json_object(line, f"$.{job.key_field}")
        return encode(rows.select(line.alias("value"), *keyed(field)), options)
    parsed = F.from_json(
        line, f"{job.value_schema}, {_CORRUPT} STRING", {"columnNameOfCorruptRecord": _CORRUPT}
    )
    readable = rows.select(parsed.alias("parsed"), line.cast("binary").alias("line")).select(
        F.col("parsed").dropFields(_CORRUPT).alias("value"),
        F.col(f"parsed.{_CORRUPT}").isNotNull().alias("unreadable"),
        "line",
        *keyed(F.col(f"parsed.{job.key_field}") if job.key_field is not None else None),
    )
    framed = encode(readable, options)
    value = F.when(F.col("unreadable"), F.col("line")).otherwise(F.col("value"))
    return framed.select(value.alias("value"), *keys)


def _settled_parallelism(spark: Any) -> int:
    """`epoch_splits.settled_parallelism` of the session's settings."""
    context = spark.sparkContext
    return settled_parallelism(dict(context.getConf().getAll()), context.master)


def _read(spark: Any, job: ProducerJob) -> Any:
    from pyspark.sql import functions as F

    reader = spark.readStream
    if job.source is Source.FILES:
        if job.max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", job.max_files_per_trigger)
        assert job.input is not None  # noqa: S101 - check() refuses a files job without one
        if not any(spark.conf.get(key, None) for key in FILE_SPLIT_SETTINGS):
            # Before the query starts, which takes the session's settings with it.
            splits = _settled_parallelism(spark)
            spark.conf.set(FILE_SPLIT_SETTINGS[0], str(splits))
            log.info("each epoch's files split for %d cores (%s), the same when replayed",
                     splits, FILE_SPLIT_SETTINGS[0])  # fmt: skip
        lines = reader.text(spark_location(job.input))
        return lines.where(F.length(F.trim(F.col("value"))) > 0)
    if job.source is Source.RATE:
        return (
            reader.format("rate")
            .option("rowsPerSecond", job.rows_per_second)
            .option("numPartitions", _settled_parallelism(spark))
            .load()
        )
    reader = (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", job.bootstrap_servers)
        .option("subscribe", job.source_topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
    )
    # The same principal and TLS settings as the sink's, in the Java client's terms.
    for name, setting in java_client_options(job.kafka_properties).items():
        reader = reader.option(name, setting)
    records = reader.load()
    return records.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        F.col("topic").alias("source_topic"),
        F.col("partition").alias("source_partition"),
        F.col("offset").alias("source_offset"),
        F.col("timestamp"),
    )
