"""The benchmarks' figures as pictures: `python -m bench.plot` reads `bench/results/*.json` and
writes PNGs under `docs/plots/` for the README.

- `consumer-ratio.png`: the consumer's throughput as a share of PostgreSQL's own COPY, insert and
  upsert, run after run (each ratio measured against its baseline in the same run).
- `producer-ratio.png`: the sink's throughput against Spark's built-in Kafka sink, run after run.
- `soak.png`: the latest soak: faults injected per class, next to rows lost and doubled.
- `latency-cdf.png`: the latest end-to-end latency run: the CDF of each trigger's latencies.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.dates as mdates
import matplotlib.pyplot as plt

from bench.common import RESULTS

PLOTS = Path(__file__).resolve().parents[1] / "docs" / "plots"
# Runs before this decoded the JSON inside the timed COPY loop, a weaker baseline.
STRONGER_COPY_BASELINE = datetime(2026, 11, 23, 15, 35)
# Runs before this timed both sinks inside one warm Spark session; from here, whole processes.
WHOLE_PROCESS_PRODUCER = datetime(2026, 11, 23, 17, 0)
# From here the baselines write the topic's own rows in the order a consumer receives them, each
# timed run starts after a CHECKPOINT, and a warm-up round goes uncounted.
SAME_ROWS_CONSUMER = datetime(2026, 11, 25, 4, 0)
# From here each sink runs once uncounted before the rounds.
WARMED_UP_PRODUCER = datetime(2026, 11, 25, 3, 50)


def runs(name: str, results: Path) -> list[dict[str, Any]]:
    """Every run of a benchmark, oldest first (the `-latest` copy left out)."""
    found = []
    for path in sorted(results.glob(f"{name}-2*.json")):
        document = json.loads(path.read_text())
        document["_when"] = datetime.strptime(document["at"], "%Y%m%dT%H%M%SZ")
        found.append(document)
    return found


def consumer_ratios(results: Path, out: Path) -> Path | None:
    found = [r for r in runs("consumer", results) if "insert" in r]
    if not found:
        return None
    figure, axes = plt.subplots(figsize=(8, 4))
    series = (
        ("insert", "ratio_to_copy", "insert / COPY"),
        ("upsert", "ratio_to_copy", "upsert / COPY"),
        ("upsert", "ratio_to_raw_upsert", "upsert / hand-written upsert"),
    )
    for mode, key, label in series:  # fmt: skip
        points = [(r["_when"], r[mode][key]) for r in found if key in r.get(mode, {})]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    _mark_since(axes, STRONGER_COPY_BASELINE, "baseline from here: COPY of\nready-made tuples "
                "(stronger)", 1.02)  # fmt: skip
    _mark_since(axes, SAME_ROWS_CONSUMER, "from here: the topic's own rows,\nCHECKPOINT before "
                "each run", 0.3)  # fmt: skip
    axes.set_ylim(0, 1.1)
    axes.set_ylabel("rows/s as a share of COPY")
    axes.set_title("Consumer against PostgreSQL's COPY of the same rows, per run")
    axes.legend()
    figure.autofmt_xdate()
    return _save(figure, out / "consumer-ratio.png")


def producer_ratios(results: Path, out: Path) -> Path | None:
    found = [r for r in runs("producer", results) if "ratio" in r]
    if not found:
        return None
    figure, axes = plt.subplots(figsize=(8, 4))
    axes.plot([r["_when"] for r in found], [r["ratio"] for r in found], marker="o")
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    axes.set_ylim(0, max(1.2, max(r["ratio"] for r in found) * 1.1))
    _mark_since(axes, WHOLE_PROCESS_PRODUCER, "from here: whole processes,\nstart-up "
                "included (stronger)", 1.15)  # fmt: skip
    _mark_since(axes, WARMED_UP_PRODUCER, "from here: a warm-up\nrun per sink", 0.3)
    axes.set_ylabel("rows/s against the built-in sink")
    axes.set_title("bridge-kafka against Spark's Kafka sink, per run")
    figure.autofmt_xdate()
    return _save(figure, out / "producer-ratio.png")


def soak(results: Path, out: Path) -> Path | None:
    found = runs("soak", results)
    if not found:
        return None
    latest = max(found, key=lambda r: (r["minutes"], r["_when"]))
    by_class = latest["faults_by_class"]
    figure, (faults, totals) = plt.subplots(
        1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [4, 1]}
    )
    faults.barh(list(by_class), list(by_class.values()))
    faults.set_xlabel("faults injected")
    faults.set_title(
        f"Soak: {latest['minutes']:g} min, {latest['faults']} faults, {latest['produced']:,} "
        f"rows; longest stall beyond a fault {latest['longest_stall_s']} s"
    )
    values = [latest["lost"], latest["doubled"]]
    bars = totals.bar(["lost", "doubled"], values, color=["tab:red", "tab:orange"])
    totals.bar_label(bars, labels=[str(v) for v in values])
    totals.set_ylim(0, max(1, *values) * 1.2)
    totals.set_title("rows")
    return _save(figure, out / "soak.png")


def latency_cdf(results: Path, out: Path) -> Path | None:
    found = runs("latency", results)
    if not found:
        return None
    latest = found[-1]
    figure, axes = plt.subplots(figsize=(8, 4))
    for run in latest["runs"]:
        label = f"trigger {run['trigger']}: p50 {run['p50_ms']:.0f} ms, p99 {run['p99_ms']:.0f} ms"
        seconds = [ms / 1000 for ms in run["cdf_ms"]]
        line = axes.plot(seconds, range(len(seconds)), label=label)
        available = run.get("from_available", {}).get("cdf_ms")
        if available:  # the same rows from when Spark could first see them (dashed)
            axes.plot([ms / 1000 for ms in available], range(len(available)), linestyle="--",
                      color=line[0].get_color())  # fmt: skip
    axes.axvline(1.5, color="grey", linestyle="--", linewidth=1)
    axes.set_xlabel("event time (solid) or availability to Spark (dashed) to insertion (s)")
    axes.set_ylabel("rows (%)")
    axes.set_title(
        f"End-to-end latency at {latest['rows_per_second']:,} rows/s "
        f"({latest['seconds']:g} s per trigger)"
    )
    axes.legend(fontsize=8, loc="lower right")
    axes.grid(alpha=0.3)
    return _save(figure, out / "latency-cdf.png")


def _mark_since(axes: Any, when: datetime, text: str, height: float) -> None:
    """A dotted line where the benchmark's method changed, and what changed."""
    since = mdates.date2num(when)  # type: ignore[no-untyped-call]
    axes.axvline(since, color="black", linestyle=":", linewidth=1)
    axes.annotate(" " + text.replace("\n", "\n "), (since, height), fontsize=8, va="top")


def _save(figure: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=PLOTS)
    args = parser.parse_args(argv)
    for draw in (consumer_ratios, producer_ratios, soak, latency_cdf):
        written = draw(args.results, args.out)
        print(f"{draw.__name__}: {written or 'no results yet'}")


if __name__ == "__main__":
    main()
