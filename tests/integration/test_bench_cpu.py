"""The benchmarks' CPU accounting reads what processes really spent: a child that burns CPU and
is reaped counts in its parent's tree, a live one counts while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.cpu import CpuMeter, process_seconds, tree_seconds

_BURN = (
    "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"
)


def test_a_reaped_child_counts_in_its_parents_tree() -> None:
    before = tree_seconds(os.getpid())
    subprocess.run([sys.executable, "-c", _BURN.format(seconds=0.5)], check=True)
    spent = tree_seconds(os.getpid()) - before
    assert 0.45 <= spent < 5, spent


def test_a_live_child_counts_until_it_is_reaped_and_after() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _BURN.format(seconds=0.4) + "time.sleep(30)\n"],
    )
    try:
        meter = CpuMeter(trees={"mine": os.getpid()}, processes={})
        before = meter.read(child=child.pid)
        deadline = time.monotonic() + 20
        while process_seconds(child.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        live = CpuMeter.spent(before, meter.read(child=child.pid), 1.0)
        assert live["child_cpu_s"] >= 0.35, live
        assert live["mine_cpu_s"] >= 0.35, live  # the live child is in its parent's tree
        assert 0.0 <= live["machine_busy"] <= 1.0, live
    finally:
        child.kill()
        child.wait()
    reaped = CpuMeter.spent(before, meter.read(), 1.0)
    assert reaped["mine_cpu_s"] >= 0.35, reaped  # its time moved to the reaped sum, not lost
