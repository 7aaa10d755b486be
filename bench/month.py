"""A month compressed: the pipeline as users run it for months, its costs near its start and
at its end, in one run of 20,000 epochs.

    .venv/bin/python -m bench.month [--epochs 20000] [--warm-epochs 200]
        [--trigger '100 milliseconds'] [--rate 2000] [--members 2] [--window-s 30]
        [--pause-s 30] [--drains 3] [--results-dir DIR]

The real pipeline with the defaults (whole epochs, pooled transactional ids): `bridge produce
--source kafka` reading a topic that `bench.feed` fills at `--rate` rows a second, with a
`--trigger` processing-time trigger, into a topic of 4 partitions, and `--members` services of
one group (`python -m consumers`, default settings) into a table whose `applied_at` PostgreSQL
stamps as it inserts each row. Measured
twice, once the query has committed `--warm-epochs` epochs (the start) and once it has committed
`--epochs` (the end); members' resident memory is also traced every minute:

- end-to-end latency: p50 / p99 from each row's event time to its `applied_at`, over the rows
  stamped in a window of `--window-s` seconds;
- drain speed, as a user pays it: the members stopped for `--pause-s` seconds while the query
  goes on, then started again; the rows behind at their start over the time until the table
  holds every row the query had committed then (their start-up included, which dominates it:
  the median of `--drains` drains);
- resident memory: each member's process, and the driver's (`bridge produce` and its JVM),
  also traced every minute with the members';
- the state tables' size (the schema's tables and indexes) and their ledger rows;
- the brokers' live transactional ids (bench.capacity's count, from the transaction log) and
  the manifest topic's records (its log end less its log start).

Each end figure is given with its ratio to the start's. At the end the query is stopped, the
members drain, and every row is checked present exactly once. Writes bench/results/month-*.json.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg
from confluent_kafka import Consumer, TopicPartition

from bench.capacity import transactional_ids
from bench.common import (
    RESULTS,
    Endpoints,
    new_table,
    new_topic,
    running_stack,
    scratch_dir,
    write_results,
)
from bench.consumer import Service
from bench.latency import PARTITIONS
from bridge.names import DEFAULT_EPOCHS_TOPIC, DEFAULT_STATE_SCHEMA
from bridge_shell.spark.locations import PROGRESS_FILE
from spark_jobs.progress import SinkCounters


def sql(dsn: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement.encode(), params)
        return cursor.fetchall() if cursor.description else []


_WAIT_S = 600.0  # a member's drain, the query's first epochs: bounded, and said when missed


class Pipeline:
    """The query and its group, as a user runs them."""

    def __init__(self, stack: Endpoints, args: argparse.Namespace, scratch: Path) -> None:
        self.stack, self.args, self.scratch = stack, args, scratch
        self.topic = f"month-{uuid.uuid4().hex[:8]}"
        self.table = self.topic.replace("-", "_")
        self.group = f"bench-month-{uuid.uuid4().hex[:8]}"
        new_topic(stack, self.topic, partitions=PARTITIONS)
        # The kafka source's columns (its record's value: the feeder's number; its timestamp:
        # the feeder's CreateTime), and the time PostgreSQL inserts the row.
        columns = (
            "key text, value bigint, source_topic text, source_partition int, "
            'source_offset bigint, "timestamp" timestamptz, applied_at timestamptz'
        )
        new_table(stack, self.table, f"{columns} DEFAULT clock_timestamp()")
        # The watching reads ranges through these, so its cost stays flat as the table grows
        # (a count of the whole table every poll loaded the database it measured, more so at
        # the end). Both columns rise with time, so the indexes stay right-leaning and cheap.
        sql(stack.dsn, f"CREATE INDEX ON public.{self.table} (value)")
        sql(stack.dsn, f'CREATE INDEX ON public.{self.table} ("timestamp")')
        self.members = self._members()
        # [epochs committed, each member's RSS MB, the driver's JVM's RSS MB], every minute
        self.rss_trace: list[list[float]] = []
        # The query reads a topic fed at --rate, as a user's pipelines do: Spark's rate source
        # hands out rows a whole second at a time (one epoch a second at most, whatever the
        # trigger). One partition keeps the rows in the order of their numbers, so the rows
        # the query committed are the first `rows_written` of them.
        self.source_topic = f"{self.topic}-source"
        new_topic(stack, self.source_topic, partitions=1,
                  topic_config={"retention.ms": str(3_600_000)})  # fmt: skip
        self.feeder_log = scratch / "feeder.log"
        with self.feeder_log.open("w") as out:
            self.feeder = subprocess.Popen([
                sys.executable, "-m", "bench.feed", "--bootstrap-servers",
                stack.bootstrap_servers, "--topic", self.source_topic, "--rate", str(args.rate),
            ], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        self.checkpoint = scratch / "checkpoint"
        command = [
            str(Path(sys.executable).with_name("bridge")), "produce", "--source", "kafka",
            "--source-topic", self.source_topic, "--trigger", args.trigger,
            "--topic", self.topic, "--checkpoint", str(self.checkpoint),
            "--bootstrap-servers", stack.bootstrap_servers,
        ]  # fmt: skip
        self.producer_log = scratch / "producer.log"
        with self.producer_log.open("w") as out:
            self.producer = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def _members(self) -> list[Service]:
        return [
            Service(self.stack, self.topic, self.table, "insert", self.scratch,
                    batch_max_wait_ms=None, group=self.group)
            for _ in range(self.args.members)
        ]  # fmt: skip

    def progress(self) -> SinkCounters:
        return SinkCounters.load(self.checkpoint / PROGRESS_FILE)

    def rows(self, since: int, until: int) -> int:
        """The rows of values `since` to `until` (exclusive): the feeder numbers its rows
        0, 1, ... in the order the query's epochs commit them."""
        return int(sql(self.stack.dsn, f"SELECT count(*) FROM public.{self.table} "
                       "WHERE value >= %s AND value < %s", (since, until))[0][0])  # fmt: skip

    def members_rss_mb(self) -> list[float]:
        return [round(psutil.Process(m.process.pid).memory_info().rss / 2**20, 1)
                for m in self.members]  # fmt: skip

    def wait_for_epochs(self, epochs: int, timeout: float) -> None:
        deadline, said = time.monotonic() + timeout, time.monotonic()
        started, first = time.monotonic(), self.progress().epochs_committed
        while (done := self.progress().epochs_committed) < epochs:
            if self.producer.poll() is not None:
                raise RuntimeError(f"the query ended:\n{self.producer_log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{done} epochs of {epochs} in {timeout:.0f} s")
            if time.monotonic() - said > 60:
                rate = (done - first) / (time.monotonic() - started)
                print(f"{done:,} epochs committed, {rate:.2f} a second; members' RSS "
                      f"{self.members_rss_mb()} MB", flush=True)  # fmt: skip
                jvm = resident_mb(self)["driver_jvm_rss_mb"]
                self.rss_trace.append([done, *self.members_rss_mb(), jvm])
                said = time.monotonic()
            time.sleep(1)

    def wait_for_rows(self, rows: int, since: int = 0) -> float:
        """Seconds until the table holds the rows of values `since` to `rows` (exclusive), those
        below known present; raises past the bound, or if a member ends."""
        started = time.monotonic()
        while self.rows(since, rows) < rows - since:
            for member in self.members:
                if member.process.poll() is not None:
                    raise RuntimeError(f"a member ended:\n{member.log.read_text()[-3000:]}")
            if time.monotonic() - started > _WAIT_S:
                found = self.rows(since, rows)
                raise RuntimeError(f"{found} rows of {rows - since} after {_WAIT_S:.0f} s")
            time.sleep(0.05)
        return time.monotonic() - started

    def stop(self) -> int:
        """The feeder stopped, then the query (SIGTERM: it finishes its epoch), the members
        drained and stopped; the rows the query wrote."""
        self.feeder.send_signal(signal.SIGTERM)
        if self.feeder.wait(timeout=90) != 0:
            raise RuntimeError(f"the feeder failed:\n{self.feeder_log.read_text()[-3000:]}")
        self.producer.send_signal(signal.SIGTERM)
        code = self.producer.wait(timeout=180)
        if code != 0:
            raise RuntimeError(f"the query exited {code}:\n{self.producer_log.read_text()[-3000:]}")
        written = self.progress().rows_written
        try:
            self.wait_for_rows(written)
        finally:
            for member in self.members:
                member.stop()
        return written

    def close(self) -> None:
        if self.feeder.poll() is None:
            self.feeder.kill()
            self.feeder.wait()
        if self.producer.poll() is None:
            self.producer.kill()
            self.producer.wait()
        for member in self.members:
            member.stop()


def snapshot(pipeline: Pipeline, *, at_start: bool) -> dict[str, Any]:
    """The figures at one age. The drain restarts the members, so at the start it comes first
    (the members measured after it are those that run on to the end), and at the end last
    (the members measured are those that ran since the start)."""
    args, stack = pipeline.args, pipeline.stack
    epochs = pipeline.progress().epochs_committed
    drain = drain_speed(pipeline) if at_start else {}
    window_start = sql(stack.dsn, "SELECT now()")[0][0]
    time.sleep(args.window_s)  # the window measured: the rows stamped in it
    window_end = sql(stack.dsn, "SELECT now()")[0][0]
    latencies = latency_ms(pipeline, window_start, window_end)
    memory = resident_mb(pipeline)
    state = state_size(stack)
    drain = drain or drain_speed(pipeline)
    return {
        "epochs_committed": epochs,
        "p50_ms": _at(latencies, 0.5),
        "p99_ms": _at(latencies, 0.99),
        "latency_rows": len(latencies),
        **memory,
        **drain,
        **state,
        "live_transactional_ids": transactional_ids(stack.bootstrap_servers, ""),
        "manifest_records": manifest_records(stack),
    }


def latency_ms(pipeline: Pipeline, start: Any, end: Any) -> list[float]:
    """Event time to insertion of the rows stamped in [start, end), once all of them landed."""
    query = (f'SELECT extract(epoch FROM applied_at - "timestamp") * 1000 FROM public.'
             f'{pipeline.table} WHERE "timestamp" >= %s AND "timestamp" < %s')  # fmt: skip
    expected = pipeline.args.rate * pipeline.args.window_s
    deadline = time.monotonic() + 120
    while True:
        found = sorted(float(r[0]) for r in sql(pipeline.stack.dsn, query, (start, end)))
        if len(found) >= expected * 0.95 or time.monotonic() > deadline:
            return found
        time.sleep(1)


def resident_mb(pipeline: Pipeline) -> dict[str, float]:
    def mb(process: psutil.Process) -> float:
        return round(process.memory_info().rss / 2**20, 1)

    members = [mb(psutil.Process(m.process.pid)) for m in pipeline.members]
    driver = psutil.Process(pipeline.producer.pid)
    jvms = [c for c in driver.children(recursive=True) if c.name() == "java"]
    return {
        "member_rss_mb_max": max(members),
        "driver_python_rss_mb": mb(driver),
        "driver_jvm_rss_mb": sum(mb(j) for j in jvms),
    }


def drain_speed(pipeline: Pipeline) -> dict[str, Any]:
    """`--drains` times: the members stopped for `--pause-s`, then started again; the backlog's
    rows a second, start-up included (which dominates it: one sample says little), the median
    and each."""
    drains = [drain_once(pipeline) for _ in range(pipeline.args.drains)]
    speeds = sorted(d["drain_rows_per_second"] for d in drains)
    return {"drain_rows": drains[0]["drain_rows"],
            "drain_rows_per_second": speeds[len(speeds) // 2], "drains": drains}  # fmt: skip


def drain_once(pipeline: Pipeline) -> dict[str, float]:
    # Every row the query committed so far landed first (the members running): the count
    # below then reads only the rows of the pause, whatever the table's age.
    landed = pipeline.progress().rows_written
    pipeline.wait_for_rows(landed)
    for member in pipeline.members:
        member.stop()
    time.sleep(pipeline.args.pause_s)  # the backlog grows meanwhile: nothing to wait for
    target = pipeline.progress().rows_written
    behind_from = landed + pipeline.rows(landed, target)
    pipeline.members = pipeline._members()
    seconds = pipeline.wait_for_rows(target, since=landed)
    return {"drain_rows": target - behind_from, "drain_rows_per_second": round(
        (target - behind_from) / seconds)}  # fmt: skip


def state_size(stack: Endpoints) -> dict[str, int]:
    size = sql(stack.dsn, "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
               "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
               "AND c.relkind = 'r'", (DEFAULT_STATE_SCHEMA,))[0][0]  # fmt: skip
    epochs = sql(stack.dsn, f"SELECT count(*) FROM {DEFAULT_STATE_SCHEMA}.epochs")[0][0]
    return {"state_bytes": int(size), "ledger_epoch_rows": int(epochs)}


def manifest_records(stack: Endpoints) -> int:
    reader = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "bench-month"})
    try:
        low, high = reader.get_watermark_offsets(TopicPartition(DEFAULT_EPOCHS_TOPIC, 0), 30)
    finally:
        reader.close()
    return int(high - low)


def _at(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return float("nan")
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20_000)
    parser.add_argument("--warm-epochs", type=int, default=200)
    parser.add_argument("--trigger", default="100 milliseconds")
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--window-s", type=int, default=30)
    parser.add_argument("--pause-s", type=float, default=30)
    parser.add_argument("--drains", type=int, default=3)  # at each end: the median is given
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    with scratch_dir("bridge-bench-month-") as scratch, running_stack() as stack:
        pipeline = Pipeline(stack, args, scratch)
        try:
            started = time.monotonic()
            pipeline.wait_for_epochs(args.warm_epochs, timeout=_WAIT_S)
            start = snapshot(pipeline, at_start=True)
            print(f"start: {start}", flush=True)
            pipeline.wait_for_epochs(args.epochs, timeout=86_400)
            end = snapshot(pipeline, at_start=False)
            print(f"end: {end}", flush=True)
            hours = (time.monotonic() - started) / 3600
            written = pipeline.stop()
        finally:
            pipeline.close()
        count, distinct = sql(stack.dsn, f"SELECT count(*), count(DISTINCT value) FROM "
                              f"public.{pipeline.table}")[0]  # fmt: skip
        if not count == distinct == written:
            raise RuntimeError(f"{count} rows, {distinct} distinct, {written} written")
    ratios = {
        key: round(end[key] / start[key], 3) if start[key] else None
        for key in start
        if isinstance(start[key], int | float) and key != "epochs_committed"
    }
    figures = {
        "epochs": args.epochs, "trigger": args.trigger, "rows_per_second": args.rate,
        "members": args.members, "hours": round(hours, 2), "rows": written,
        "start": start, "end": end, "end_to_start": ratios,
        "members_rss_mb_by_epochs": pipeline.rss_trace,
        # Past 1.1x the start's, the worse way (drain speed: below 1 / 1.1x): for the docs to
        # name with the constant that bounds each (the manifest: its retention).
        "past_1_1x": sorted(k for k, v in ratios.items() if v is not None and (
            v < 1 / 1.1 if k == "drain_rows_per_second" else v > 1.1)),
        "epochs_per_second": round((end["epochs_committed"] - start["epochs_committed"]) / max(
            1.0, hours * 3600), 2),
    }  # fmt: skip
    for key, ratio in ratios.items():
        print(f"{key}: {start[key]} -> {end[key]} ({ratio}x)", flush=True)
    print(f"every row once: {written:,}; written to "
          f"{write_results('month', figures, directory=args.results_dir)}")  # fmt: skip


if __name__ == "__main__":
    main()
