"""Whole epochs' cost: the consumer's throughput, and the end-to-end latency at a 1 s trigger,
with `epochs: whole` against the per-partition mode, in one run.

    .venv/bin/python -m bench.epochs [--epochs 100] [--tasks 4] [--rows-per-task 2500]
        [--rounds 3] [--latency-seconds 90] [--latency-rounds 2] [--latency-members 2]
        [--members 1 2 3] [--group-rounds 3]

(a) Throughput. One topic of 4 partitions, written before any clock as bridge's sink writes it
    with `epochs=whole`: each task's records with their provenance headers and its part of the
    manifest in one transaction, then the epoch's record (`--epochs` epochs of `--tasks` tasks).
    The service (`python -m consumers`, a process of its own, defaults but a 20 ms batch wait as
    bench.consumer's runs) reads the same rows into a new table with each route mode, insert and
    upsert: per-partition, timed from the claim of its partitions to the offsets table at the
    topic's end; whole, to the ledger showing the last epoch published, which is when a reader
    sees it. The four runs alternate, `--rounds` rounds; the figures are the medians of each
    round's ratio whole / per-partition. Each run also gives where the time went: when its last
    record was consumed (staged, with whole epochs), and the CPU seconds of the service and of
    PostgreSQL in its window (`bench.cpu`).
(c) Scaled out, as a user pays it: `--members` services of a new group (1, 2 and 3), started
    together, with each route mode and each kind, timed from their start to every row visible
    (per partition: the offsets table at the topic's end; whole: the last epoch published), in
    `--group-rounds` rounds, the kinds alternated; figures per member count, the medians of each
    round's ratio whole / per-partition. With whole epochs one member reads the one query's
    topics (`epochs_members: one`, consumers/membership/unit_owners.py).
(b) Latency at a 1 s trigger: bench.latency's pipeline (`bridge produce --source rate` on real
    Spark, `--latency-members` services of one group, 2 by default, with default settings) with
    the sink's and the route's whole epochs, against the same pipeline per partition,
    alternated `--latency-rounds` times; p50 / p99 from the rows' event time to their
    insertion (applied_at), each row checked exactly once.
Writes bench/results/epochs-*.json.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
from confluent_kafka import Producer

from bench.common import Endpoints, new_table, new_topic, running_stack, scratch_dir, write_results
from bench.consumer import (
    COLUMNS,
    PARTITIONS,
    Service,
    caught_up,
    checkpoint,
    cpu_line,
    record,
    sql,
    stack_meter,
)
from bench.cpu import CpuMeter
from bench.latency import run_pipeline
from bridge.delivered_offsets import DeliveredOffsets
from bridge.epoch_manifest import Epoch, Part, key_of
from bridge.names import (
    DEFAULT_EPOCHS_TOPIC,
    DEFAULT_STATE_SCHEMA,
    EPOCH_WATERMARKS_TABLE,
    EPOCHS_TABLE,
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
    PROVENANCE_WHOLE,
    WHOLE_EPOCHS,
)


def fill_epochs(
    stack: Endpoints,
    topic: str,
    *,
    epochs: int,
    tasks: int,
    rows_per_task: int,
    first_epoch: int = 0,  # a query that ran before: its epochs go on from there
    manifest: str = DEFAULT_EPOCHS_TOPIC,
    query: str | None = None,  # that query's id, its topics made; else a new query's
) -> str:
    """The topic and the manifest as the sink writes them with whole epochs (each part naming
    its records' offsets, from their delivery reports); the query id."""
    if query is None:
        new_topic(stack, topic, partitions=PARTITIONS)
        new_topic(stack, manifest, partitions=1)
        query = f"bench-{uuid.uuid4().hex[:8]}"
    delivered = DeliveredOffsets()
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 20,
                         "transactional.id": f"bench-{uuid.uuid4().hex}",
                         "on_delivery": delivered})  # fmt: skip
    producer.init_transactions(30)
    now_ms = int(time.time() * 1000)
    record_id = first_epoch * tasks * rows_per_task  # ids go on from the epochs before too
    for epoch in range(first_epoch, first_epoch + epochs):
        for task in range(tasks):
            headers: list[tuple[str, str | bytes | None]] = [
                (PROVENANCE_QUERY, query.encode()),
                (PROVENANCE_PARTITION, str(task).encode()),
                (PROVENANCE_EPOCH, str(epoch).encode()),
                (PROVENANCE_WHOLE, WHOLE_EPOCHS),
            ]
            producer.begin_transaction()
            for _ in range(rows_per_task):
                value = json.dumps(record(record_id, now_ms)).encode()
                while True:
                    try:
                        producer.produce(topic, value, None, record_id % PARTITIONS,
                                         headers=headers)  # fmt: skip
                        break
                    except BufferError:
                        producer.poll(0.05)
                record_id += 1
            producer.flush(60)
            written = {topic: rows_per_task}
            part = Part(query=query, epoch=epoch, partition=task, records=written,
                        offsets=delivered.ranges(written) or {})  # fmt: skip
            delivered.clear()  # for the next transaction's
            producer.produce(manifest, part.encode(), key_of(query), 0)
            producer.commit_transaction(60)
        producer.begin_transaction()
        whole = Epoch(query=query, epoch=epoch, parts=tuple(range(tasks)))
        producer.produce(manifest, whole.encode(), key_of(query), 0)
        producer.commit_transaction(60)
    producer.close()
    return query


def published(service: Service) -> int:
    """The group's epochs published: how many through the highest one, which the ledger's rows
    or its query's watermark show (it keeps the latest settled epochs of a query, 1,000, and
    the watermark says the older ones: a count of its rows stops there). The epochs here are
    numbered from 0 and all publish. 0 before the service has made its state tables."""
    try:
        rows = (
            service.watcher()
            .execute(
                f"SELECT greatest((SELECT max(settled_through) FROM {DEFAULT_STATE_SCHEMA}."
                f"{EPOCH_WATERMARKS_TABLE} WHERE group_id = %(group)s), (SELECT max(epoch) FROM "
                f"{DEFAULT_STATE_SCHEMA}.{EPOCHS_TABLE} WHERE group_id = %(group)s AND "
                "outcome = 'published'))",
                {"group": service.group},
            )
            .fetchall()
        )
    except psycopg.errors.UndefinedTable:
        return 0
    highest = rows[0][0]
    return 0 if highest is None else int(highest) + 1


def throughput_run(
    stack: Endpoints, topic: str, records: int, epochs: int, mode: str, whole: bool, scratch: Path
) -> dict[str, Any]:
    table = f"ep_{mode}_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, f"{COLUMNS}{', PRIMARY KEY (id)' if mode == 'upsert' else ''}")
    target = caught_up(stack, topic)
    checkpoint(stack.dsn)
    route = {"epochs": "whole" if whole else "per-partition"}
    service = Service(stack, topic, table, mode, scratch, route_options=route)
    try:
        service.wait_until(lambda: service.held_partitions() >= PARTITIONS)
        meter = stack_meter(stack)
        before = meter.read(service=service.process.pid)
        joined = time.perf_counter()
        # Whole: when the last record was staged (its offset committed), and when the last
        # epoch was published; the difference is the publication the staging did not hide.
        consumed: list[float] = []

        def done() -> bool:
            if not consumed and service.position() >= target:
                consumed.append(time.perf_counter() - joined)
            return bool(consumed) and (not whole or published(service) >= epochs)

        service.wait_until(done)
        seconds = time.perf_counter() - joined
        cpu = CpuMeter.spent(before, meter.read(service=service.process.pid), seconds)
        rss = service.peak_rss_mb()
    finally:
        service.stop()
    rows = sql(stack.dsn, f"SELECT count(*), count(DISTINCT id) FROM public.{table}")[0]
    if tuple(rows) != (records, records):
        raise RuntimeError(f"{table}: {rows[0]} rows, {rows[1]} distinct, {records} written")
    return {"mode": mode, "epochs": "whole" if whole else "per-partition",
            "seconds": round(seconds, 2), "rows_per_second": round(records / seconds),
            "consumed_seconds": round(consumed[0], 2), "peak_rss_mb": round(rss, 1),
            "cpu": cpu}  # fmt: skip


def group_run(
    stack: Endpoints,
    topic: str,
    records: int,
    epochs: int,
    mode: str,
    whole: bool,
    members: int,
    scratch: Path,
) -> dict[str, Any]:
    """`members` services of a new group, started together, timed from their start to every
    row visible: per partition, the offsets table at the topic's end (rows and offsets commit
    together); whole, the ledger showing the last epoch published. Start-up, the group's join
    and the election of the whole routes' reader are in it, as a user who scales out pays them."""
    table = f"eg_{mode}_{members}_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, f"{COLUMNS}{', PRIMARY KEY (id)' if mode == 'upsert' else ''}")
    target = caught_up(stack, topic)
    checkpoint(stack.dsn)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    route = {"epochs": "whole" if whole else "per-partition"}
    meter = stack_meter(stack)
    before = meter.read()
    started = time.perf_counter()
    services = [Service(stack, topic, table, mode, scratch, route_options=route, group=group)
                for _ in range(members)]  # fmt: skip
    watcher = services[0]
    try:

        def done() -> bool:
            for service in services[1:]:
                if service.process.poll() is not None:
                    raise RuntimeError(f"a member stopped:\n{service.log.read_text()[-2000:]}")
            if whole:
                return published(watcher) >= epochs
            return watcher.position() >= target

        watcher.wait_until(done)
        seconds = time.perf_counter() - started
        cpu = CpuMeter.spent(before, meter.read(), seconds)
    finally:
        for service in services:
            service.stop()
    rows = sql(stack.dsn, f"SELECT count(*), count(DISTINCT id) FROM public.{table}")[0]
    if tuple(rows) != (records, records):
        raise RuntimeError(f"{table}: {rows[0]} rows, {rows[1]} distinct, {records} written")
    return {"members": members, "mode": mode, "epochs": "whole" if whole else "per-partition",
            "seconds": round(seconds, 2), "rows_per_second": round(records / seconds),
            "cpu": cpu}  # fmt: skip


def group_figures(
    stack: Endpoints, topic: str, records: int, epochs: int, args: argparse.Namespace,
    scratch: Path,
) -> dict[str, Any]:  # fmt: skip
    """(c): every member count, mode and kind in each round, the kinds alternated. One run
    of each kind first, not counted: the first run of a fresh stack makes the state tables."""
    for whole in (False, True):
        group_run(stack, topic, records, epochs, "insert", whole, 1, scratch)
    runs: list[dict[str, Any]] = []
    for number in range(args.group_rounds):
        for members in args.members:
            for mode in ("insert", "upsert"):
                kinds = (False, True) if (number + members) % 2 == 0 else (True, False)
                for whole in kinds:
                    run = group_run(stack, topic, records, epochs, mode, whole, members, scratch)
                    runs.append(run | {"round": number})
                    print(f"{members} member(s), {mode} {run['epochs']}: "
                          f"{run['rows_per_second']:,}/s ({run['seconds']} s from the start); "
                          f"{cpu_line(run['cpu'])}", flush=True)  # fmt: skip
    figures: dict[str, Any] = {"group_runs": runs}
    for members in args.members:
        for mode in ("insert", "upsert"):
            ratios = []
            for number in range(args.group_rounds):
                of_round = [r for r in runs if r["round"] == number
                            and r["members"] == members and r["mode"] == mode]  # fmt: skip
                rate = {r["epochs"]: r["rows_per_second"] for r in of_round}
                ratios.append(rate["whole"] / rate["per-partition"])
            key = f"members_{members}_{mode}"
            figures[f"{key}_ratio"] = round(median(ratios), 3)
            figures[f"{key}_ratios"] = [round(r, 3) for r in ratios]
            for kind in ("per-partition", "whole"):
                figures[f"{key}_{kind}_rows_per_second"] = median(
                    r["rows_per_second"] for r in runs
                    if r["members"] == members and r["mode"] == mode and r["epochs"] == kind
                )  # fmt: skip
            ratio, each = figures[f"{key}_ratio"], figures[f"{key}_ratios"]
            print(f"{members} member(s), {mode}: whole epochs at {ratio}x the per-partition "
                  f"mode (rounds {each})", flush=True)  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--rows-per-task", type=int, default=2500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=90)
    parser.add_argument("--latency-rounds", type=int, default=2)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--members", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--group-rounds", type=int, default=3)
    parser.add_argument("--latency-members", type=int, default=2)
    args = parser.parse_args()
    records = args.epochs * args.tasks * args.rows_per_task
    figures: dict[str, Any] = {"records": records, "epochs": args.epochs, "tasks": args.tasks}
    with scratch_dir("bridge-bench-epochs-") as scratch, running_stack() as stack:
        topic = f"ep-{uuid.uuid4().hex[:8]}"
        fill_epochs(stack, topic, epochs=args.epochs, tasks=args.tasks,
                    rows_per_task=args.rows_per_task)  # fmt: skip
        rounds: list[list[dict[str, Any]]] = []
        for number in range(args.rounds):
            order = [(m, w) for m in ("insert", "upsert") for w in (False, True)]
            if number % 2:
                order = [(m, not w) for m, w in order]  # each mode first in every other round
            runs = [throughput_run(stack, topic, records, args.epochs, m, w, scratch)
                    for m, w in order]  # fmt: skip
            rounds.append(runs)
            for r in runs:
                print(f"{r['mode']} {r['epochs']}: {r['rows_per_second']:,}/s, the last record "
                      f"consumed at {r['consumed_seconds']} s of {r['seconds']} s; "
                      f"{cpu_line(r['cpu'])}", flush=True)  # fmt: skip
        figures["throughput_rounds"] = rounds
        for mode in ("insert", "upsert") if rounds else ():
            ratios = []
            for runs in rounds:
                rate = {r["epochs"]: r["rows_per_second"] for r in runs if r["mode"] == mode}
                ratios.append(rate["whole"] / rate["per-partition"])
            figures[f"{mode}_ratio"] = round(median(ratios), 3)
            figures[f"{mode}_ratios"] = [round(r, 3) for r in ratios]
            for kind in ("per-partition", "whole"):
                figures[f"{mode}_{kind}_rows_per_second"] = median(
                    r["rows_per_second"] for runs in rounds for r in runs
                    if r["mode"] == mode and r["epochs"] == kind
                )  # fmt: skip
            print(f"{mode}: whole epochs at {figures[f'{mode}_ratio']}x the per-partition mode "
                  f"(rounds {figures[f'{mode}_ratios']})", flush=True)  # fmt: skip
        if args.members:
            figures |= group_figures(stack, topic, records, args.epochs, args, scratch)
        latency: list[dict[str, Any]] = []
        for number in range(args.latency_rounds):
            for whole in (False, True) if number % 2 == 0 else (True, False):
                run = run_pipeline(stack, "1 second", rate=args.rate,
                                   seconds=args.latency_seconds, scratch=scratch,
                                   whole_epochs=whole,
                                   members=args.latency_members)  # fmt: skip
                run["epochs"] = "whole" if whole else "per-partition"
                latency.append(run)
                print(f"1 s trigger, {run['epochs']}: p50 {run['p50_ms']} ms, p99 "
                      f"{run['p99_ms']} ms", flush=True)  # fmt: skip
        figures["latency_runs"] = latency
        if latency:
            for kind in ("per-partition", "whole"):
                figures[f"latency_{kind}_p99_ms"] = median(
                    r["p99_ms"] for r in latency if r["epochs"] == kind
                )
            added = figures["latency_whole_p99_ms"] - figures["latency_per-partition_p99_ms"]
            figures["latency_p99_added_ms"] = round(added, 1)
            print(f"p99 at a 1 s trigger: {added:+.0f} ms with whole epochs", flush=True)
        figures["latency_members"] = args.latency_members
        figures["goals"] = {
            "insert_ratio": 0.9, "upsert_ratio": 0.9, "p99_added_ms": 1000,
            "members_1_ratio": 0.9, "members_2_3_insert_ratio": 0.8,
            "members_2_3_upsert_ratio": 0.85,
        }  # fmt: skip
    print(f"figures: {write_results('epochs', figures)}")


if __name__ == "__main__":
    main()
