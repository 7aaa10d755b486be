"""The suite's own check that a test leaves nothing behind (tests/leftovers.py), run on a small
suite of its own in a separate pytest: each kind of leftover fails the test that left it, by
name, and what a session fixture starts is the fixture's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

# In `make check`'s quick loop too.
pytestmark = pytest.mark.quick

_ROOT = Path(__file__).resolve().parents[2]

_CONFTEST = """
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import leftovers

HERE = Path(__file__).parent


def pytest_configure(config):
    leftovers.install(config, markers=[HERE / "marked"])
    config.pluginmanager.register(leftovers, "bridge-leftovers")


@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(["sleep", "3600"])
    (HERE / "pids").open("a").write(f"{proc.pid}\\n")
    yield proc
    proc.kill()
    proc.wait()
"""

_TESTS = """
import socket
import subprocess
import tempfile

from conftest import HERE

kept = []


def test_a_process():
    proc = subprocess.Popen(["sleep", "3600"])
    (HERE / "pids").open("a").write(f"{proc.pid}\\n")
    kept.append(proc)


def test_a_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    kept.append(sock)


def test_a_temporary_directory():
    kept.append(tempfile.mkdtemp(prefix="left-here-"))


def test_what_a_session_fixture_starts_is_the_fixtures(server):
    assert server.poll() is None


def test_what_a_test_stops_is_not_left():
    proc = subprocess.Popen(["sleep", "3600"])
    proc.terminate()
    proc.wait()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.close()
"""


def test_each_leftover_fails_the_test_that_left_it_by_name(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_leaving.py").write_text(_TESTS)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(_ROOT), "TMPDIR": str(tmp_path / "tmp")}
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-o",
             "addopts=", "-o", "filterwarnings=", str(tmp_path)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        _kill_listed(tmp_path / "pids")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "ERROR at teardown of test_a_process" in out, out
    assert "test_a_process left behind: process" in out and "sleep 3600" in out, out
    assert "test_a_port left behind: listening port" in out, out
    assert "test_a_temporary_directory left behind: temporary" in out, out
    assert "left-here-" in out, out
    assert "5 passed, 3 errors" in out, out
    assert "test_what_a_session_fixture_starts_is_the_fixtures left" not in out, out
    assert "test_what_a_test_stops_is_not_left left" not in out, out


def _kill_listed(pids: Path) -> None:
    for line in pids.read_text().split() if pids.exists() else []:
        try:
            os.kill(int(line), signal.SIGKILL)
            psutil.Process(int(line)).wait(10)
        except (ProcessLookupError, psutil.Error):
            pass  # the fixture stopped it already


def test_a_kafka_client_left_open_is_found_and_one_only_in_a_dropped_cycle_is_not() -> None:
    """The check each integration test ends with (tests/conftest.py): it looks through the heap
    before it collects, so both answers are checked here."""
    from confluent_kafka import Producer

    from tests.conftest import _open_clients

    quiet = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}
    left = Producer(quiet)
    cycle: list[object] = [Producer(quiet)]
    cycle.append(cycle)
    dropped = id(cycle[0])
    del cycle
    try:
        found = _open_clients()
        assert any(client is left for client in found), found
        assert not any(id(client) == dropped for client in found), found
        kept = _open_clients(but=lambda client: client is left)
        assert not any(client is left for client in kept), kept
    finally:
        left.close()
    assert not any(client is left for client in _open_clients())
