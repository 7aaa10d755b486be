"""Producer benchmark: the same query and data through bridge-kafka and Spark's built-in Kafka sink.

    .venv/bin/python -m bench.producer [--rows 1000000] [--row-bytes 100] [--files 10]

The data is a directory of JSON-lines files (fixed row count and size), read by the same
available-now query with the same epochs; only the sink differs. Prints rows/s of each, their
ratio, and the per-task cost of the exactly-once protocol (init_transactions + marker read +
commit: p50, p99); writes the figures to bench/results/producer-*.json.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

from bench.common import Endpoints, percentile, running_stack, write_results
from bridge.kafka_admin import create_topic
from bridge.maven import spark_kafka_jars
from spark_jobs.progress import SinkCounters
from spark_jobs.spark_session import DEFAULT_MASTER, build_session

TOPIC_PARTITIONS = 2


def write_input(directory: Path, *, rows: int, row_bytes: int, files: int) -> None:
    directory.mkdir(parents=True)
    per_file = rows // files
    for f in range(files):
        lines = []
        for i in range(f * per_file, (f + 1) * per_file):
            head = json.dumps({"id": i, "amount": i % 1000, "note": ""})
            note = "x" * max(0, row_bytes - len(head))
            lines.append(json.dumps({"id": i, "amount": i % 1000, "note": note}))
        (directory / f"part-{f:04d}.jsonl").write_text("\n".join(lines) + "\n")


def run_query(
    spark: Any, stack: Endpoints, data: Path, *, sink: str, files_per_epoch: int, scratch: Path
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    topic = f"bench-{sink}-{uuid.uuid4().hex[:8]}"
    create_topic(stack.bootstrap_servers, topic, partitions=TOPIC_PARTITIONS)
    checkpoint = scratch / f"checkpoint-{topic}"
    progress = scratch / f"progress-{topic}.json"
    rows = (
        spark.readStream.option("maxFilesPerTrigger", files_per_epoch)
        .text(str(data))
        .select(F.col("value"), F.get_json_object("value", "$.id").alias("key"))
    )
    writer = (
        rows.writeStream.format(sink)
        .option("kafka.bootstrap.servers", stack.bootstrap_servers)
        .option("topic", topic)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if sink == "bridge-kafka":
        writer = writer.option("progress.path", str(progress))
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    written = sum(p["numInputRows"] for p in query.recentProgress)
    result: dict[str, Any] = {
        "sink": sink,
        "rows": written,
        "seconds": round(seconds, 3),
        "rows_per_second": round(written / seconds),
        "epochs": len(query.recentProgress),
    }
    if sink == "bridge-kafka":
        overheads = [
            float(ms)
            for epoch in SinkCounters.load(progress).recent
            for ms in epoch.get("transaction_overhead_ms", [])  # type: ignore[attr-defined]
        ]
        result["transaction_overhead_ms"] = {
            "tasks": len(overheads),
            "p50": round(percentile(sorted(overheads), 0.50), 1),
            "p99": round(percentile(sorted(overheads), 0.99), 1),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--row-bytes", type=int, default=100)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    args = parser.parse_args()

    scratch = Path(mkdtemp(prefix="bridge-bench-producer-"))
    data = scratch / "in"
    write_input(data, rows=args.rows, row_bytes=args.row_bytes, files=args.files)
    with running_stack() as stack:
        spark = build_session("bench-producer", jars=spark_kafka_jars())
        try:
            # Warm up both paths (JIT, Python workers, broker metadata) on a small copy.
            warm = scratch / "warm"
            write_input(warm, rows=20_000, row_bytes=args.row_bytes, files=2)
            for sink in ("kafka", "bridge-kafka"):
                run_query(spark, stack, warm, sink=sink, files_per_epoch=1, scratch=scratch)
            common = {"files_per_epoch": args.files_per_epoch, "scratch": scratch}
            builtin = run_query(spark, stack, data, sink="kafka", **common)
            ours = run_query(spark, stack, data, sink="bridge-kafka", **common)
        finally:
            spark.stop()

    ratio = ours["rows_per_second"] / builtin["rows_per_second"]
    overhead = ours["transaction_overhead_ms"]
    shape = f"{args.rows} of ~{args.row_bytes} bytes, {ours['epochs']} epochs, {DEFAULT_MASTER}"
    print(f"rows: {shape}")
    print(f"Spark's built-in Kafka sink : {builtin['rows_per_second']:>9,} rows/s")
    print(f"bridge-kafka (exactly once) : {ours['rows_per_second']:>9,} rows/s")
    print(f"ratio bridge / built-in     : {ratio:.2f} (goal >= 0.80)")
    print(
        f"per-task transaction overhead (init + marker read + commit): "
        f"p50 {overhead['p50']} ms, p99 {overhead['p99']} ms over {overhead['tasks']} tasks"
    )
    path = write_results(
        "producer",
        {
            "rows": args.rows,
            "row_bytes": args.row_bytes,
            "builtin": builtin,
            "bridge": ours,
            "ratio": round(ratio, 3),
            "goal_ratio": 0.8,
        },
    )
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
