"""Three minutes of the soak (`bench/soak.py`): the whole pipeline of real processes under random
faults of every class, then the exact account. The long runs are the benchmark's; this one keeps
the harness itself working and catches what only a mix of faults shows."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.soak import Options, Soak, report

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


# Above the soak's own bounds, which come after its 3 minutes of faults (a replay run 300 s and
# its stop 120 s, open transactions 120 s, the consumers' drain 300 s): each of those names
# what was slow when it runs out; pytest's 600 s cut in first and said only "Timeout".
@pytest.mark.timeout(1500)
def test_three_minutes_of_random_faults_lose_and_double_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("BRIDGE_TEST_SEED", time.time()))
    options = Options(
        minutes=3,
        seed=seed,
        rows_per_second=300,
        trigger="2 seconds",
        gap_s=(0.5, 2.0),
        max_stall_s=60.0,
        results_dir=tmp_path,
        keep=False,
    )
    before = {name: os.environ.get(name) for name in ("TMPDIR", "JAVA_TOOL_OPTIONS")}
    figures = Soak(options).run()
    # The soak's processes kept their temporary files in its work directory, gone now: the
    # session's own processes after it must not be sent there.
    assert {name: os.environ.get(name) for name in before} == before
    table = report(figures)
    print(table)
    # About 15 faults in 3 minutes; a schedule of long ones makes fewer.
    assert figures["faults"] >= 6, table
    assert len(figures["faults_by_class"]) >= 3, table
    assert (figures["lost"], figures["doubled"]) == (0, 0), table
    assert figures["ok"], f"{table}\nnotes: {figures['notes']}"
