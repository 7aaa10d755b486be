"""The typed-records benchmark's producer job: one typed DataFrame into Kafka through bridge-kafka,
its value as JSON (`to_json` in the JVM) or as registry Avro (`spark_jobs.registry_frames`, also
in the JVM), so that the two differ only in the value format.

    python bench/typed_job.py --input DIR --format json|avro --topic T --checkpoint DIR \
        --bootstrap-servers HOST:PORT --registry URL --jars a.jar,b.jar [--files-per-epoch N]
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import functions as F

from bridge_shell.spark.spark_session import build_session, stop_session
from spark_jobs.registry_frames import encode

SCHEMA = (
    "id BIGINT, customer STRING, amount DECIMAL(12,2), currency STRING, note STRING, "
    "sent_ms BIGINT, at TIMESTAMP"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--input", "--format", "--topic", "--checkpoint", "--bootstrap-servers"):
        parser.add_argument(name, required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--jars", required=True)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    args = parser.parse_args()

    spark = build_session("bench-typed", jars=args.jars.split(","))  # bridge-kafka registered
    try:
        rows = (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", args.files_per_epoch)
            .parquet(args.input)
        )
        options = {"kafka.bootstrap.servers": args.bootstrap_servers, "topic": args.topic}
        if args.format == "avro":
            options |= {"value.format": "avro", "schema.registry.url": args.registry}
            values = encode(rows.select(F.struct("*").alias("value")), options)
        else:
            values = rows.select(F.to_json(F.struct("*")).alias("value"))
        started = time.perf_counter()
        query = (
            values.writeStream.format("bridge-kafka")
            .options(**options)
            .option("checkpointLocation", args.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        print(f"query seconds {time.perf_counter() - started:.3f}")
    finally:
        stop_session(spark)


if __name__ == "__main__":
    main()
