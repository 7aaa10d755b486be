"""Producer benchmark: `bridge produce` against a Python sink that writes nothing, run as a user
runs them.

    .venv/bin/python -m bench.producer [--rows 1000000] [--files 20] [--files-per-epoch 2]
        [--rounds 3] [--rate 10000] [--trigger-seconds 45] [--triggers '1 second' ...]
        [--cluster-workers N] [--no-warm-up]

Each run is a whole process, start-up included: `bridge produce` (the command users run), or
the plain PySpark script `bench/baseline_job.py` (same source, same master) with Spark's
built-in Kafka sink (the baseline), or with a Python data source sink that does nothing (what
Spark's Python sink machinery costs before a sink does anything). All use the same Spark home
(bridge's compiled one, bridge_shell/spark/spark_home.py): a plain script from the shipped home is
slower, and the baseline is the faster of the two.

(a) available-now over the same JSON-lines files (--files-per-epoch per epoch), in alternated
    rounds: seconds and rows/s of each, the ratio per round, and the median. The primary ratio
    is bridge against the no-op Python sink: Spark charges every sink written as a Python data
    source the same before it writes a byte (Python workers, every row to them as Arrow, Python
    calls on the driver), so that sink is the ceiling for bridge. The built-in sink, which pays
    none of it, is the reference ratio. Each sink
    first runs once uncounted (reported as the warm-up): a first run pays what a cluster and
    a machine pay once, not per job (the broker creating its transaction log and loading its
    coordinator for the first transactional producer, cold page caches for jars and packages),
    and the rotation would hand it to one sink only;
(b) per epoch, from Spark's own progress events (each run's event log): the per-epoch overhead
    is always a paired difference, an epoch's time in bridge minus the same epoch's (same batch
    id, same input) in the other sink's run of the same round, with the quantiles taken of those
    differences (p50, p99; the first epoch, which pays the Python workers' start, apart):
    against the no-op Python sink (bridge's own cost) and against the built-in sink;
(c) where bridge's epochs go: Spark before the tasks (planning, the writer, scheduling, the Python
    workers), each step of a write task, the tasks' window, the driver's commit hook, Spark after;
(d) the rate source at --rate rows/s with each processing-time trigger, each sink for
    --trigger-seconds: epoch durations p50/p99, and the paired per-epoch differences as in (b)
    (epochs from the third on, paired by batch id; each holds about a trigger's worth of rows).
Figures go to bench/results/producer-*.json.

With --cluster-workers N, every run goes to a Spark standalone cluster of N workers started for
the benchmark (bridge_shell/stack/spark.py, as `bridge stack up --spark-workers N` starts it), each
worker with 2 cores: the same input, the same master for all; bridge ships its executors'
environment as a user's job would (bridge_shell/spark/executor_env.py). No trigger runs unless
asked.
Figures go to bench/results/producer-cluster-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

from bench.common import (
    Endpoints,
    new_topic,
    percentile,
    running_stack,
    scratch_dir,
    write_results,
)
from bridge_shell.maven import spark_kafka_jars
from bridge_shell.spark.spark_home import precompiled_spark_home
from bridge_shell.spark.spark_session import DEFAULT_MASTER
from bridge_shell.stack.process import free_port
from bridge_shell.stack.spark import DaemonPorts, SparkCluster
from spark_jobs.progress import STEPS

TOPIC_PARTITIONS = 2
BASELINE_SCRIPT = Path(__file__).with_name("baseline_job.py")
# Who runs: bridge, Spark's built-in Kafka sink (the baseline), and a Python data source sink that
# does nothing (Spark's own cost of a Python sink, which bridge pays before doing anything).
SINKS = ("bridge", "builtin", "python-noop")
PROGRESS_EVENT = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"
_RUN_TIMEOUT_S = 1800
_FIRST_EPOCH_TIMEOUT_S = 300


def write_input(directory: Path, *, rows: int, row_bytes: int, files: int) -> None:
    directory.mkdir(parents=True)
    per_file = rows // files
    for f in range(files):
        lines = []
        for i in range(f * per_file, (f + 1) * per_file):
            head = json.dumps({"id": i, "amount": i % 1000, "note": ""})
            note = "x" * max(0, row_bytes - len(head))
            lines.append(json.dumps({"id": i, "amount": i % 1000, "note": note}))
        (directory / f"part-{f:04d}.jsonl").write_text("\n".join(lines) + "\n")


@dataclass
class Run:
    """One whole process and what Spark and the sink recorded about it."""

    sink: str
    started_at: float  # wall clock
    ended_at: float
    rows: int
    epochs: list[dict[str, Any]]  # Spark's progress events, by batch id
    sink_epochs: list[dict[str, Any]] = field(default_factory=list)  # bridge's per-epoch record

    @property
    def seconds(self) -> float:
        return self.ended_at - self.started_at

    def phases(self) -> dict[str, float]:
        """The process's life in seconds: until its first epoch begins (the interpreter, the JVM,
        the session, the query's start), the first epoch, the others, and its exit."""
        first = _epoch_seconds(self.epochs[0]["timestamp"])
        last = self.epochs[-1]
        ended = _epoch_seconds(last["timestamp"]) + last["durationMs"]["triggerExecution"] / 1000
        first_ms = self.epochs[0]["durationMs"]["triggerExecution"]
        return {
            "start_up": round(first - self.started_at, 2),
            "first_epoch": round(first_ms / 1000, 2),
            "other_epochs": round(ended - first - first_ms / 1000, 2),
            "exit": round(self.ended_at - ended, 2),
        }

    def figures(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "seconds": round(self.seconds, 3),
            "phases_seconds": self.phases(),
            "rows": self.rows,
            "rows_per_second": round(self.rows / self.seconds),
            "epochs": len(self.epochs),
            "epoch_ms": [e["durationMs"]["triggerExecution"] for e in self.epochs],
        }


@dataclass(frozen=True)
class Bench:
    stack: Endpoints
    scratch: Path
    jars: str
    env: dict[str, str]
    master: str | None = None  # a cluster's; each command's own default otherwise

    def run(
        self,
        sink: str,
        source: list[str],
        *,
        trigger: str | None = None,
        stop_after: float | None = None,
    ) -> Run:
        """One whole process; a processing-time run is stopped (SIGTERM) `stop_after` seconds
        after its first epoch."""
        name = f"{sink}-{uuid.uuid4().hex[:8]}"
        new_topic(self.stack, name, partitions=TOPIC_PARTITIONS)
        events = self.scratch / "events" / name
        events.mkdir(parents=True)
        conf = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(events),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
        }
        checkpoint = self.scratch / "checkpoints" / name
        common = ["--topic", name, "--checkpoint", str(checkpoint)]
        common += ["--bootstrap-servers", self.stack.bootstrap_servers, *source]
        if trigger is not None:
            common += ["--trigger", trigger]
        if self.master is not None:
            common += ["--master", self.master]
        if sink == "bridge":
            command = [str(Path(sys.executable).with_name("bridge")), "produce", *common]
            command += [f"--spark-conf={k}={v}" for k, v in conf.items()]
        else:
            command = [sys.executable, str(BASELINE_SCRIPT), *common, "--jars", self.jars]
            command += [f"--conf={k}={v}" for k, v in conf.items()]
            command += ["--sink", "kafka" if sink == "builtin" else sink]
        log = self.scratch / f"{name}.log"
        started = time.time()
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env)
            try:
                if stop_after is not None:
                    _wait_for_first_epoch(events, process)
                    time.sleep(stop_after)
                    process.send_signal(signal.SIGTERM)
                code = process.wait(timeout=_RUN_TIMEOUT_S)
            finally:
                if process.poll() is None:
                    process.kill()
        ended = time.time()
        if code != 0:
            tail = log.read_text()[-3000:]
            raise RuntimeError(f"{sink} run exited {code}; the end of {log}:\n{tail}")
        epochs = progress_events(events)
        run = Run(sink, started, ended, sum(e["numInputRows"] for e in epochs), epochs)
        if sink == "bridge":
            progress = json.loads((checkpoint / "bridge-sink-progress.json").read_text())
            run.sink_epochs = [e for e in progress["recent"] if e.get("committed")]
            if trigger is None and progress["rows_written"] != run.rows:
                raise RuntimeError(
                    f"bridge wrote {progress['rows_written']} rows, Spark read {run.rows}"
                )
        return run


def _wait_for_first_epoch(events: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _FIRST_EPOCH_TIMEOUT_S
    while not progress_events(events):
        if process.poll() is not None:
            raise RuntimeError(f"exited {process.returncode} before its first epoch")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no epoch in {_FIRST_EPOCH_TIMEOUT_S} s")
        time.sleep(0.5)


def progress_events(events: Path) -> list[dict[str, Any]]:
    """Spark's progress of each epoch, from the event log in `events`, by batch id."""
    found: dict[int, dict[str, Any]] = {}
    for path in events.iterdir():
        if path.name.startswith("."):
            continue
        with path.open() as lines:
            for line in lines:
                if PROGRESS_EVENT in line:
                    try:
                        progress = json.loads(line)["progress"]
                    except ValueError:  # the line being written
                        continue
                    # The event log keeps the sources' counts only; the total as Spark's API has it.
                    progress["numInputRows"] = sum(s["numInputRows"] for s in progress["sources"])
                    found[progress["batchId"]] = progress
    return [found[b] for b in sorted(found)]


def quantiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(percentile(ordered, 0.50), 1),
        "p99": round(percentile(ordered, 0.99), 1),
        "max": round(max(ordered, default=float("nan")), 1),
    }


Round = dict[str, Run]  # one run of each sink, next to each other


def per_epoch_overhead(rounds: Sequence[Round], ours: str, theirs: str) -> dict[str, Any]:
    """`ours`'s time minus `theirs`'s, epoch by epoch (the same input) within each round."""
    first: list[float] = []
    steady: list[float] = []
    for done in rounds:
        other = {e["batchId"]: e["durationMs"]["triggerExecution"] for e in done[theirs].epochs}
        for epoch in done[ours].epochs:
            if epoch["batchId"] in other:
                gap = epoch["durationMs"]["triggerExecution"] - other[epoch["batchId"]]
                (first if epoch["batchId"] == 0 else steady).append(gap)
    return {"first_epoch_ms": quantiles(first), "steady_epoch_ms": quantiles(steady)}


def breakdown(runs: Sequence[Run]) -> dict[str, Any]:
    """Where bridge's steady epochs go, in ms: around the tasks (from Spark's progress and the
    sink's clock stamps; one machine, one clock) and each step of the write tasks."""
    around: dict[str, list[float]] = {
        "before_tasks": [],
        "tasks": [],
        "commit_hook": [],
        "after_commit_hook": [],
    }
    steps: dict[str, list[float]] = {step: [] for step in STEPS}
    for run in runs:
        spark = {e["batchId"]: e for e in run.epochs}
        for record in run.sink_epochs:
            progress = spark.get(int(record["epoch"]))
            if progress is None or progress["batchId"] == 0 or record["tasks_started_at"] is None:
                continue
            begun = _epoch_seconds(progress["timestamp"])
            ended = begun + progress["durationMs"]["triggerExecution"] / 1000
            around["before_tasks"].append(record["tasks_started_at"] - begun)
            around["tasks"].append(record["tasks_finished_at"] - record["tasks_started_at"])
            around["commit_hook"].append(record["recorded_at"] - record["tasks_finished_at"])
            around["after_commit_hook"].append(ended - record["recorded_at"])
            for step in STEPS:
                steps[step].extend(record["steps_ms"].get(step, ()))
    return {
        "epoch": {k: quantiles([s * 1000 for s in v]) for k, v in around.items()},
        "task_steps": {k: quantiles(v) for k, v in steps.items()},
    }


def _epoch_seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def trigger_runs(
    bench: Bench, trigger: str, *, rate: int, seconds: float, order: Sequence[str]
) -> dict[str, Any]:
    source = ["--source", "rate", "--rows-per-second", str(rate)]
    runs = {sink: bench.run(sink, source, trigger=trigger, stop_after=seconds) for sink in order}
    result: dict[str, Any] = {"trigger": trigger, "rows_per_second": rate}
    for sink, run in runs.items():
        # The first epochs pay start-up and catch up with the rate source's backlog.
        steady = [e for e in run.epochs if e["batchId"] >= 2]
        result[sink] = {
            "epochs": len(steady),
            "rows_per_epoch": round(median(e["numInputRows"] for e in steady)) if steady else 0,
            "epoch_ms": quantiles([e["durationMs"]["triggerExecution"] for e in steady]),
        }
    # Paired differences, as everywhere in this benchmark: never quantiles subtracted.
    for name, other in (("over_python_noop_ms", "python-noop"), ("over_builtin_ms", "builtin")):
        result[name] = quantiles(paired_differences(runs["bridge"], runs[other], first_batch=2))
    return result


def paired_differences(ours: Run, theirs: Run, *, first_batch: int) -> list[float]:
    """`ours`'s epoch time minus `theirs`'s for each batch id both ran, from `first_batch` on."""
    other = {e["batchId"]: e["durationMs"]["triggerExecution"] for e in theirs.epochs}
    return [
        e["durationMs"]["triggerExecution"] - other[e["batchId"]]
        for e in ours.epochs
        if e["batchId"] >= first_batch and e["batchId"] in other
    ]


@contextmanager
def spark_cluster(scratch: Path, workers: int) -> Iterator[str | None]:
    """A standalone master and `workers` workers for the runs (None: no cluster, local runs)."""
    if not workers:
        yield None
        return

    def ports() -> DaemonPorts:
        return DaemonPorts(rpc=free_port(), web_ui=free_port())

    cluster = SparkCluster(
        home=scratch / "spark", master=ports(), workers=[ports() for _ in range(workers)]
    )
    cluster.start()
    try:
        cluster.wait_ready(timeout=180)
        yield cluster.master_url
    finally:
        cluster.stop()


def _rotated(round_number: int) -> list[str]:
    """Who goes first turns round by round: the machine's drift then weighs on all alike."""
    shift = round_number % len(SINKS)
    return [*SINKS[shift:], *SINKS[:shift]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--row-bytes", type=int, default=100)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--trigger-seconds", type=float, default=45)
    parser.add_argument("--triggers", nargs="*", default=None)
    parser.add_argument("--cluster-workers", type=int, default=0)
    parser.add_argument(
        "--no-warm-up", dest="warm_up", action="store_false",
        help="count the first run of each sink too",
    )  # fmt: skip
    args = parser.parse_args()
    if args.triggers is None:
        args.triggers = [] if args.cluster_workers else ["1 second", "250 milliseconds"]

    # Every process's Python workers run this interpreter (the virtualenv's), as bridge's do.
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    home = precompiled_spark_home()
    if home is not None:
        env["SPARK_HOME"] = str(home)
    with (
        scratch_dir("bridge-bench-producer-") as scratch,
        running_stack() as stack,
        spark_cluster(scratch, args.cluster_workers) as master,
    ):
        data = scratch / "in"
        write_input(data, rows=args.rows, row_bytes=args.row_bytes, files=args.files)
        bench = Bench(stack, scratch, ",".join(spark_kafka_jars()), env, master)
        files = ["--input", str(data), "--max-files-per-trigger", str(args.files_per_epoch)]
        warm_up = {sink: bench.run(sink, files).figures() for sink in SINKS} if args.warm_up else {}
        if warm_up:
            print("warm-up (not counted): "
                  + ", ".join(f"{sink} {run['seconds']:.1f} s" for sink, run in warm_up.items()),
                  flush=True)  # fmt: skip
        rounds: list[Round] = []
        for round_number in range(args.rounds):
            done = {sink: bench.run(sink, files) for sink in _rotated(round_number)}
            rounds.append(done)
            print(
                f"round {round_number + 1}: "
                + ", ".join(f"{sink} {done[sink].seconds:.1f} s" for sink in SINKS)
                + f"; bridge / no-op {done['python-noop'].seconds / done['bridge'].seconds:.2f}",
                flush=True,
            )
        triggers = [
            trigger_runs(bench, t, rate=args.rate, seconds=args.trigger_seconds, order=_rotated(i))
            for i, t in enumerate(args.triggers)
        ]

    # The primary ratio: bridge against a Python data source sink that writes nothing, the
    # ceiling of any sink written as one, bridge included.
    ratios = [done["python-noop"].seconds / done["bridge"].seconds for done in rounds]
    to_builtin = [done["builtin"].seconds / done["bridge"].seconds for done in rounds]
    ceilings = [done["builtin"].seconds / done["python-noop"].seconds for done in rounds]
    overhead = per_epoch_overhead(rounds, "bridge", "builtin")
    own = per_epoch_overhead(rounds, "bridge", "python-noop")
    where = breakdown([done["bridge"] for done in rounds])
    report(
        args, rounds, ratios, to_builtin, ceilings, overhead, own, where, triggers,
        master or DEFAULT_MASTER,
    )  # fmt: skip
    path = write_results(
        "producer-cluster" if master else "producer",
        {
            "rows": args.rows,
            "row_bytes": args.row_bytes,
            "files": args.files,
            "files_per_epoch": args.files_per_epoch,
            "master": master or DEFAULT_MASTER,
            "cluster_workers": args.cluster_workers,
            "spark_home": "compiled" if home is not None else "installed",
            "rounds": [{sink: run.figures() for sink, run in done.items()} for done in rounds],
            "warm_up": warm_up,
            "ratio_to_python_noop": round(median(ratios), 3),
            "rounds_ratio_to_python_noop": [round(r, 3) for r in ratios],
            "goal_ratio_to_python_noop": 0.9,
            "ratio_to_builtin": round(median(to_builtin), 3),
            "rounds_ratio_to_builtin": [round(r, 3) for r in to_builtin],
            "python_noop_ratio_to_builtin": round(median(ceilings), 3),
            "per_epoch_over_python_noop": own,
            "per_epoch_over_builtin": overhead,
            "per_epoch_definition": "paired: bridge's epoch minus the same batch id's in the "
            "other sink's run of the same round; quantiles of those differences",
            "breakdown": where,
            "triggers": triggers,
        },
    )
    print(f"figures: {path}")


def report(
    args: argparse.Namespace,
    rounds: Sequence[Round],
    ratios: Sequence[float],
    to_builtin: Sequence[float],
    ceilings: Sequence[float],
    overhead: dict[str, Any],
    own: dict[str, Any],
    where: dict[str, Any],
    triggers: Sequence[dict[str, Any]],
    master: str,
) -> None:
    epochs = rounds[0]["bridge"].figures()["epochs"]
    print(f"\n{args.rows:,} rows of ~{args.row_bytes} bytes, {epochs} epochs, {master}")
    print("whole processes, available-now (seconds, start-up included; phases):")
    for done in rounds:
        for sink in SINKS:
            print(f"  {sink:<12} {done[sink].seconds:5.1f}  {done[sink].phases()}")
    print(
        f"ratio bridge / no-op Python sink (rows/s), median of rounds: {median(ratios):.2f} "
        f"(goal 0.9; rounds {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(
        f"reference: bridge / built-in {median(to_builtin):.2f}; no-op Python sink / "
        f"built-in {median(ceilings):.2f} (Spark's own price for a Python sink)"
    )
    for label, figures in (("the no-op Python sink", own), ("built-in", overhead)):
        first, steady = figures["first_epoch_ms"], figures["steady_epoch_ms"]
        print(
            f"per-epoch time of bridge minus {label}'s (same epoch): p50 {steady['p50']} ms, "
            f"p99 {steady['p99']} ms; first epoch p50 {first['p50']} ms"
        )
    print("where bridge's steady epochs go (ms, p50 / p99):")
    for name, q in {**where["epoch"], **where["task_steps"]}.items():
        print(f"  {name:<18} {q['p50']:>8} / {q['p99']}")
    for t in triggers:
        print(
            f"trigger {t['trigger']!r} at {t['rows_per_second']:,} rows/s, epoch p50/p99 (ms): "
            + ", ".join(
                f"{sink} {t[sink]['epoch_ms']['p50']}/{t[sink]['epoch_ms']['p99']}"
                for sink in SINKS
            )
            + f"; paired, bridge minus no-op p50 {t['over_python_noop_ms']['p50']} / p99 "
            f"{t['over_python_noop_ms']['p99']}, minus built-in p50 "
            f"{t['over_builtin_ms']['p50']} / p99 {t['over_builtin_ms']['p99']}"
        )


if __name__ == "__main__":
    main()
