"""The soak's own processes: each a process group it can kill, pause and restart, and a
supervisor that restarts what exits, as systemd or Kubernetes would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil


def children_of(pid: int) -> list[int]:
    """Every descendant of `pid` (PostgreSQL's backends, a JVM's helpers); none once it is gone."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """`sig` to `pid` and every descendant; the parent first, so that a SIGKILLed parent cannot
    start new children meanwhile."""
    for target in [pid, *children_of(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)


@dataclass
class Supervised:
    """One long-running process of the pipeline, in a session (process group) of its own."""

    name: str
    argv: Sequence[str]
    log: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)  # exit codes of the exits we did not cause
    held: bool = False  # down on purpose (a fault, or the end): not to be restarted

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                list(self.argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group: the driver's JVM and Python workers die with it."""
        if self.process is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def pause(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self, timeout: float) -> int | None:
        """SIGTERM to the leader only (it stops its own children), SIGKILL to the group after
        `timeout`; the exit code, None when it had to be killed."""
        self.held = True
        if self.process is None or not self.alive():
            return None if self.process is None else self.process.returncode
        self.resume()
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


class Supervisor:
    """Restarts any supervised process that exited on its own, once a second, and notes the
    exit: a process that cannot go on must exit non-zero, and its supervisor brings it back."""

    def __init__(self, processes: Sequence[Supervised], note: Callable[[str], None]) -> None:
        self.processes = list(processes)
        self._note = note
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)

    def start(self) -> None:
        for process in self.processes:
            process.start()
        self._thread.start()

    def holding(self, process: Supervised) -> _Hold:
        """`with supervisor.holding(p):` p stays down for the block, then starts again."""
        return _Hold(self, process)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                for process in self.processes:
                    if process.held or process.process is None or process.alive():
                        continue
                    code = process.process.returncode
                    process.exits.append(code)
                    self._note(f"{process.name} exited with {code}; restarting it")
                    process.start()


class _Hold:
    def __init__(self, supervisor: Supervisor, process: Supervised) -> None:
        self._supervisor, self._process = supervisor, process

    def __enter__(self) -> Supervised:
        with self._supervisor._lock:
            self._process.held = True
        return self._process

    def __exit__(self, *exc: object) -> None:
        with self._supervisor._lock:
            self._process.held = False
            if not self._process.alive():
                self._process.start()


def wait_for(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
