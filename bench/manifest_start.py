"""A new group's start against the epoch manifest's history: a week of another query's parts on
the shared manifest, against an empty manifest and against reading the week whole, in one run.

    .venv/bin/python -m bench.manifest_start [--days 7] [--trigger-s 1] [--spark-partitions 8]
        [--rounds 3] [--epochs 3] [--tasks 4] [--rows-per-task 1000] [--results-dir DIR]

Before any clock, two manifest topics (retention unlimited): `empty`, and `week`, which holds
another query's manifest as the sink writes it at a `--trigger-s` trigger with
`--spark-partitions` write tasks for `--days` days (a part per task and the epoch's record,
each epoch's records stamped when it ran, the last one now: 5.4 million records for a week at
1 s with 8 tasks). Each round, for each kind in turn (the order turned each round): a topic of
4 partitions with `--epochs` epochs of a new query, written now as the sink writes them
(bench.epochs.fill_epochs, its parts on the kind's manifest); then the clock, as a user pays
it: the service (`python -m consumers`, its own process, a new group, one whole route, the
kind's manifest as its `epochs_topic`) from its start to its last epoch published. Also the
manifest records its group read (its position on the manifest less where it started). A third
kind, `week-whole`, reads the week's manifest from its log start (`epochs_manifest_lookback_ms:
0`), as every release before this one did, though with this release's statements (a release
before read about 5,700 manifest records a second here: a week, 16 minutes). The figures are
the medians of each round's week / empty and week-whole / empty ratios. Writes
bench/results/manifest-start-*.json.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from psycopg import sql

from bench.common import (
    RESULTS,
    Endpoints,
    new_table,
    new_topic,
    running_stack,
    scratch_dir,
    write_results,
)
from bench.consumer import COLUMNS, Service
from bench.epochs import fill_epochs, published
from bridge.epoch_manifest import Epoch, Part, key_of
from bridge.names import DEFAULT_STATE_SCHEMA, OFFSETS_TABLE

# `week-whole`: the week's manifest read from its log start (`epochs_manifest_lookback_ms: 0`),
# as every release before this one read it, with this release's set-based ledger statements.
KINDS = ("empty", "week", "week-whole")


def fill_history(stack: Endpoints, manifest: str, args: argparse.Namespace) -> int:
    """Another query's manifest over `--days` days, ending now; the records written."""
    query = f"bench-history-{uuid.uuid4().hex[:8]}"
    key = key_of(query)
    epochs = int(args.days * 86_400 / args.trigger_s)
    start_ms = int(time.time() * 1000) - int(epochs * args.trigger_s * 1000)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 50,
                         "batch.size": 1_000_000, "compression.type": "lz4",
                         "queue.buffering.max.messages": 1_000_000})  # fmt: skip
    tasks = range(args.spark_partitions)
    written = 0
    for epoch in range(epochs):
        at_ms = start_ms + int(epoch * args.trigger_s * 1000)
        documents = [
            Part(query=query, epoch=epoch, partition=task, records={"elsewhere": 100})
            for task in tasks
        ]
        ended = Epoch(query=query, epoch=epoch, parts=tuple(tasks))
        for value in [*(d.encode() for d in documents), ended.encode()]:
            while True:
                try:
                    producer.produce(manifest, value, key, 0, timestamp=at_ms)
                    break
                except BufferError:
                    producer.poll(0.05)
            written += 1
        if epoch % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    producer.close()
    if left:
        raise RuntimeError(f"{manifest}: {left} records of the history not delivered in 300 s")
    return written


def manifest_read(service: Service, manifest: str) -> int:
    """The group's stored position on the manifest: where it read to."""
    row = (
        service.watcher()
        .execute(
            sql.SQL("SELECT next_offset FROM {} WHERE group_id = %s AND topic = %s").format(
                sql.Identifier(DEFAULT_STATE_SCHEMA, OFFSETS_TABLE)
            ),
            (service.group, manifest),
        )
        .fetchone()
    )
    return int(row[0]) if row else 0


def group_run(
    stack: Endpoints, kind: str, manifest: str, args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    topic = f"ms-{kind}-{uuid.uuid4().hex[:8]}"
    end_before = _log_end(stack, manifest)
    fill_epochs(stack, topic, epochs=args.epochs, tasks=args.tasks,
                rows_per_task=args.rows_per_task, manifest=manifest)  # fmt: skip
    table = f"ms_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, COLUMNS)
    records = args.epochs * args.tasks * args.rows_per_task
    started = time.perf_counter()
    group: dict[str, Any] = {"epochs_topic": manifest}
    if kind == "week-whole":
        group["epochs_manifest_lookback_ms"] = 0
    service = Service(stack, topic, table, "insert", scratch, route_options={"epochs": "whole"},
                      consumer_options=group)  # fmt: skip
    try:
        service.wait_until(lambda: published(service) >= args.epochs, timeout=3600)
        seconds = time.perf_counter() - started
        read_to = manifest_read(service, manifest)
    finally:
        service.stop()
    with psycopg.connect(stack.dsn) as conn:
        rows = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM public.{table}").fetchone()
    if rows is None or tuple(rows) != (records, records):
        raise RuntimeError(f"{table}: {rows} rows and distinct ids, {records} written")
    # Read from the log start with a lookback of 0, which the member does not log.
    started_at = 0 if kind == "week-whole" else _started_at(service.log.read_text(), manifest)
    return {
        "kind": kind,
        "seconds": round(seconds, 2),
        "manifest_history": end_before,
        "manifest_started_at": started_at,
        "manifest_records_read": read_to - started_at if started_at is not None else None,
    }


def _log_end(stack: Endpoints, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "bench"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()


def _started_at(log: str, manifest: str) -> int | None:
    """Where the group started on the manifest, from its log line saying so."""
    marker = f"{manifest}[0] never read by this group: read from offset "
    for line in log.splitlines():
        at = line.find(marker)
        if at >= 0:
            return int(line[at + len(marker) :].split()[0])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--trigger-s", type=float, default=1.0)
    parser.add_argument("--spark-partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--rows-per-task", type=int, default=1000)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    with scratch_dir("bridge-bench-manifest-start-") as scratch, running_stack() as stack:
        manifests = {kind: f"bench-epochs-{kind}-{uuid.uuid4().hex[:8]}" for kind in KINDS[:2]}
        manifests["week-whole"] = manifests["week"]
        for manifest in sorted(set(manifests.values())):
            new_topic(stack, manifest, partitions=1, topic_config={"retention.ms": "-1"})
        filling = time.perf_counter()
        history = fill_history(stack, manifests["week"], args)
        print(f"the week's manifest: {history:,} records of another query written in "
              f"{time.perf_counter() - filling:.0f} s", flush=True)  # fmt: skip
        rounds: list[list[dict[str, Any]]] = []
        for number in range(args.rounds):
            order = KINDS[number % 3 :] + KINDS[: number % 3]
            runs = [group_run(stack, kind, manifests[kind], args, scratch) for kind in order]
            rounds.append(runs)
            for r in runs:
                print(f"{r['kind']}: a new group's {args.epochs} epochs published "
                      f"{r['seconds']} s from its start; it started on the manifest at "
                      f"{r['manifest_started_at']} of {r['manifest_history']:,} and read "
                      f"{r['manifest_records_read']} records of it", flush=True)  # fmt: skip

        def seconds(kind: str) -> float:
            return float(median(r["seconds"] for rs in rounds for r in rs if r["kind"] == kind))

        def ratios(kind: str, against: str) -> list[float]:
            found = []
            for runs in rounds:
                by = {r["kind"]: r["seconds"] for r in runs}
                found.append(round(by[kind] / by[against], 3))
            return found

        each = ratios("week", "empty")
        whole = ratios("week-whole", "empty")
        figures: dict[str, Any] = {
            "days": args.days,
            "trigger_s": args.trigger_s,
            "spark_partitions": args.spark_partitions,
            "history_records": history,
            "epochs": args.epochs,
            "records": args.epochs * args.tasks * args.rows_per_task,
            "lookback_ms_default": 3_600_000,
            "seconds_empty": seconds("empty"),
            "seconds_week": seconds("week"),
            "seconds_week_whole": seconds("week-whole"),
            "ratio_week_to_empty": median(each),
            "ratios": each,
            "ratio_week_whole_to_empty": median(whole),
            "ratios_week_whole": whole,
            "manifest_records_per_second_whole": round(
                median(
                    r["manifest_records_read"] / r["seconds"]
                    for rs in rounds
                    for r in rs
                    if r["kind"] == "week-whole"
                )
            ),
            "rounds": rounds,
        }
        print(f"start to published: a week of history {figures['seconds_week']} s against an "
              f"empty manifest {figures['seconds_empty']} s: {median(each)}x (rounds {each}); "
              f"read from its log start {figures['seconds_week_whole']} s: {median(whole)}x "
              f"(rounds {whole}), {figures['manifest_records_per_second_whole']:,} manifest "
              "records a second", flush=True)  # fmt: skip
    print(f"written to {write_results('manifest-start', figures, directory=args.results_dir)}")


if __name__ == "__main__":
    main()
