"""A group's ledger grown old against a fresh group's, in one run: what a month of settled
epochs costs the member that drains, and PostgreSQL while it idles.

    .venv/bin/python -m bench.ledger_age [--history 1000000] [--epochs 10] [--tasks 4]
        [--rows-per-task 5000] [--rounds 3] [--idle-seconds 20] [--looks 200]

One topic of 4 partitions and the manifest, written before any clock as bridge's sink writes them
with whole epochs (`bench.epochs.fill_epochs`): `--epochs` epochs of one query, numbered after
`--history`. Each round runs three new groups, in an order turned by one each round:

- fresh: nothing in its ledger;
- aged: its ledger already holds `--history` settled epochs of the same query, numbered before
  the topic's (a 1 s trigger settles 86,400 a day: 1,000,000 is 12 days), as a release before
  the watermark (state schema 0006) kept them: the member prunes them while it runs, the
  upgrade's cost;
- pruned: the same history as this release leaves it: the query's watermark at its last epoch
  and its last `KEEP_SETTLED` settled epochs kept;

written into the project's own tables (`consumers.database.state.ensure_state`) and ANALYZEd,
as autovacuum does to a table that grew; deleted again after the round.

For each group: the service (`python -m consumers`, one member, a whole route) drains the
topic, timed from its claim of the partitions to the ledger showing the last epoch published
(when a reader sees it); then, left idle for `--idle-seconds`, PostgreSQL's CPU and the rows of
the epochs table read meanwhile (`pg_stat_user_tables`) while its publisher looks every 0.2 s;
then, the service stopped, `--looks` looks (`consumers.epochs.ledger.open_epochs`, what the
publisher runs) timed from here, and the plan and time of a look's first statement (EXPLAIN
ANALYZE). The figures are the medians of each round's aged / fresh and pruned / fresh ratios,
and the group's rows left in the epochs table at the end. Writes
bench/results/ledger-age-*.json.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
from psycopg import sql

from bench.common import Endpoints, new_table, running_stack, scratch_dir, write_results
from bench.consumer import COLUMNS, PARTITIONS, Service, checkpoint, cpu_line, stack_meter
from bench.cpu import CpuMeter
from bench.epochs import fill_epochs
from bridge.names import DEFAULT_STATE_SCHEMA, EPOCHS_TABLE
from consumers.database.ledger_tables import LedgerNames
from consumers.database.state import ensure_state
from consumers.epochs.ledger import KEEP_SETTLED, open_epochs

KINDS = ("fresh", "aged", "pruned")


class _FirstStatement:
    """A connection that keeps the first statement run on it, for its plan."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self.first: tuple[Any, Any] | None = None

    def execute(self, query: Any, params: Any = None) -> psycopg.Cursor[Any]:
        if self.first is None:
            self.first = (query, params)
        return self._conn.execute(query, params)


def seed(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    group: str,
    query: str,
    n: int,
    *,
    pruned: bool = False,
) -> None:
    """`n` epochs of `query` settled by `group`, as publication leaves them (parts, chunks and
    counts are cleared at settlement: only the epochs' rows stay); `pruned`: as this release
    leaves them, the watermark at the last and only the last `KEEP_SETTLED` rows kept."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (group_id, query, epoch, parts, manifest_at, outcome, settled_at) "
            "SELECT %s, %s, n, '{{0,1,2,3}}', now(), 'published', now() "
            "FROM generate_series(%s, %s) AS n"
        ).format(names.epochs),
        (group, query, max(0, n - KEEP_SETTLED) if pruned else 0, n - 1),
    )
    if pruned:
        conn.execute(
            sql.SQL("INSERT INTO {} (group_id, query, settled_through) VALUES (%s, %s, %s)").format(
                names.watermarks
            ),
            (group, query, n - 1),
        )
    conn.execute(sql.SQL("ANALYZE {}").format(names.epochs))


def drained(service: Service, query: str, first_epoch: int) -> int:
    """The topic's epochs the group published (the history's are not counted); 0 before the
    service made its state tables. By the primary key's range of the topic's epochs: polled
    every 20 ms, a read of the history would load the database it measures."""
    try:
        row = (
            service.watcher()
            .execute(
                sql.SQL(
                    "SELECT count(*) FROM {} WHERE group_id = %s AND query = %s "
                    "AND epoch >= %s AND outcome = 'published'"
                ).format(sql.Identifier(DEFAULT_STATE_SCHEMA, EPOCHS_TABLE)),
                (service.group, query, first_epoch),
            )
            .fetchone()
        )
    except psycopg.errors.UndefinedTable:
        return 0
    return int(row[0]) if row else 0


def table_bytes(conn: psycopg.Connection[Any]) -> int:
    """The epochs table's size on disk, its indexes included."""
    row = conn.execute(
        "SELECT pg_total_relation_size(format('%%I.%%I', %s::text, %s::text))",
        (DEFAULT_STATE_SCHEMA, EPOCHS_TABLE),
    ).fetchone()
    return int(row[0]) if row else 0


def epochs_read(conn: psycopg.Connection[Any], names: LedgerNames) -> tuple[int, int]:
    """(sequential scans, rows read by scans and index fetches) of the epochs table so far:
    this session's, and every backend's that has reported (within a second of going idle)."""
    conn.execute("SELECT pg_stat_force_next_flush()")  # this backend's counts, when idle
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT seq_scan, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
        "FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
        (names.schema, EPOCHS_TABLE),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def looks(
    conn: psycopg.Connection[Any], names: LedgerNames, group: str, count: int
) -> dict[str, Any]:
    """`count` looks timed, and the first statement's plan: its top node and its time."""
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        open_epochs(conn, names, group)
        seconds.append(time.perf_counter() - started)
    keeper = _FirstStatement(conn)
    open_epochs(keeper, names, group)  # type: ignore[arg-type]
    assert keeper.first is not None
    query, params = keeper.first
    plan = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + query, params).fetchone()
    assert plan is not None
    top = plan[0][0]
    nodes = _node_types(top["Plan"])
    return {
        "look_ms_median": round(median(seconds) * 1000, 3),
        "look_ms_max": round(max(seconds) * 1000, 3),
        "first_statement_ms": round(float(top["Execution Time"]), 3),
        "first_statement_nodes": nodes,
        "first_statement_seq_scan": any(n.startswith("Seq Scan") for n in nodes),
    }


def _node_types(plan: dict[str, Any]) -> list[str]:
    name = plan["Node Type"] + (f" on {plan['Relation Name']}" if "Relation Name" in plan else "")
    return [name, *(n for child in plan.get("Plans", []) for n in _node_types(child))]


def group_run(
    stack: Endpoints,
    topic: str,
    query: str,
    args: argparse.Namespace,
    kind: str,
    scratch: Path,
) -> dict[str, Any]:
    names = LedgerNames(DEFAULT_STATE_SCHEMA)
    group = f"bench-age-{uuid.uuid4().hex[:8]}"
    table = f"age_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, COLUMNS)
    records = args.epochs * args.tasks * args.rows_per_task
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        grown = 0
        if kind != "fresh":
            before_seed = table_bytes(conn)
            seed(conn, names, group, query, args.history, pruned=kind == "pruned")
            grown = table_bytes(conn) - before_seed
        checkpoint(stack.dsn)
        service = Service(stack, topic, table, "insert", scratch, group=group,
                          route_options={"epochs": "whole"})  # fmt: skip
        meter = stack_meter(stack)
        try:
            service.wait_until(lambda: service.held_partitions() >= PARTITIONS)
            before = meter.read(service=service.process.pid)
            joined = time.perf_counter()
            service.wait_until(lambda: drained(service, query, args.history) >= args.epochs)
            seconds = time.perf_counter() - joined
            drain = CpuMeter.spent(before, meter.read(service=service.process.pid), seconds)
            # Idle: only the publisher's looks run.
            _, read_before = epochs_read(conn, names)
            idle_before = meter.read(service=service.process.pid)
            idle_started = time.perf_counter()
            time.sleep(args.idle_seconds)  # the window measured: nothing to wait for
            idle_seconds = time.perf_counter() - idle_started
            idle = CpuMeter.spent(idle_before, meter.read(service=service.process.pid),
                                  idle_seconds)  # fmt: skip
            read = epochs_read(conn, names)[1] - read_before
        finally:
            service.stop()
        looked = looks(conn, names, group, args.looks)
        rows = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM public.{table}").fetchone()
        left = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE group_id = %s").format(names.epochs), (group,)
        ).fetchone()
        for kept in (names.epochs, names.watermarks):
            conn.execute(sql.SQL("DELETE FROM {} WHERE group_id = %s").format(kept), (group,))
        # Compacted and analyzed now: the file a deleted history leaves is each later group's
        # autovacuum's to read, whose CPU PostgreSQL's tree counts when the worker exits, in
        # the next group's idle window (measured: up to 9x a fresh group's idle CPU).
        conn.execute(sql.SQL("VACUUM (FULL, ANALYZE) {}").format(names.epochs))
    if rows is None or tuple(rows) != (records, records):
        raise RuntimeError(f"{table}: {rows} rows and distinct ids, {records} written")
    return {
        "group": kind,
        "history": args.history if kind != "fresh" else 0,
        # The group's rows in the epochs table at the end: what pruning left.
        "epochs_rows_left": int(left[0]) if left else 0,
        # What the history added to the epochs table, its indexes included.
        "history_bytes": grown,
        "seconds": round(seconds, 2),
        "rows_per_second": round(records / seconds),
        "cpu": drain,
        "idle_cpu": idle,
        "idle_epochs_rows_read": read,
        **looked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--rows-per-task", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=20)
    parser.add_argument("--looks", type=int, default=200)
    args = parser.parse_args()
    figures: dict[str, Any] = {
        "history": args.history,
        "records": args.epochs * args.tasks * args.rows_per_task,
        "epochs": args.epochs,
    }
    with scratch_dir("bridge-bench-ledger-age-") as scratch, running_stack() as stack:
        ensure_state(stack.dsn, DEFAULT_STATE_SCHEMA)  # the tables the history goes into
        topic = f"age-{uuid.uuid4().hex[:8]}"
        query = fill_epochs(stack, topic, epochs=args.epochs, tasks=args.tasks,
                            rows_per_task=args.rows_per_task,
                            first_epoch=args.history)  # fmt: skip
        rounds: list[list[dict[str, Any]]] = []
        for number in range(args.rounds):
            order = KINDS[number % 3 :] + KINDS[: number % 3]
            runs = [group_run(stack, topic, query, args, kind, scratch) for kind in order]
            rounds.append(runs)
            for r in runs:
                print(f"{r['group']}: drained {r['rows_per_second']:,} rows/s; "
                      f"{cpu_line(r['cpu'])}; idle {args.idle_seconds:g} s: PostgreSQL "
                      f"{r['idle_cpu']['postgres_cpu_s']} CPU s, {r['idle_epochs_rows_read']:,} "
                      f"ledger rows read; a look {r['look_ms_median']} ms, its first statement "
                      f"{r['first_statement_ms']} ms ({', '.join(r['first_statement_nodes'])}); "
                      f"{r['epochs_rows_left']:,} epochs rows left",
                      flush=True)  # fmt: skip
        figures["rounds"] = rounds

        def ratios(of: Any, kind: str) -> list[float]:
            found = []
            for runs in rounds:
                by = {r["group"]: of(r) for r in runs}
                found.append(round(by[kind] / by["fresh"], 3) if by["fresh"] else float("inf"))
            return found

        def figure(name: str, of: Any) -> None:
            for kind in KINDS:
                figures[f"{name}_{kind}"] = median(
                    of(r) for runs in rounds for r in runs if r["group"] == kind
                )
            for kind in KINDS[1:]:
                # "aged" keeps the name it had before "pruned" came: `<name>_ratio`.
                suffix = "" if kind == "aged" else f"_{kind}"
                each = ratios(of, kind)
                figures[f"{name}_ratio{suffix}"] = median(each)
                figures[f"{name}_ratios{suffix}"] = each
                print(f"{name}: {kind} {figures[f'{name}_{kind}']} against fresh "
                      f"{figures[f'{name}_fresh']}: {median(each)}x (rounds {each})",
                      flush=True)  # fmt: skip

        figure("drain_rows_per_second", lambda r: r["rows_per_second"])
        figure("idle_postgres_cpu_s", lambda r: r["idle_cpu"]["postgres_cpu_s"])
        figure("idle_epochs_rows_read", lambda r: r["idle_epochs_rows_read"])
        figure("look_ms", lambda r: r["look_ms_median"])
        figure("first_statement_ms", lambda r: r["first_statement_ms"])
        grown = [r["history_bytes"] for runs in rounds for r in runs if r["group"] == "aged"]
        if grown and args.history:
            figures["bytes_per_settled_epoch"] = round(median(grown) / args.history, 1)
            each = figures["bytes_per_settled_epoch"]
            print(f"the epochs table, its indexes included: {each} bytes per settled epoch",
                  flush=True)  # fmt: skip
        figure("epochs_rows_left", lambda r: r["epochs_rows_left"])
        for kind in KINDS:  # a fresh group's few rows are read whole, rightly
            figures[f"first_statement_seq_scan_{kind}"] = any(
                r["first_statement_seq_scan"] for runs in rounds for r in runs if r["group"] == kind
            )
    print(f"written to {write_results('ledger-age', figures)}")


if __name__ == "__main__":
    main()
