"""Scaling out with whole epochs, measured as work: which member reads and publishes what.

    .venv/bin/python -m bench.query_owners [--records 400000] [--epochs 20] [--rounds 3]
        [--results-dir DIR]

Two members of a new default group (`python -m consumers`: whole epochs, `epochs_members:
one`) are started first, as a deployment is; then either

- **two queries**, each writing a topic of its own, or
- **one query**, writing one topic,

write as the sink writes them (`bench.epochs.fill_epochs`: 4 tasks an epoch, each part naming
its records' offsets), each topic into a table of its own. Each query's first epoch names its
topic and lets the members share the queries out; once each query's topic is held by one
member (and two queries by two members), the queries write `--epochs` epochs more each, at once
(`--records` records in all), and the run ends when the ledger shows every one published. For
each member, over that window: its process's CPU seconds, and the records it read
(`bridge_consumer_records_read_total`) and applied (`bridge_consumer_records_applied_total`),
scraped from its /metrics. With two queries each member should read and apply about half and
spend about half the CPU; with one query one member does it all and the other idles. On 2
cores, where Kafka and PostgreSQL share the machine, wall time cannot show the scale-out; the
work can.

The kinds alternate, `--rounds` rounds, after one small run not counted (the first run of a
fresh stack makes the state tables). Writes bench/results/query-owners-*.json.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    RESULTS,
    Endpoints,
    new_table,
    new_topic,
    running_stack,
    scratch_dir,
    write_results,
)
from bench.consumer import COLUMNS, PARTITIONS, Service
from bench.cpu import process_seconds
from bench.epochs import fill_epochs
from bridge.names import (
    DEFAULT_EPOCHS_TOPIC,
    DEFAULT_STATE_SCHEMA,
    EPOCH_WATERMARKS_TABLE,
    EPOCHS_TABLE,
)

_TASKS = 4
_WAIT_S = 600.0


def sql(dsn: str, statement: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement.encode(), params).fetchall()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scraped(port: int, name: str) -> float:
    """The sum of a metric's samples on a member's /metrics (every topic's)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        body = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(f"{name}{{") or line.startswith(f"{name} "))  # fmt: skip


def published(stack: Endpoints, group: str) -> dict[str, int]:
    """Each query's epochs published (numbered from 0, all published in order); none before
    the members have made the state tables."""
    try:
        rows = sql(stack.dsn,
                   f"SELECT q.query, greatest((SELECT max(settled_through) FROM "
                   f"{DEFAULT_STATE_SCHEMA}.{EPOCH_WATERMARKS_TABLE} w WHERE w.group_id = %(g)s "
                   "AND w.query = q.query), max(q.epoch) FILTER (WHERE q.outcome = 'published')) "
                   f"FROM {DEFAULT_STATE_SCHEMA}.{EPOCHS_TABLE} q WHERE q.group_id = %(g)s "
                   "GROUP BY q.query", {"g": group})  # fmt: skip
    except psycopg.errors.UndefinedTable:
        return {}
    return {str(query): -1 if top is None else int(top) + 1 for query, top in rows}


def owners(stack: Endpoints, group: str, topics: list[str]) -> dict[str, dict[str, int]]:
    """How many partitions of each of `topics` each member holds, by the offsets table (a
    partition released and not claimed again has none)."""
    try:
        rows = sql(stack.dsn, f"SELECT topic, owner, count(*) FROM {DEFAULT_STATE_SCHEMA}.offsets "
                   "WHERE group_id = %(g)s AND owner IS NOT NULL AND topic = ANY(%(t)s) "
                   "GROUP BY topic, owner", {"g": group, "t": topics})  # fmt: skip
    except psycopg.errors.UndefinedTable:
        return {}
    found: dict[str, dict[str, int]] = {}
    for topic, owner, count in rows:
        found.setdefault(str(topic), {})[str(owner)] = int(count)
    return found


def wait(members: list[Service], reached: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _WAIT_S
    while not reached():
        for member in members:
            if member.process.poll() is not None:
                raise RuntimeError(f"a member ended:\n{member.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not in {_WAIT_S:.0f} s")
        time.sleep(0.05)


def work(members: list[Service], ports: list[int]) -> list[dict[str, float]]:
    return [{
        "cpu_seconds": process_seconds(member.process.pid),
        "records_read": scraped(port, "bridge_consumer_records_read_total"),
        "records_applied": scraped(port, "bridge_consumer_records_applied_total"),
    } for member, port in zip(members, ports, strict=True)]  # fmt: skip


def run(stack: Endpoints, queries: int, records: int, epochs: int, scratch: Path) -> dict[str, Any]:
    """Two members of a new group, started first; `queries` queries, each on a topic of its
    own, write one epoch each (their topics are named, and each query's member known), then
    `epochs` more each, at once, `records` in all: the work of those."""
    suffix = uuid.uuid4().hex[:8]
    topics = [f"qo-{queries}-{n}-{suffix}" for n in range(queries)]
    tables = [f"qo_{queries}_{n}_{suffix}" for n in range(queries)]
    for table in tables:
        new_table(stack, table, COLUMNS)
    for topic in [*topics, DEFAULT_EPOCHS_TOPIC]:  # the manifest's is made once, kept
        new_topic(stack, topic, partitions=PARTITIONS if topic in topics else 1)
    routes = [{"topic": topic, "table": f"public.{table}"}
              for topic, table in zip(topics, tables, strict=True)]  # fmt: skip
    group = f"bench-owners-{uuid.uuid4().hex[:8]}"
    ports = [free_port(), free_port()]
    members = [Service(stack, topics[0], tables[0], "insert", scratch, group=group,
                       http_port=port, batch_max_wait_ms=None, more_routes=routes[1:])
               for port in ports]  # fmt: skip
    per_task = records // (queries * (epochs + 1) * _TASKS)
    try:
        wait(members, lambda: len(owners(stack, group, topics)) == queries, "the members' start")
        ids = [fill_epochs(stack, topic, epochs=1, tasks=_TASKS, rows_per_task=per_task,
                           query=f"bench-{uuid.uuid4().hex[:8]}") for topic in topics]  # fmt: skip

        def settled(count: int) -> bool:
            done = published(stack, group)
            return all(done.get(query, 0) >= count for query in ids)

        wait(members, lambda: settled(1), "the first epochs")

        def shared_out() -> bool:
            """Each query's topic with one member, and the queries on as many members as
            there are of both (the members take their slots as each first looks)."""
            held = owners(stack, group, topics)
            alone = all(list(held.get(t, {}).values()) == [PARTITIONS] for t in topics)
            readers = {owner for of in held.values() for owner in of}
            return alone and len(readers) == min(queries, len(members))

        wait(members, shared_out, "one member a query")
        readers = {topic: next(iter(of)) for topic, of in owners(stack, group, topics).items()}
        before, started = work(members, ports), time.perf_counter()
        writers = [threading.Thread(target=fill_epochs, args=(stack, topic), kwargs={
            "epochs": epochs, "tasks": _TASKS, "rows_per_task": per_task, "first_epoch": 1,
            "query": query}) for topic, query in zip(topics, ids, strict=True)]  # fmt: skip
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        wait(members, lambda: settled(1 + epochs), "every epoch published")
        seconds = time.perf_counter() - started
        after = work(members, ports)
    finally:
        for member in members:
            member.stop()
    written = queries * (epochs + 1) * _TASKS * per_task
    for table in tables:
        count, distinct = sql(stack.dsn, f"SELECT count(*), count(DISTINCT id) FROM "
                              f"public.{table}")[0]  # fmt: skip
        if count != distinct or count != written // queries:
            raise RuntimeError(f"{table}: {count} rows, {distinct} distinct, "
                               f"{written // queries} written")  # fmt: skip
    each = [{key: round(a[key] - b[key], 2) for key in a} for a, b in zip(after, before,
                                                                          strict=True)]  # fmt: skip
    order = sorted(range(len(each)), key=lambda n: -each[n]["records_applied"])
    each = [each[n] for n in order]  # the busier first
    applied = sum(m["records_applied"] for m in each) or 1.0
    cpu = sum(m["cpu_seconds"] for m in each) or 1.0
    measured = queries * epochs * _TASKS * per_task
    return {
        "queries": queries, "records": measured, "seconds": round(seconds, 2),
        "rows_per_second": round(measured / seconds), "members": each,
        "readers_of_topics": len(set(readers.values())),
        "applied_share": [round(m["records_applied"] / applied, 3) for m in each],
        "cpu_share": [round(m["cpu_seconds"] / cpu, 3) for m in each],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    kinds = {"two_queries": 2, "one_query": 1}
    with scratch_dir("bridge-bench-owners-") as scratch, running_stack() as stack:
        run(stack, 1, args.records // 10, 2, scratch)  # not counted: the state tables made
        runs: list[dict[str, Any]] = []
        for number in range(args.rounds):
            order = list(kinds) if number % 2 == 0 else list(reversed(kinds))
            for kind in order:
                result = run(stack, kinds[kind], args.records, args.epochs, scratch)
                runs.append(result | {"kind": kind, "round": number})
                print(
                    f"{kind}, round {number}: {result['rows_per_second']:,} rows/s, read by "
                    f"{result['readers_of_topics']} member(s); applied "
                    f"{result['applied_share']}, CPU {result['cpu_share']} "
                    f"({[m['cpu_seconds'] for m in result['members']]} s)",
                    flush=True,
                )
    figures: dict[str, Any] = {
        "records": args.records,
        "epochs_per_query": args.epochs,
        "tasks": _TASKS,
        "rounds": args.rounds,
        "runs": runs,
    }
    for kind in kinds:
        of_kind = [r for r in runs if r["kind"] == kind]
        figures[kind] = {
            "applied_share_busier": sorted(r["applied_share"][0] for r in of_kind),
            "cpu_share_busier": sorted(r["cpu_share"][0] for r in of_kind),
            "cpu_seconds": sorted(tuple(m["cpu_seconds"] for m in r["members"]) for r in of_kind),
            "rows_per_second": sorted(r["rows_per_second"] for r in of_kind),
        }  # fmt: skip
    print(f"written to {write_results('query-owners', figures, directory=args.results_dir)}")


if __name__ == "__main__":
    main()
