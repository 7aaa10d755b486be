"""Typed-records benchmark: Avro (or Protobuf) through the schema registry against JSON, on
the same rows.

    .venv/bin/python -m bench.typed [--records 500000] [--rounds 3] [--files 20]
        [--files-per-epoch 2] [--no-producer] [--no-consumer] [--format avro|protobuf]

(a) The consumer (`python -m consumers`, a whole process, insert mode) on two topics holding the
    same rows, one as JSON objects and one as registry Avro (the schema registered in the stack's
    registry): rows per second from the group joined to the last offset applied, in alternated
    rounds, each round's ratio Avro / JSON and the median. The rows are the consumer
    benchmark's order events (bench/consumer.py), with their amount a decimal(12,2).
(b) The producer (bench/typed_job.py, a whole process, start-up included) on the same typed
    DataFrame (Parquet files of those rows and a timestamp), its value written as JSON
    (`to_json`) or as registry Avro (`to_avro` behind the wire-format header), alternated
    rounds; rows per second and the ratio Avro / JSON.
With `--format protobuf`, (a) reads the rows as registry Protobuf instead (a schema of the same
fields, the amount as its decimal text, framed as Confluent's serializers frame it, message
indexes included), read with no generated code; the sink does not write Protobuf yet, so (b) is
Avro's. Each timed consumer run starts after a CHECKPOINT (bench/consumer.py). Writes
bench/results/typed-*.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from statistics import median
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from google.protobuf import message_factory

from bench.common import Endpoints, new_topic, running_stack, scratch_dir, write_results
from bench.consumer import PARTITIONS, fill_topic, record, service_run
from bridge_shell.maven import spark_kafka_jars
from bridge_shell.spark.spark_home import precompiled_spark_home
from consumers.decoding.proto_schemas import ProtoSchema, compile_schema
from spark_jobs.registry_frames import register

JOB = Path(__file__).with_name("typed_job.py")
FORMATS = ("json", "avro")
ORDER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 12, "scale": 2}},
        {"name": "currency", "type": "string"},
        {"name": "note", "type": "string"},
        {"name": "sent_ms", "type": "long"},
    ],
}  # fmt: skip


def fill_avro_topic(stack: Endpoints, topic: str, records: int) -> None:
    """The same rows as `fill_topic` writes as JSON, as registry Avro."""
    assert stack.registry_url is not None
    new_topic(stack, topic, partitions=PARTITIONS)
    with SchemaRegistryClient({"url": stack.registry_url}) as client:
        schema_id = register(client, f"{topic}-value", ORDER_SCHEMA)
    header = b"\x00" + schema_id.to_bytes(4, "big")
    parsed = fastavro.parse_schema(ORDER_SCHEMA)

    def encoded(row: dict[str, Any]) -> bytes:
        row["amount"] = Decimal(f"{row['amount']:.2f}")
        body = io.BytesIO()
        body.write(header)
        fastavro.schemaless_writer(body, parsed, row)
        return body.getvalue()

    _fill(stack, topic, records, encoded)


def _fill(
    stack: Endpoints, topic: str, records: int, encoded: Callable[[dict[str, Any]], bytes]
) -> None:
    """`records` of the consumer benchmark's rows, each value `encoded`, in transactions of
    50,000."""
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 20,
                         "transactional.id": f"bench-{uuid.uuid4().hex}"})  # fmt: skip
    producer.init_transactions(30)
    now_ms = int(time.time() * 1000)
    for start in range(0, records, 50_000):
        producer.begin_transaction()
        for i in range(start, min(records, start + 50_000)):
            value = encoded(record(i, now_ms))
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(60)


ORDER_PROTO = """syntax = "proto3";
package bench;
message Order {
  int64 id = 1;
  string customer = 2;
  string amount = 3;
  string currency = 4;
  string note = 5;
  int64 sent_ms = 6;
}
"""


def fill_protobuf_topic(stack: Endpoints, topic: str, records: int) -> None:
    """The same rows as `fill_topic` writes as JSON, as registry Protobuf (the amount as its
    decimal text: Protobuf has no decimal), each body made by the protobuf runtime from the
    compiled schema, as a producer's generated class would make it."""
    assert stack.registry_url is not None
    new_topic(stack, topic, partitions=PARTITIONS)
    with SchemaRegistryClient({"url": stack.registry_url}) as client:
        schema_id = client.register_schema(f"{topic}-value", Schema(ORDER_PROTO, "PROTOBUF"))
    header: bytes = b"\x00" + schema_id.to_bytes(4, "big") + b"\x00"  # message indexes: [0]
    order = message_factory.GetMessageClass(
        ProtoSchema(compile_schema(ORDER_PROTO, {})).message((0,))
    )

    def encoded(row: dict[str, Any]) -> bytes:
        row["amount"] = f"{row['amount']:.2f}"
        return header + order(**row).SerializeToString()

    _fill(stack, topic, records, encoded)


def consumer_rounds(
    stack: Endpoints, records: int, rounds: int, scratch: Path, typed: str = "avro"
) -> dict[str, Any]:
    topics = {
        "json": f"bench-json-{uuid.uuid4().hex[:8]}",
        typed: f"bench-{typed}-{uuid.uuid4().hex[:8]}",
    }
    fill_topic(stack, topics["json"], records)
    fill = fill_avro_topic if typed == "avro" else fill_protobuf_topic
    fill(stack, topics[typed], records)

    def run(value_format: str) -> dict[str, Any]:
        return service_run(stack, topics[value_format], records, "insert", scratch,
                           value_format=value_format)  # fmt: skip

    summary = alternated("consumer", run, rounds, goal=">= 1.0", formats=("json", typed))
    return {"records": records, "format": typed, **summary}


def alternated(
    side: str,
    run: Callable[[str], dict[str, Any]],
    rounds: int,
    *,
    goal: str,
    formats: tuple[str, str] = FORMATS,
) -> dict[str, Any]:
    """One uncounted run of each format, then `rounds` rounds, JSON first in every other one:
    each round's runs and typed / JSON ratio of rows per second, and the medians."""
    typed = formats[1]
    warm = {f: run(f) for f in formats}
    print(f"{side} warm-up (not counted): "
          + ", ".join(f"{f} {r['rows_per_second']:,} rows/s" for f, r in warm.items()))  # fmt: skip
    runs: list[dict[str, Any]] = []
    for index in range(rounds):
        order = formats if index % 2 == 0 else formats[::-1]
        one: dict[str, Any] = {f: run(f) for f in order}
        one["ratio"] = round(one[typed]["rows_per_second"] / one["json"]["rows_per_second"], 3)
        runs.append(one)
        json_rate, typed_rate = one["json"]["rows_per_second"], one[typed]["rows_per_second"]
        print(f"{side} round {index + 1}: json {json_rate:,} rows/s, {typed} {typed_rate:,} "
              f"rows/s, {typed}/json {one['ratio']}")  # fmt: skip
    return {
        "rounds": runs,
        "json_rows_per_second": median(r["json"]["rows_per_second"] for r in runs),
        f"{typed}_rows_per_second": median(r[typed]["rows_per_second"] for r in runs),
        "ratio": median(r["ratio"] for r in runs),
        "goal": goal,
    }


def write_parquet(directory: Path, records: int, files: int) -> None:
    directory.mkdir(parents=True)
    now_ms = int(time.time() * 1000)
    per_file = -(-records // files)
    schema = pa.schema([
        ("id", pa.int64()), ("customer", pa.string()), ("amount", pa.decimal128(12, 2)),
        ("currency", pa.string()), ("note", pa.string()), ("sent_ms", pa.int64()),
        ("at", pa.timestamp("us", tz="UTC")),
    ])  # fmt: skip
    at = datetime.now(UTC)
    for index in range(files):
        rows = [
            record(i, now_ms) for i in range(index * per_file, min(records, (index + 1) * per_file))
        ]
        columns = {
            name: [r[name] for r in rows]
            for name in ("id", "customer", "currency", "note", "sent_ms")
        }
        columns["amount"] = [Decimal(f"{r['amount']:.2f}") for r in rows]
        columns["at"] = [at] * len(rows)
        pq.write_table(pa.table(columns, schema=schema), directory / f"part-{index:03d}.parquet")


def producer_run(
    stack: Endpoints, data: Path, value_format: str, scratch: Path, files_per_epoch: int,
    env: dict[str, str], jars: str, records: int,
) -> dict[str, Any]:  # fmt: skip
    topic = f"bench-typed-{value_format}-{uuid.uuid4().hex[:8]}"
    new_topic(stack, topic, partitions=2)
    log = scratch / f"{topic}.log"
    command = [sys.executable, str(JOB), "--input", str(data), "--format", value_format,
               "--topic", topic, "--checkpoint", str(scratch / "checkpoints" / topic),
               "--bootstrap-servers", stack.bootstrap_servers,
               "--registry", str(stack.registry_url), "--jars", jars,
               "--files-per-epoch", str(files_per_epoch)]  # fmt: skip
    started = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    seconds = time.perf_counter() - started
    text = log.read_text()
    if code.returncode != 0:
        raise RuntimeError(f"{value_format} run exited {code.returncode}:\n{text[-3000:]}")
    query = float(text.split("query seconds ")[-1].split()[0])
    return {"format": value_format, "seconds": round(seconds, 2), "query_seconds": round(query, 2),
            "rows_per_second": round(records / seconds)}  # fmt: skip


def producer_rounds(
    stack: Endpoints, records: int, rounds: int, files: int, files_per_epoch: int, scratch: Path
) -> dict[str, Any]:
    data = scratch / "typed-in"
    write_parquet(data, records, files)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    home = precompiled_spark_home()
    if home is not None:
        env["SPARK_HOME"] = str(home)
    jars = ",".join(spark_kafka_jars())

    def run(value_format: str) -> dict[str, Any]:
        return producer_run(stack, data, value_format, scratch, files_per_epoch, env, jars, records)

    summary = alternated("producer", run, rounds, goal=">= 0.95")
    return {"records": records, "files": files, "files_per_epoch": files_per_epoch, **summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--no-producer", dest="producer", action="store_false")
    parser.add_argument("--no-consumer", dest="consumer", action="store_false")
    parser.add_argument("--format", choices=["avro", "protobuf"], default="avro",
                        help="the consumer's typed format against JSON")  # fmt: skip
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with scratch_dir("bridge-bench-typed-") as scratch, running_stack() as stack:
        if stack.registry_url is None:
            raise SystemExit("the stack has no schema registry: `bridge stack up` again")
        if args.consumer:
            figures["consumer"] = consumer_rounds(
                stack, args.records, args.rounds, scratch, args.format
            )
        if args.producer:
            figures["producer"] = producer_rounds(
                stack, args.records, args.rounds, args.files, args.files_per_epoch, scratch
            )
    path = write_results("typed", figures)
    for side, result in figures.items():
        typed = result.get("format", "avro")
        print(f"{side}: json {result['json_rows_per_second']:,} rows/s, {typed} "
              f"{result[f'{typed}_rows_per_second']:,} rows/s, {typed}/json {result['ratio']} "
              f"(goal {result['goal']})")  # fmt: skip
    print(f"wrote {path}")
    print(json.dumps({side: result["ratio"] for side, result in figures.items()}))


if __name__ == "__main__":
    main()
