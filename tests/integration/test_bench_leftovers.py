"""What a benchmark leaves: its scratch directory (inputs, logs, a throwaway stack's gigabytes of
data) goes away when the run ends, by success or by its supervisor's SIGTERM, and a failed run
keeps it and says where; on the user's own stack, the topics and tables it made are dropped."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from bench import common
from bench.common import new_table, new_topic, scratch_dir
from tests.harness import Endpoints

_HOLD = (
    "import time\n"
    "from bench.common import scratch_dir\n"
    "with scratch_dir('bridge-test-scratch-') as scratch:\n"
    "    (scratch / 'data').write_bytes(b'x' * 4096)\n"
    "    print(scratch, flush=True)\n"
    "    time.sleep(60)\n"
)


def test_a_finished_run_leaves_nothing() -> None:
    with scratch_dir("bridge-test-scratch-") as scratch:
        (scratch / "kafka").mkdir()
        (scratch / "kafka" / "segment.log").write_bytes(b"x" * 4096)
    assert not scratch.exists()


def test_a_failed_run_keeps_its_directory_and_says_where(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(RuntimeError), scratch_dir("bridge-test-scratch-") as scratch:
        (scratch / "consumer.log").write_text("why it failed\n")
        raise RuntimeError("the run failed")
    try:
        assert (scratch / "consumer.log").read_text() == "why it failed\n"
        assert str(scratch) in capsys.readouterr().err
    finally:
        shutil.rmtree(scratch)


def test_a_run_stopped_by_sigterm_exits_and_leaves_nothing() -> None:
    repo = Path(__file__).resolve().parents[2]
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD], cwd=repo, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            scratch = Path(child.stdout.readline().strip())
            assert (scratch / "data").exists()
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=30) == 128 + signal.SIGTERM
            assert not scratch.exists()
        finally:
            child.kill()


def test_the_topics_and_tables_a_run_made_are_dropped(
    stack: Endpoints, names: dict[str, str]
) -> None:
    shared = common.Endpoints(stack.bootstrap_servers, stack.dsn)
    new_topic(shared, names["topic"], partitions=2)
    new_table(shared, names["table"], "id bigint")
    admin = AdminClient(stack.client())
    assert names["topic"] in admin.list_topics(timeout=30).topics

    common._drop_made(shared)
    with psycopg.connect(stack.dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f"public.{names['table']}",)).fetchone()
    assert found == (None,)
    deadline = time.monotonic() + 60  # deletion completes in the background
    while names["topic"] in admin.list_topics(timeout=30).topics:
        assert time.monotonic() < deadline, "the topic was not deleted"
        time.sleep(0.5)
