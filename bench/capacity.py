"""Capacity figures for docs/capacity.md, measured on the cluster stack (three Kafka nodes).

    .venv/bin/python -m bench.capacity [--epochs 1000] [--tasks 4] [--records 200000]
        [--namings pooled,per-epoch,per-partition]

(a) The producer's transactional ids under each naming: `bridge produce` over --epochs files,
    one per epoch, each split in --tasks write tasks. Counted on the brokers (Kafka's own
    TransactionsCommand), with what they hold: the transaction log's bytes on disk (all
    replicas) and the coordinators' TransactionMetadata objects on the heap (jcmd's class
    histogram of each broker).
(b) The marker groups (one per Spark partition) and what each epoch's marker commit adds to
    __consumer_offsets.
(c) The consumer's offsets table: WAL bytes per batch beyond those of the rows themselves (the
    service's run against COPY of the same rows in batches of the same size), row updates per
    batch, on a topic of 12 partitions.
Figures go to bench/results/capacity-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.common import Endpoints, scratch_dir, write_results
from bench.consumer import (
    COLUMNS,
    Service,
    caught_up,
    fill_topic,
    raw_copy,
    ready_rows,
    sql,
)
from bridge.kafka_admin import create_topic
from bridge.names import DEFAULT_STATE_SCHEMA, MARKER_GROUP_INFIX, METRIC_BATCHES
from bridge_shell.spark.locations import PROGRESS_FILE
from bridge_shell.stack import LocalStack
from bridge_shell.stack.kafka import KafkaServer
from bridge_shell.stack.process import free_port
from spark_jobs.progress import SinkCounters

CONSUMER_PARTITIONS = 12


def transactional_ids(bootstrap: str, prefix: str) -> int:
    """How many transactional ids of `prefix` the brokers hold: the live keys of the transaction
    log itself (key: int16 version, then the id as an int16-length string; a tombstone is an
    id the coordinator expired)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"capacity-{uuid.uuid4()}",
                       "enable.auto.commit": False, "enable.partition.eof": True})  # fmt: skip
    try:
        topic = "__transaction_state"
        partitions = reader.list_topics(topic, timeout=30).topics[topic].partitions
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        live: dict[str, bool] = {}
        ended: set[int] = set()
        deadline = time.monotonic() + 120
        while len(ended) < len(partitions) and time.monotonic() < deadline:
            message = reader.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                partition = message.partition()
                if error.code() == KafkaError._PARTITION_EOF and partition is not None:
                    ended.add(partition)
                continue
            key = message.key() or b""
            (length,) = struct.unpack(">h", key[2:4])
            transactional_id = key[4 : 4 + length].decode()
            live[transactional_id] = message.value() is not None
    finally:
        reader.close()
    return sum(1 for name, alive in live.items() if alive and name.startswith(prefix))


def log_bytes(nodes: list[KafkaServer], topic: str) -> int:
    """Bytes of `topic`'s log segments on disk, every replica counted."""
    return sum(
        segment.stat().st_size
        for node in nodes
        for segment in node.data_dir.glob(f"{topic}-*/*.log")
    )


def heap_transaction_metadata(nodes: list[KafkaServer]) -> tuple[int, int]:
    """(instances, shallow bytes) of the coordinators' TransactionMetadata, over all brokers."""
    count = size = 0
    for node in nodes:
        histogram = subprocess.run(
            ["jcmd", str(node.pid), "GC.class_histogram"],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout  # fmt: skip
        for line in histogram.splitlines():
            match = re.match(r"\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)", line)
            if match and match.group(3).endswith(".TransactionMetadata"):
                count += int(match.group(1))
                size += int(match.group(2))
    return count, size


def produce_run(
    stack: Endpoints, scratch: Path, nodes: list[KafkaServer], naming: str, args: argparse.Namespace
) -> dict[str, Any]:
    name = f"cap-{naming}-{uuid.uuid4().hex[:6]}"
    create_topic(stack.bootstrap_servers, name, partitions=args.tasks)
    data = scratch / name / "in"
    data.mkdir(parents=True)
    for epoch in range(args.epochs):
        lines = (json.dumps({"id": epoch * 10_000 + i, "pad": "x" * 80}) for i in range(2000))
        (data / f"part-{epoch:04d}.jsonl").write_text("\n".join(lines) + "\n")
    before_txn = log_bytes(nodes, "__transaction_state")
    before_offsets = log_bytes(nodes, "__consumer_offsets")
    before_heap = heap_transaction_metadata(nodes)
    split = (data / "part-0000.jsonl").stat().st_size // args.tasks + 1
    command = [
        str(Path(sys.executable).with_name("bridge")), "produce", "--source", "files",
        "--input", str(data), "--topic", name, "--checkpoint", str(scratch / name / "ck"),
        "--bootstrap-servers", stack.bootstrap_servers, "--max-files-per-trigger", "1",
        "--transactional-id-prefix", name, "--stack-dir", str(scratch / "none"),
        "--spark-conf", f"spark.sql.files.maxPartitionBytes={split}",
        "--spark-conf", "spark.sql.files.openCostInBytes=0",
    ]  # fmt: skip
    command += ["--transactional-id-naming", naming]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=3600, check=False, env=_environment()
    )
    if result.returncode != 0:
        raise RuntimeError(result.stdout[-2000:] + result.stderr[-3000:])
    time.sleep(5)  # the coordinators write the ids' final states
    ids = transactional_ids(stack.bootstrap_servers, name)
    after_heap = heap_transaction_metadata(nodes)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    groups = [g.group_id for g in admin.list_consumer_groups().result(60).valid]
    markers = sum(1 for g in groups if g.startswith(name + MARKER_GROUP_INFIX))
    txn_bytes = log_bytes(nodes, "__transaction_state") - before_txn
    offsets_bytes = log_bytes(nodes, "__consumer_offsets") - before_offsets
    # Spark decides the splits: the task-epochs are what the sink counted, not what was asked.
    task_epochs = SinkCounters.load(scratch / name / "ck" / PROGRESS_FILE).partitions_written
    return {
        "naming": naming,
        "epochs": args.epochs,
        "task_epochs": task_epochs,
        "transactional_ids": ids,
        "transaction_log_bytes_all_replicas": txn_bytes,
        "transaction_log_bytes_per_task_epoch": round(txn_bytes / task_epochs),
        "heap_transaction_metadata_added": after_heap[0] - before_heap[0],
        "heap_transaction_metadata_bytes_added": after_heap[1] - before_heap[1],
        "marker_groups": markers,
        "consumer_offsets_bytes_all_replicas": offsets_bytes,
        "consumer_offsets_bytes_per_task_epoch": round(offsets_bytes / task_epochs),
    }


def wal_position(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def offsets_updates(dsn: str) -> int:
    rows = sql(dsn, "SELECT coalesce(sum(n_tup_upd + n_tup_ins), 0) FROM pg_stat_user_tables "
                    f"WHERE schemaname = '{DEFAULT_STATE_SCHEMA}' "
                    "AND relname = 'offsets'")  # fmt: skip
    return int(rows[0][0])


def consumer_run(stack: Endpoints, scratch: Path, records: int) -> dict[str, Any]:
    topic = f"cap-c-{uuid.uuid4().hex[:6]}"
    fill_topic(stack, topic, records, partitions=CONSUMER_PARTITIONS)
    rows = ready_rows(records)

    start = wal_position(stack.dsn)
    raw_copy(stack, rows)  # the rows alone, in batches of the service's size
    copy_wal = wal_position(stack.dsn) - start

    table = f"cap_svc_{uuid.uuid4().hex[:6]}"
    sql(stack.dsn, f"CREATE TABLE public.{table} ({COLUMNS})")
    updates_before, start = offsets_updates(stack.dsn), wal_position(stack.dsn)
    port = free_port()
    service = Service(
        stack, topic, table, "insert", scratch, batch_max_wait_ms=None, http_port=port
    )
    try:
        service.wait_for(caught_up(stack, topic, CONSUMER_PARTITIONS))
        batches = _batches(port)
    finally:
        service.stop()
    service_wal = wal_position(stack.dsn) - start
    time.sleep(1)  # the statistics collector's report
    updates = offsets_updates(stack.dsn) - updates_before
    return {
        "records": records,
        "partitions": CONSUMER_PARTITIONS,
        "wal_bytes_copy": copy_wal,
        "wal_bytes_service": service_wal,
        "batches": batches,
        "offset_row_writes": updates,
        "offset_rows_per_batch": round(updates / batches, 2) if batches else None,
        "extra_wal_bytes_per_batch": round((service_wal - copy_wal) / batches) if batches else None,
        "extra_wal_bytes_per_record": round((service_wal - copy_wal) / records, 1),
    }


def _batches(port: int) -> int:
    """Database transactions the service committed, from its own /metrics."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return round(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith(f"{METRIC_BATCHES}_total")))  # fmt: skip


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--namings", default="pooled,per-epoch,per-partition")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    with scratch_dir("bridge-bench-capacity-") as scratch:
        stack = LocalStack(scratch / "stack", brokers=3)
        status = stack.up(timeout=240)
        try:
            assert status.bootstrap_servers and status.dsn
            endpoints = Endpoints(status.bootstrap_servers, status.dsn)
            nodes = stack.kafka_nodes(stack.state())
            producer = [produce_run(endpoints, scratch, nodes, naming, args)
                        for naming in args.namings.split(",")]  # fmt: skip
            consumer = consumer_run(endpoints, scratch, args.records)
        finally:
            stack.down()
    for run in producer:
        print(json.dumps(run))
    print(json.dumps(consumer))
    path = write_results("capacity", {"producer": producer, "consumer": consumer})
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
