"""Consumer scale-out: the service's throughput with 1, 2 and 4 instances in one group.

    .venv/bin/python -m bench.consumer_scale [--records 1000000] [--instances 1 2 4] [--rounds 2]

The same records (about 150 bytes of JSON each, bench/consumer.py's) in a topic of 12
partitions, applied in insert mode by N `python -m consumers` processes of one group, started
together. Each instance count runs in every round, in turn; a run is timed from the first row
applied to the last (the instances' start-up apart), and the group's join is in it: that is
what a user waits for after scaling out. Baselines, in the same rounds: COPY of the ready-made
tuples from one connection, and from as many connections at once as there are instances.
Figures go to bench/results/consumer-scale-*.json.
"""

from __future__ import annotations

import argparse
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any

from bench.common import Endpoints, new_table, running_stack, scratch_dir, write_results
from bench.consumer import COLUMNS, Service, caught_up, fill_topic, raw_copy, ready_rows, sql

PARTITIONS = 12


def group_run(
    stack: Endpoints, topic: str, records: int, instances: int, scratch: Path
) -> dict[str, Any]:
    table = f"scale_{instances}_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, COLUMNS)
    group = f"bench-scale-{uuid.uuid4().hex[:8]}"
    target = caught_up(stack, topic, PARTITIONS)
    started = time.perf_counter()
    members = [Service(stack, topic, table, "insert", scratch, group=group)
               for _ in range(instances)]  # fmt: skip
    try:
        members[0].wait_for(1)
        first = time.perf_counter()
        members[0].wait_for(target)
        seconds = time.perf_counter() - first
        rss = max(member.peak_rss_mb() for member in members)
    finally:
        for member in members:
            member.stop()
    rows = sql(stack.dsn, f"SELECT count(*) FROM public.{table}")[0][0]
    assert rows == records, f"{instances} instances applied {rows} rows of {records}"
    return {"instances": instances, "seconds": round(seconds, 2),
            "rows_per_second": round(records / seconds),
            "start_seconds": round(first - started, 2), "peak_rss_mb": round(rss, 1)}  # fmt: skip


def parallel_copy(stack: Endpoints, rows: list[tuple[Any, ...]], connections: int) -> float:
    """Rows per second of COPY from `connections` connections at once, each a share."""
    shares = [rows[i::connections] for i in range(connections)]
    started = time.perf_counter()
    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(lambda share: raw_copy(stack, share), shares))
    return len(rows) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with scratch_dir("bridge-bench-consumer-scale-") as scratch, running_stack() as stack:
        topic = f"bench-scale-{uuid.uuid4().hex[:8]}"
        fill_topic(stack, topic, args.records, partitions=PARTITIONS)
        rows = ready_rows(args.records)
        rounds: list[dict[str, Any]] = []
        for number in range(args.rounds):
            # Who goes first turns round by round.
            order = args.instances[number % len(args.instances):] + \
                args.instances[:number % len(args.instances)]  # fmt: skip
            runs = {n: group_run(stack, topic, args.records, n, scratch) for n in order}
            copies = {n: round(parallel_copy(stack, rows, n)) for n in args.instances}
            rounds.append(
                {
                    "runs": {str(n): runs[n] for n in args.instances},
                    "copy_rows_per_second": {str(n): copies[n] for n in args.instances},
                }
            )
            print(f"round {number + 1}: " + ", ".join(
                f"{n} instance(s) {runs[n]['rows_per_second']:,} rows/s "
                f"(COPY x{n} {copies[n]:,})" for n in args.instances), flush=True)  # fmt: skip

    figures: dict[str, Any] = {}
    one = median(r["runs"][str(args.instances[0])]["rows_per_second"] for r in rounds)
    for n in args.instances:
        rate = median(r["runs"][str(n)]["rows_per_second"] for r in rounds)
        copy = median(r["copy_rows_per_second"][str(n)] for r in rounds)
        figures[str(n)] = {"rows_per_second": round(rate), "speed_up": round(rate / one, 2),
                           "copy_rows_per_second": round(copy),
                           "ratio_to_copy": round(rate / copy, 3)}  # fmt: skip
        print(f"{n} instance(s): {rate:>10,.0f} rows/s (median), x{rate / one:.2f} of "
              f"{args.instances[0]}; COPY from {n} connection(s) {copy:,.0f} rows/s, "
              f"ratio {rate / copy:.2f}")  # fmt: skip
    path = write_results("consumer-scale", {"records": args.records, "partitions": PARTITIONS,
                                            "by_instances": figures, "rounds": rounds})  # fmt: skip
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
