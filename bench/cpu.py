"""Where a benchmark run's CPU went: each process of the pipeline, and the machine as a whole.

On a machine of two cores the service, PostgreSQL and the broker share the same CPUs, so a
ratio alone does not say whether the service is slow or the machine is full. Each run takes a
`CpuMeter` reading before and after; the difference is the CPU seconds of every part in the run.

Read from /proc (Linux): a process's utime and stime cover all its threads; a parent's cutime
and cstime cover the children it has reaped. PostgreSQL's postmaster reaps its backends, so
PostgreSQL's CPU is the postmaster's own and reaped time plus that of its live backends: a
backend that ends during the run moves its whole time from the live sum into the reaped one,
and the difference still counts only what it spent in the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone
        return None
    return text[text.rindex(")") + 2 :].split()


def process_seconds(pid: int, *, reaped: bool = False) -> float:
    """CPU seconds of a process, all its threads; with `reaped`, its reaped children's too."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # utime, stime, cutime and cstime are the 14th to 17th fields of the line: 11 to 14 here,
    # where the fields start after the name, at the state (the 3rd).
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICKS


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads, grouped: its main thread (`main`), librdkafka's
    threads (named `rdk:...`), and the rest (`other`); threads that ended are not counted."""
    groups = {"main": 0.0, "librdkafka": 0.0, "other": 0.0}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:  # gone
        return groups
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
            text = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICKS
        group = (
            "main"
            if task.name == str(pid)
            else "librdkafka"
            if name.startswith("rdk:")
            else "other"
        )
        groups[group] += seconds
    return groups


def tree_seconds(root: int) -> float:
    """CPU seconds of `root`, the children it reaped, and its live children."""
    total = process_seconds(root, reaped=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and int(fields[1]) == root:
            total += process_seconds(int(entry.name))
    return total


def machine_seconds() -> tuple[float, float, float]:
    """(busy, waiting for I/O, all) CPU seconds of the whole machine since boot, summed over
    its CPUs. Time waiting for I/O is idle time: a CPU waits while a disk works."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()
    ticks = [int(v) for v in first[1:]]
    idle, iowait = ticks[3], ticks[4]
    # guest time is counted in user time already; leave it out of the sum.
    everything = sum(ticks[:8])
    return (everything - idle - iowait) / _TICKS, iowait / _TICKS, everything / _TICKS


@dataclass(frozen=True)
class Reading:
    parts: dict[str, float]
    busy: float
    iowait: float
    total: float


class CpuMeter:
    """CPU of named processes (`trees`: PostgreSQL's postmaster and its backends; `processes`:
    one process with its threads) and of the machine, between two readings."""

    def __init__(self, *, trees: dict[str, int | None], processes: dict[str, int | None]) -> None:
        self._trees = {name: pid for name, pid in trees.items() if pid is not None}
        self._processes = {name: pid for name, pid in processes.items() if pid is not None}

    def read(self, **more: int) -> Reading:
        """A reading; `more` adds processes for this reading (one that came and went)."""
        parts = {name: tree_seconds(pid) for name, pid in self._trees.items()}
        parts |= {name: process_seconds(pid) for name, pid in self._processes.items()}
        parts |= {name: process_seconds(pid) for name, pid in more.items()}
        return Reading(parts, *machine_seconds())

    @staticmethod
    def spent(before: Reading, after: Reading, wall_seconds: float) -> dict[str, float]:
        """CPU seconds of each part between the readings, and the machine's busy share and
        share waiting for I/O."""
        figures = {
            f"{name}_cpu_s": round(after.parts[name] - before.parts.get(name, 0.0), 2)
            for name in after.parts
        }
        # Readings within one clock tick (a run too short to measure) have no machine time.
        all_seconds = after.total - before.total or float("inf")
        figures["machine_busy"] = round((after.busy - before.busy) / all_seconds, 3)
        figures["machine_iowait"] = round((after.iowait - before.iowait) / all_seconds, 3)
        figures["wall_s"] = round(wall_seconds, 2)
        return figures
