"""End-to-end latency: from a row's event time in Spark to its insertion in PostgreSQL.

    .venv/bin/python -m bench.latency [--rate 10000] [--seconds 120]
        [--triggers '1 second' '500 milliseconds' '250 milliseconds']

For each trigger, as a user runs the pipeline: `bridge produce --source rate` at --rate rows/s
with that processing-time trigger, and `python -m consumers` (the service, default settings)
into a table whose `applied_at` column PostgreSQL fills with clock_timestamp() as it inserts
each row. After --seconds the producer is stopped, the consumer drains, and the figures come
from the table alone: latency = applied_at - the rate source's timestamp of the row, p50 / p99
/ max over the run after its first 15 s (start-up), and every row checked present exactly once.

Spark's rate source hands out rows a whole second at a time: its offset is the number of whole
seconds since it started, so the rows stamped within a second exist for Spark only once that
second is over, 0 to 1 s after their timestamps, and the trigger picks them up later still.
So the figures come twice: from the event time, and from the moment the row became available
to Spark (the end of its second; `from_available`), which is what the pipeline itself adds,
the trigger's wait included. That wait depends on the run: Spark fires a processing-time
trigger at multiples of its interval on the wall clock, while the source's seconds end at the
millisecond it started, so every row of a run waits the same extra time for its trigger
(`trigger_wait_ms`, when epochs are shorter than the interval); it moves a 1 s trigger's
figures by up to a second from one run to the next.

A trigger keeps up when the latency does not grow: the median of the run's last quarter is
within 0.5 s of its second quarter's.
Writes bench/results/latency-*.json, and the CDF of each run to docs/plots/latency-cdf.png.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    Endpoints,
    new_table,
    new_topic,
    running_stack,
    scratch_dir,
    write_results,
)
from bench.consumer import Service, sql
from bench.plot import PLOTS, latency_cdf

PARTITIONS = 4
WARM_UP_S = 15  # the producer's and consumer's start-up, left out of the figures
_SECONDS_PER_TRIGGER = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
                        "s": 1.0, "second": 1.0, "seconds": 1.0}  # fmt: skip


def trigger_seconds(trigger: str) -> float:
    amount, unit = trigger.split()
    return float(amount) * _SECONDS_PER_TRIGGER[unit]


def run_pipeline(
    stack: Endpoints,
    trigger: str,
    *,
    rate: int,
    seconds: float,
    scratch: Path,
    whole_epochs: bool = False,
    members: int = 1,
) -> dict[str, Any]:
    """One run; with `whole_epochs`, the sink writes the epoch manifest and the route waits for
    whole epochs (bench/epochs.py); `members` services of one group read it."""
    name = f"lat-{uuid.uuid4().hex[:8]}"
    new_topic(stack, name, partitions=PARTITIONS)
    table = name.replace("-", "_")
    new_table(stack, table, 'value bigint, "timestamp" timestamptz, '
                            "applied_at timestamptz DEFAULT clock_timestamp()")  # fmt: skip
    route = {"epochs": "whole" if whole_epochs else "per-partition"}
    group = f"bench-{uuid.uuid4().hex[:8]}"
    consumers = [
        Service(stack, name, table, "insert", scratch, batch_max_wait_ms=None,
                route_options=route, group=group)
        for _ in range(members)
    ]  # fmt: skip
    checkpoint = scratch / f"checkpoint-{name}"
    command = [
        str(Path(sys.executable).with_name("bridge")), "produce", "--source", "rate",
        "--rows-per-second", str(rate), "--trigger", trigger, "--topic", name,
        "--checkpoint", str(checkpoint), "--bootstrap-servers", stack.bootstrap_servers,
        "--epochs", "whole" if whole_epochs else "per-partition",
    ]  # fmt: skip
    log = scratch / f"{name}-producer.log"
    try:
        with log.open("w") as out:
            producer = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
            try:
                time.sleep(seconds)
                producer.send_signal(signal.SIGTERM)
                code = producer.wait(timeout=120)
            finally:
                if producer.poll() is None:
                    producer.kill()
        if code != 0:
            raise RuntimeError(f"the producer exited {code}:\n{log.read_text()[-3000:]}")
        progress = json.loads((checkpoint / "bridge-sink-progress.json").read_text())
        written = int(progress["rows_written"])
        _wait_for_rows(stack, table, written, consumers)
    finally:
        for consumer in consumers:
            consumer.stop()
    return measure(stack, table, written, trigger=trigger, rate=rate, epochs=progress["recent"])


def _wait_for_rows(stack: Endpoints, table: str, rows: int, consumers: list[Service]) -> None:
    deadline = time.monotonic() + 300
    while sql(stack.dsn, f"SELECT count(*) FROM public.{table}")[0][0] < rows:
        for consumer in consumers:
            if consumer.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the consumer stopped short:\n{consumer.log.read_text()[-2000:]}"
                )
        time.sleep(0.5)


def measure(
    stack: Endpoints,
    table: str,
    written: int,
    *,
    trigger: str,
    rate: int,
    epochs: list[dict[str, Any]],
) -> dict[str, Any]:
    started_ms = sql(
        stack.dsn, f'SELECT (extract(epoch FROM min("timestamp")) * 1000)::bigint FROM {table}'
    )[0][0]
    interval_ms = round(trigger_seconds(trigger) * 1000)
    count, distinct, low, high = sql(
        stack.dsn, f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM {table}"
    )[0]
    if not (count == distinct == written == high - low + 1):
        raise RuntimeError(
            f"{table}: {count} rows, {distinct} distinct, values {low}..{high}, "
            f"{written} written by the producer: not each row exactly once"
        )
    # Row v is stamped within second v // rate of the source, and exists for Spark from the
    # end of that second on (the source started at row 0's timestamp).
    measured = sql(
        stack.dsn,
        f"""WITH t AS (SELECT min("timestamp") AS started FROM {table})
            SELECT extract(epoch FROM applied_at - "timestamp") * 1000,
                   extract(epoch FROM applied_at - (started + (value / {rate} + 1)
                                                    * interval '1 second')) * 1000
            FROM {table}, t
            WHERE "timestamp" >= started + interval '{WARM_UP_S} seconds'
            ORDER BY "timestamp" """,
    )
    latencies = [float(row[0]) for row in measured]
    from_available = sorted(float(row[1]) for row in measured)
    quarter = len(latencies) // 4
    second_quarter = sorted(latencies[quarter : 2 * quarter])
    last_quarter = sorted(latencies[3 * quarter :])
    drift_ms = _at(last_quarter, 0.5) - _at(second_quarter, 0.5)
    ordered = sorted(latencies)
    epoch_rows = [int(e["rows"]) for e in epochs if e.get("committed")]
    return {
        "trigger": trigger,
        "rows_per_second": rate,
        "rows": count,
        "measured_rows": len(ordered),
        "p50_ms": round(_at(ordered, 0.50), 1),
        "p99_ms": round(_at(ordered, 0.99), 1),
        "max_ms": round(ordered[-1], 1),
        "drift_ms": round(drift_ms, 1),
        "keeps_up": drift_ms < 500,
        "trigger_wait_ms": (interval_ms - started_ms % interval_ms) % interval_ms,
        "from_available": {
            "p50_ms": round(_at(from_available, 0.50), 1),
            "p99_ms": round(_at(from_available, 0.99), 1),
            "max_ms": round(from_available[-1], 1),
            "cdf_ms": [round(_at(from_available, q / 100), 1) for q in range(101)],
        },
        "rows_per_epoch_p50": sorted(epoch_rows)[len(epoch_rows) // 2] if epoch_rows else 0,
        "cdf_ms": [round(_at(ordered, q / 100), 1) for q in range(101)],
    }


def _at(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument(
        "--triggers", nargs="+", default=["1 second", "500 milliseconds", "250 milliseconds"]
    )
    args = parser.parse_args()
    for trigger in args.triggers:
        trigger_seconds(trigger)  # refuse a trigger this benchmark cannot read, before any run
    runs = []
    with scratch_dir("bridge-bench-latency-") as scratch, running_stack() as stack:
        for trigger in args.triggers:
            run = run_pipeline(
                stack, trigger, rate=args.rate, seconds=args.seconds, scratch=scratch
            )
            runs.append(run)
            available = run["from_available"]
            print(
                f"trigger {trigger!r}: from event time p50 {run['p50_ms']} ms, p99 "
                f"{run['p99_ms']} ms, max {run['max_ms']} ms; from availability to Spark p50 "
                f"{available['p50_ms']} ms, p99 {available['p99_ms']} ms, max "
                f"{available['max_ms']} ms; over {run['measured_rows']:,} rows "
                f"({'keeps up' if run['keeps_up'] else 'falls behind'}, "
                f"drift {run['drift_ms']} ms)",
                flush=True,
            )
    keeping_up = [r for r in runs if r["keeps_up"]]
    shortest = min(keeping_up, key=lambda r: trigger_seconds(r["trigger"]), default=None)
    if shortest is not None:
        print(f"shortest trigger that keeps up: {shortest['trigger']!r}, p99 {shortest['p99_ms']}")
    path = write_results(
        "latency",
        {
            "rows_per_second": args.rate,
            "seconds": args.seconds,
            "runs": runs,
            "shortest_trigger_keeping_up": shortest["trigger"] if shortest else None,
            "goal_p99_ms_at_1_second": 1500,
        },
    )
    print(f"figures: {path}; plot: {latency_cdf(RESULTS, PLOTS)}")


if __name__ == "__main__":
    main()
