"""At most a few `heavy` tests at once across the xdist workers.

A heavy test starts a cluster of JVMs (Kafka's, Spark's), several Spark drivers one after the
other, or the whole pipeline (the soak, the demos). Two of them together already keep both cores
of a CI machine busy; three at once (the order of the suite puts the slow tests first, so each
worker starts on one) made every JVM start-up take minutes, and the faults' waits ran out
before a job reached its fault point. So a heavy test first takes one of `BRIDGE_TEST_HEAVY_SLOTS`
slots (2 by default); the other workers meanwhile run the lighter tests they hold.

A slot is an exclusive `flock` on a file in the directory the workers share: the kernel frees it
when its holder exits, however it exits, so a killed worker never keeps one. The wait for a slot
comes before pytest-timeout's clock starts, and has a bound of its own: past it the test runs
without a slot, with a warning naming the holders (the slots spread load, they guard nothing).
"""

from __future__ import annotations

import fcntl
import os
import time
import warnings
from collections.abc import Generator
from pathlib import Path
from typing import IO

import pytest

ENV_SLOTS = "BRIDGE_TEST_HEAVY_SLOTS"
ENV_DIR = "BRIDGE_TEST_HEAVY_DIR"
_DEFAULT_SLOTS = 2
# Longer than the heavy tests ahead of one, run two at a time, ever take (about 20 minutes).
_WAIT_BOUND_S = 3600.0
_POLL_S = 0.5


def slot_count() -> int:
    raw = os.environ.get(ENV_SLOTS, str(_DEFAULT_SLOTS))
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"{ENV_SLOTS}={raw!r}: a whole number of slots, 1 or more")
    return int(raw)


class HeavySlots:
    """The plugin: a slot around the whole run protocol (set-up, call, tear-down) of each test
    marked `heavy`, when the session runs on more than one xdist worker; and before it the one
    lock named by a test's `exclusive(name)` marker: tests that bind the same fixed ports (the
    compose file's) never run at once, in one session or in two side by side."""

    def __init__(self, directory: Path, slots: int) -> None:
        self._directory = directory
        self._paths = [directory / f"heavy-slot-{n}" for n in range(slots)]

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        held: list[IO[str] | None] = []
        exclusive = item.get_closest_marker("exclusive")
        if exclusive is not None:  # first: a heavy slot is never held while waiting for it
            held.append(
                self._take(item.nodeid, [self._directory / f"exclusive-{exclusive.args[0]}"])
            )
        if item.get_closest_marker("heavy") is not None:
            held.append(self._take(item.nodeid, self._paths))
        try:
            yield
        finally:
            for lock in reversed(held):
                if lock is not None:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                    lock.close()

    def _take(self, nodeid: str, paths: list[Path]) -> IO[str] | None:
        deadline = time.monotonic() + _WAIT_BOUND_S
        while True:
            for path in paths:
                handle = path.open("a+")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '')} {nodeid}\n")
                handle.flush()
                return handle
            if time.monotonic() > deadline:
                holders = "; ".join(_holder(path) for path in paths)
                warnings.warn(
                    f"{nodeid}: no heavy-test slot came free in {_WAIT_BOUND_S:.0f} s (held by: "
                    f"{holders}); it runs without one",
                    pytest.PytestWarning,
                    stacklevel=1,
                )
                return None
            time.sleep(_POLL_S)


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "(unnamed)"
    except OSError:
        return "(unreadable)"


def install(config: pytest.Config) -> None:
    """Register the plugin on an xdist worker; the workers share their base directory's parent
    (the controller's), which is where the slots live, unless `BRIDGE_TEST_HEAVY_DIR` names
    another: two sessions side by side (`make test`'s passes) share their slots there."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or config.option.basetemp is None:
        return
    shared = Path(os.environ.get(ENV_DIR) or Path(config.option.basetemp).parent)
    shared.mkdir(parents=True, exist_ok=True)
    config.pluginmanager.register(HeavySlots(shared, slot_count()), "bridge-heavy-slots")
