"""The benchmarks' figures as pictures: `python -m bench.plot` reads `bench/results/*.json` and
writes PNGs under `docs/plots/` for the README.

- `consumer-ratio.png`: the consumer's throughput as a share of PostgreSQL's own COPY, insert and
  upsert, run after run (each ratio measured against its baseline in the same run; from the runs
  that have it, insert against COPY of pre-formatted text).
- `producer-ratio.png`: the sink's throughput against the no-op Python sink (from the runs that
  have it) and against Spark's built-in Kafka sink, run after run.
- `soak.png` and `soak-cluster.png`: the latest soak of each topology: records per second into
  Kafka and into PostgreSQL over the run, the fault windows shaded by class, with the account.
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
# From here the consumer's primary baseline is COPY of pre-formatted text, and the service is
# timed from the moment it holds its partitions.
TEXT_COPY_CONSUMER = datetime(2026, 11, 25, 23, 0)


def runs(name: str, results: Path) -> list[dict[str, Any]]:
    """Every run of a benchmark that names the commit it ran on, oldest first (the `-latest`
    copy left out): a figure in the docs comes from such a run, or is not drawn."""
    found = []
    for path in sorted(results.glob(f"{name}-2*.json")):
        document = json.loads(path.read_text())
        if not document.get("commit"):
            continue
        document["_when"] = datetime.strptime(document["at"], "%Y%m%dT%H%M%SZ")
        found.append(document)
    return found


def consumer_ratios(results: Path, out: Path) -> Path | None:
    found = [r for r in runs("consumer", results) if "insert" in r]
    if not found:
        return None
    figure, axes = plt.subplots(figsize=(8, 4))
    series = (
        ("insert", "ratio_to_text_copy", "insert / COPY of pre-formatted text"),
        ("insert", "ratio_to_copy", "insert / COPY of tuples"),
        ("upsert", "ratio_to_copy", "upsert / COPY of tuples"),
        ("upsert", "ratio_to_raw_upsert", "upsert / hand-written upsert"),
    )
    for mode, key, label in series:  # fmt: skip
        points = [(r["_when"], r[mode][key]) for r in found if key in r.get(mode, {})]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    _mark_since(axes, TEXT_COPY_CONSUMER, "from here: COPY of pre-formatted\ntext, "
                "clock from assignment", 0.3)  # fmt: skip
    axes.set_ylim(0, 1.1)
    axes.set_ylabel("rows/s as a share of COPY")
    axes.set_title("Consumer against PostgreSQL's COPY of the same rows, per run")
    axes.legend(fontsize=8, loc="lower left")
    figure.autofmt_xdate()
    return _save(figure, out / "consumer-ratio.png")


def producer_ratios(results: Path, out: Path) -> Path | None:
    """The latest producer run: each round's whole-process seconds of the three sinks."""
    found = [r for r in runs("producer", results) if "ratio_to_python_noop" in r]
    if not found:
        return None
    latest = found[-1]
    figure, axes = plt.subplots(figsize=(8, 4))
    sinks = (("bridge", "bridge"), ("python-noop", "no-op Python sink"),
             ("builtin", "built-in Kafka sink"))  # fmt: skip
    width = 0.27
    for n, (sink, label) in enumerate(sinks):
        seconds = [done[sink]["seconds"] for done in latest["rounds"]]
        places = [i + (n - 1) * width for i in range(len(seconds))]
        bars = axes.bar(places, seconds, width, label=label)
        axes.bar_label(bars, fmt="%.1f", fontsize=7)
    axes.set_xticks(range(len(latest["rounds"])),
                    [f"round {i + 1}" for i in range(len(latest["rounds"]))])  # fmt: skip
    axes.set_ylabel("whole process, seconds")
    axes.set_title(
        f"Producer at {latest['commit'][:7]}: {latest['rows']:,} rows, whole processes\n"
        f"bridge / no-op Python sink {latest['ratio_to_python_noop']}x (goal 0.9x), "
        f"/ built-in {latest['ratio_to_builtin']}x"
    )
    axes.legend(fontsize=8, loc="lower right")
    return _save(figure, out / "producer-ratio.png")


FAULT_COLOURS = ("tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                 "tab:cyan", "tab:grey")  # fmt: skip


def soak(results: Path, out: Path, name: str = "soak") -> Path | None:
    """The latest soak (of `name`) with a timeline: records per second into Kafka and into
    PostgreSQL, each fault's window shaded in its class's colour; the account in the title."""
    found = [r for r in runs(name, results) if "timeline" in r]
    if not found:
        return None
    latest = found[-1]
    figure, axes = plt.subplots(figsize=(12, 4.5))
    classes = sorted(latest["faults_by_class"])
    colour = dict(zip(classes, FAULT_COLOURS, strict=False))
    for fault in latest["fault_log"]:
        axes.axvspan(fault["at_s"], fault["at_s"] + fault["lasted_s"], alpha=0.18, linewidth=0,
                     color=colour.get(fault["class"], "grey"))  # fmt: skip
    for side, label in (("kafka", "Kafka"), ("postgres", "PostgreSQL")):
        points = _smoothed(latest["timeline"][side], SMOOTHING_S)
        axes.plot([p[0] for p in points], [p[1] for p in points], linewidth=0.8,
                  label=f"records/s into {label}")  # fmt: skip
    for cls in classes:  # the legend's entries for the shading
        axes.fill_between([], [], color=colour[cls], alpha=0.3,
                          label=f"{cls} ({latest['faults_by_class'][cls]})")  # fmt: skip
    axes.set_xlabel("seconds since the first fault")
    axes.set_ylabel(f"records per second (mean over {SMOOTHING_S} s)")
    axes.set_title(
        f"{'Cluster soak' if name == 'soak-cluster' else 'Soak'} at {latest['commit'][:7]}: "
        f"{latest['minutes']:g} min, {latest['faults']} faults, {latest['produced']:,} ids, "
        f"{latest['lost']} lost, {latest['doubled']} doubled; longest stall beyond a fault "
        f"{latest['longest_stall_s']} s"
    )
    axes.legend(fontsize=7, loc="upper left", ncol=3)
    axes.grid(alpha=0.3)
    return _save(figure, out / f"{name}.png")


SMOOTHING_S = 10  # the consumers commit in batches: per-second rates are all spikes and gaps


def _smoothed(points: list[list[float]], seconds: int) -> list[tuple[float, float]]:
    """[time, rate] samples averaged over windows of `seconds`, each at its window's middle; a
    window without a sample (nothing could be observed: a broker down, a link cut) is a gap in
    the line, not a straight line drawn across it."""
    windows: dict[int, list[float]] = {}
    for at, rate in points:
        windows.setdefault(int(at // seconds), []).append(rate)
    smoothed: list[tuple[float, float]] = []
    for window, rates in sorted(windows.items()):
        if smoothed and window * seconds - smoothed[-1][0] > 1.5 * seconds:
            smoothed.append((window * seconds, float("nan")))
        smoothed.append((window * seconds + seconds / 2, sum(rates) / len(rates)))
    return smoothed


def soak_cluster(results: Path, out: Path) -> Path | None:
    return soak(results, out, "soak-cluster")


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
    for draw in (consumer_ratios, producer_ratios, soak, soak_cluster, latency_cdf):
        written = draw(args.results, args.out)
        print(f"{draw.__name__}: {written or 'no results yet'}")


if __name__ == "__main__":
    main()
