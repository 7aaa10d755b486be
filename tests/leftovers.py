"""A test that leaves a process, a listening port or a temporary directory behind fails, naming it.

What a test owns is what appeared between the start of its set-up and the end of its tear-down,
less what a longer-lived fixture (the session's stack, its Spark driver, a module's cluster) made
while it was being set up: those are torn down by their own fixture, later, and everything they
start in turn (Spark's Python workers, an executor) belongs to them.

A process is this worker's when it descends from it, or when its command line names one of the
worker's directories (PostgreSQL's `pg_ctl` detaches the server from its parent; its data
directory still says whose it is). Temporary directories are those the test process itself made
with `tempfile` (its own directory, see conftest.py); the children's temporary files have a
directory of their own that the session removes.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

# A process a test stopped may still be on its way out (a JVM's shutdown, a SIGTERM handler):
# it gets this long to go before it counts as left behind.
_GRACE_SECONDS = 10.0


@dataclass
class _Snapshot:
    processes: set[int] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)
    entries: set[str] = field(default_factory=set)


class Leftovers:
    """The before-and-after bookkeeping of one pytest process."""

    def __init__(self, *, markers: Iterable[Path], temp_dir: Path) -> None:
        self._markers = tuple(str(m) for m in markers)
        self._temp_dir = temp_dir
        self._me = os.getpid()
        self._kept = _Snapshot()  # made by longer-lived fixtures
        # Their command lines: a test may kill and restart the session's broker, database or
        # registry (a fault test does), and the server it restarts is still the fixture's.
        self._kept_commands: set[str] = set()
        self._before = _Snapshot()

    def _processes(self) -> dict[int, psutil.Process]:
        found: dict[int, psutil.Process] = {}
        with _quiet():
            for child in psutil.Process(self._me).children(recursive=True):
                found[child.pid] = child
        for candidate in psutil.process_iter(["pid", "cmdline"]):
            line = " ".join(candidate.info["cmdline"] or ())
            if candidate.info["pid"] != self._me and any(m in line for m in self._markers):
                found[candidate.info["pid"]] = candidate
        return {pid: p for pid, p in found.items() if _live(p)}

    def _ports(self) -> set[int]:
        with _quiet():
            return {
                c.laddr.port
                for c in psutil.Process(self._me).net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN
            }
        return set()

    def _entries(self) -> set[str]:
        try:
            return {entry.name for entry in self._temp_dir.iterdir()}
        except OSError:
            return set()

    def snapshot(self) -> _Snapshot:
        return _Snapshot(set(self._processes()), self._ports(), self._entries())

    def keep_since(self, before: _Snapshot) -> None:
        """What appeared since `before` belongs to a longer-lived fixture."""
        now = self.snapshot()
        for pid, proc in self._processes().items():
            if pid not in before.processes:
                self._kept_commands.add(_describe(proc))
        self._kept.processes |= now.processes - before.processes
        self._kept.ports |= now.ports - before.ports
        self._kept.entries |= now.entries - before.entries

    def start(self) -> None:
        self._before = self.snapshot()

    def _owned_by_fixtures(self, proc: psutil.Process) -> bool:
        if _describe(proc) in self._kept_commands:
            return True
        with _quiet():
            return any(p.pid in self._kept.processes for p in [proc, *proc.parents()])
        return False

    def left(self) -> list[str]:
        """What the test left behind, after a bounded wait for processes on their way out."""
        deadline = time.monotonic() + _GRACE_SECONDS
        while True:
            procs = {
                pid: p
                for pid, p in self._processes().items()
                if pid not in self._before.processes and not self._owned_by_fixtures(p)
            }
            if not procs or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        found = [f"process {pid} ({_describe(p)[:300]})" for pid, p in sorted(procs.items())]
        ports = self._ports() - self._before.ports - self._kept.ports
        found += [f"listening port {port} in the test process" for port in sorted(ports)]
        entries = self._entries() - self._before.entries - self._kept.entries
        found += [f"temporary {self._temp_dir / name}" for name in sorted(entries)]
        return found


class _quiet:
    """psutil's errors for a process that went while we looked: nothing to report."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, psutil.Error)


def _live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "gone"


_KEY = pytest.StashKey[Leftovers]()


def install(config: pytest.Config, *, markers: Iterable[Path]) -> None:
    config.stash[_KEY] = Leftovers(markers=markers, temp_dir=Path(tempfile.gettempdir()))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    leftovers = request.config.stash.get(_KEY, None)
    if leftovers is None or fixturedef.scope == "function":
        return (yield)
    before = leftovers.snapshot()
    try:
        return (yield)
    finally:
        leftovers.keep_since(before)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    leftovers = item.config.stash.get(_KEY, None)
    if leftovers is not None:
        leftovers.start()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    yield  # a tear-down that failed raises here, and is the report
    leftovers = item.config.stash.get(_KEY, None)
    if leftovers is None:
        return
    left = leftovers.left()
    if left:
        pytest.fail(f"{item.nodeid} left behind: " + "; ".join(left), pytrace=False)
