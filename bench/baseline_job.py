"""The producer benchmark's baselines: plain PySpark scripts, as a user would write them.

    python bench/baseline_job.py --source files --input DIR --topic T --checkpoint DIR \
        --bootstrap-servers HOST:PORT --jars a.jar,b.jar [--trigger available-now] [--conf K=V] \
        [--sink kafka|python-noop]

It reads exactly as `bridge produce` does (bridge_shell/spark/producer_job.py: the files source
without blank lines, or the rate source as JSON), on the same master, and hands the rows to
`format("kafka")`, Spark's built-in Kafka sink. It imports nothing from bridge, as a user's own
script would not.

`--sink python-noop` hands them instead to a Python streaming data source that receives every
row as bridge-kafka does (Arrow batches in a Python worker, a commit call on the driver) and
does nothing with them: what Spark's Python data source machinery costs by itself, so that the
benchmark can tell it apart from what the sink does.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

AVAILABLE_NOW = "available-now"


class NoopSink(DataSource):
    """Receives every row in a Python worker, as bridge-kafka does, and writes nothing."""

    @classmethod
    def name(cls) -> str:
        return "python-noop"

    def streamWriter(self, schema: StructType, overwrite: bool) -> NoopWriter:
        return NoopWriter()


class NoopWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for batch in iterator:
            batch.num_rows  # noqa: B018 - each batch is received, and that is all
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=("files", "rate"), default="files")
    parser.add_argument("--input")
    parser.add_argument("--rows-per-second", type=int, default=1000)
    parser.add_argument("--max-files-per-trigger", type=int)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--jars", required=True)
    parser.add_argument("--trigger", default=AVAILABLE_NOW)
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--conf", action="append", default=[])
    parser.add_argument("--sink", choices=("kafka", "python-noop"), default="kafka")
    args = parser.parse_args()

    builder = (
        SparkSession.builder.appName("builtin-kafka-sink")
        .master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", args.jars)
    )
    for setting in args.conf:
        key, _, value = setting.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if args.sink == "python-noop":
        spark.dataSource.register(NoopSink)

    if args.source == "files":
        reader = spark.readStream
        if args.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
        rows = reader.text(args.input).where(F.length(F.trim(F.col("value"))) > 0)
        value = F.col("value")
    else:
        rows = spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second).load()
        value = F.to_json(F.struct("*"))
    writer = (
        rows.select(value.alias("value"))
        .writeStream.format(args.sink)
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("topic", args.topic)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger == AVAILABLE_NOW:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime=args.trigger).start()
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        while not query.awaitTermination(1):
            if stop.is_set():
                query.stop()
                break
    written = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"{args.sink} sink: {written} rows in {len(query.recentProgress)} epochs")
    spark.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
