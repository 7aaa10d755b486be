"""Start a server as a detached process, find it again from its pid file, and stop it."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

# Servers started by this very process, kept so that they can be reaped once stopped (and so that
# Python does not warn about a child still running when its Popen object is collected).
_children: dict[int, subprocess.Popen[bytes]] = {}


# Ports are picked below the kernel's ephemeral range (32768-60999 by default): a port picked now
# and bound seconds later (a broker's JVM starting) is then never taken meanwhile as the source
# port of an outgoing connection. ENV_PORT_RANGE narrows it ("20000-23999": the tests give each
# worker a range of its own); a port handed out lately is not handed out again.
ENV_PORT_RANGE = "BRIDGE_PORT_RANGE"
_PORT_RANGE = (20000, 32000)
_handed_out: deque[int] = deque(maxlen=512)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, below the ephemeral range (the kernel's pick when
    none of the range is)."""
    low, high = _port_range()
    for _ in range(500):
        port = random.randrange(low, high)  # noqa: S311 - a port, not a secret
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue  # taken, or still in TIME_WAIT
        _handed_out.append(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
        return picked


def _port_range() -> tuple[int, int]:
    text = os.environ.get(ENV_PORT_RANGE, "")
    low, _, high = text.partition("-")
    if low.isdigit() and high.isdigit() and 1024 <= int(low) < int(high) <= 65536:
        return int(low), int(high) + 1
    return _PORT_RANGE


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def spawn_detached(
    argv: Sequence[str],
    *,
    log_path: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> int:
    """Start `argv` in its own session so it outlives the command that started it.

    Output goes to `log_path`; standard input is closed. Returns the pid.
    """
    with log_path.open("ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - argv is built by us, never from user text
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _children[proc.pid] = proc
    return proc.pid


def cmdline(pid: int) -> str | None:
    """The command line of a live process, or None when it is gone (zombies count as gone)."""
    try:
        found = psutil.Process(pid)
        if found.status() == psutil.STATUS_ZOMBIE:
            return None
        return " ".join(found.cmdline())
    except psutil.Error:  # gone, or not ours to read
        return None


def processes(*, command_has: str, cwd_under: Path | None = None) -> list[int]:
    """The live processes whose command line holds `command_has` (and, with `cwd_under`,
    whose working directory is inside it), this one excepted."""
    found = []
    for candidate in psutil.process_iter(["pid", "cmdline", "status"]):
        info = candidate.info
        line = " ".join(info["cmdline"] or ())
        if info["pid"] == os.getpid() or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if command_has not in line:
            continue
        if cwd_under is not None:
            try:
                if not Path(candidate.cwd()).is_relative_to(cwd_under):
                    continue
            except psutil.Error:
                continue
        found.append(int(info["pid"]))
    return found


def alive(pid: int | None, marker: str) -> bool:
    """Whether `pid` runs and is ours: its command line must contain `marker` (our data dir),
    so that a pid recycled by an unrelated process is never mistaken for our server."""
    if pid is None:
        return False
    line = cmdline(pid)
    return line is not None and marker in line


def gone(pid: int | None) -> bool:
    """Whether `pid` has exited (or never was). Not the same as `not alive(...)`: while a
    process execs, its command line is briefly empty, and a start-up check that takes that for
    an exit fails a server that is starting fine, on a loaded machine most of all."""
    return pid is None or cmdline(pid) is None


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def wait_until(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def terminate(pid: int, marker: str, *, grace: float, sig: signal.Signals = signal.SIGTERM) -> None:
    """Send `sig`, then SIGKILL after `grace` seconds; returns once the process is gone."""
    if not alive(pid, marker):
        return
    _signal(pid, sig)
    if not wait_until(lambda: not alive(pid, marker), timeout=grace):
        _signal(pid, signal.SIGKILL)
        wait_until(lambda: not alive(pid, marker), timeout=10)
    _reap(pid)


def terminate_together(
    targets: Sequence[tuple[int, str]], *, grace: float, sig: signal.Signals = signal.SIGTERM
) -> None:
    """`terminate` for several processes at once: all get `sig` first, then each gets what is
    left of one shared `grace`. For the nodes of one cluster, which shut down faster together
    than one by one (the last of a quorum stopped alone cannot finish its controlled
    shutdown without the others)."""
    live = [(pid, marker) for pid, marker in targets if alive(pid, marker)]
    for pid, _ in live:
        _signal(pid, sig)
    deadline = time.monotonic() + grace
    for pid, marker in live:
        remaining = max(0.0, deadline - time.monotonic())
        if not wait_until(lambda: not alive(pid, marker), timeout=remaining):  # noqa: B023
            _signal(pid, signal.SIGKILL)
            wait_until(lambda: not alive(pid, marker), timeout=10)  # noqa: B023
        _reap(pid)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    # A server we started in this very process would linger as a zombie until reaped.
    # Its command line can vanish a moment before it exits, so wait for the exit itself.
    child = _children.pop(pid, None)
    if child is not None:
        child.wait(timeout=30)
