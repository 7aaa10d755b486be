"""Every code block of the README, run as a user would run it, so that none can go stale.

The blocks are read from README.md itself. Each test names the literal values it replaces (the
broker's address, the DSN, the topic, ...) with this stack's and this test's own, and fails when
one is no longer in the block: a README edit that a test does not follow breaks the test. The
install block is run by tests/integration/test_wheel.py, on the wheel it builds.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from bridge.kafka_admin import create_topic
from bridge_shell.stack import LocalStack
from bridge_shell.stack.process import free_port, wait_until
from tests import passes
from tests.harness import Endpoints

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
ROWS = 120  # the orders the walk-through writes, in two files


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of each fenced block, in the README's order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(README.read_text())]


def block_with(language: str, needle: str) -> str:
    found = [text for lang, text in readme_blocks() if lang == language and needle in text]
    assert len(found) == 1, f"one {language} block of the README holds {needle!r}: {len(found)}"
    return found[0]


def substituted(text: str, values: dict[str, str]) -> str:
    for literal, value in values.items():
        assert literal in text, f"the README's block no longer holds {literal!r}:\n{text}"
        text = text.replace(literal, value)
    return text


def commands(block: str) -> list[str]:
    """The block's command lines, comments dropped."""
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def user_env() -> dict[str, str]:
    """A shell with the project's virtualenv active and none of this session's BRIDGE_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parents[1])
    return env


def test_every_block_of_the_readme_is_one_that_these_tests_run() -> None:
    """A block added to the README without a test to run it fails here."""
    shapes = [(lang, text.splitlines()[0]) for lang, text in readme_blocks()]
    assert shapes == [
        ("bash", "make demo        # the whole pipeline once on a local stack: Spark -> Kafka -> "
                 "PostgreSQL, verified"),
        ("python", "from pyspark.sql import SparkSession"),
        ("yaml", "kafka:"),
        ("bash", "bridge consume --config bridge.yaml"),
        ("bash", "bridge offsets show --config bridge.yaml                        # stored "
                 "offsets, lag, owners"),
        ("bash", "python -m build --wheel --outdir dist .   # dist/bridge-<version>-cp3X-cp3X-"
                 "<platform>.whl (C inside)"),
    ], shapes  # fmt: skip


@pytest.mark.heavy
def test_the_two_commands_the_readme_opens_with() -> None:
    """`make demo` runs for real, on a stack of its own that it starts and stops. `make test` is
    what is running now, so it is only expanded (`make -n`): it must still run the tests on the
    plain and on the secured stack."""
    block = block_with("bash", "make demo")
    assert commands(block) == ["make demo", "make test"]
    stack = Path(tempfile.mkdtemp(prefix="bridge-test-readme-"))
    stack.chmod(0o755)  # PostgreSQL runs as its own user when the tests run as root
    env = {**user_env(), "BRIDGE_STACK_DIR": str(stack)}
    try:
        demo = subprocess.run(["make", "demo"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=900, check=False)  # fmt: skip
    finally:
        LocalStack(stack).down()  # the demo stops its stack; this is for a demo that failed
        shutil.rmtree(stack, ignore_errors=True)
    output = " ".join(demo.stdout.split())
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "exactly once: 50,000 orders sent, 50,000 rows" in output, output[-2000:]
    assert "0 missing, 0 duplicated, 0 dead letters" in output, output[-2000:]

    planned = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, env=user_env(), capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout  # fmt: skip
    found = [shlex.split(line) for line in planned.splitlines()
             if line.startswith(".venv/bin/python -m tests.passes ")]  # fmt: skip
    assert len(found) == 1, planned
    *_, pytest, paths = found[0]
    assert found[0][3:5] == ["--pytest", pytest] and paths == "tests", planned
    runs = passes.commands(shlex.split(pytest), [paths])
    assert [run[0] for run in runs] == [".venv/bin/pytest"] * 2, runs
    assert [run[-1] for run in runs] == ["tests", "tests/integration"], runs
    assert "--secure" in runs[1] and "--secure" not in runs[0], runs


@pytest.mark.heavy
def test_the_readme_walk_through_from_a_pyspark_job_to_a_table_and_its_tools(
    stack: Endpoints, tmp_path: Path
) -> None:
    """The PySpark job as written, the consumer's configuration as written, `bridge consume`,
    then every operator command, on this session's stack."""
    suffix = uuid.uuid4().hex[:8]
    topic, table, group = f"readme-{suffix}", f"public.readme_{suffix}", f"readme-{suffix}"
    prefix, schema, port = f"readme-job-{suffix}", f"readme_{suffix}", free_port()
    create_topic(stack.bootstrap_servers, topic, partitions=3)
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, customer text, "
            "amount double precision)".encode()
        )
    orders = tmp_path / "orders"
    orders.mkdir()
    for part in range(2):
        lines = [
            f'{{"id": {i}, "customer": "c-{i % 7}", "amount": {i}.5}}'
            for i in range(part * ROWS // 2, (part + 1) * ROWS // 2)
        ]
        (orders / f"part-{part}.json").write_text("\n".join(lines) + "\n")
    env = user_env()

    job = substituted(block_with("python", "bridge-kafka"), {
        '"127.0.0.1:9092"': f'"{stack.bootstrap_servers}"',
        '.option("topic", "orders")': f'.option("topic", "{topic}")',
        '"orders-job"': f'"{prefix}"',
        '"data/orders"': f'"{orders}"',
        '"/tmp/checkpoints/orders"': f'"{tmp_path / "checkpoint"}"',
    })  # fmt: skip
    (tmp_path / "job.py").write_text(job)
    ran = subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]

    config = substituted(block_with("yaml", "routes:"), {
        '"127.0.0.1:9092"': f'"{stack.bootstrap_servers}"',
        '"postgresql://bridge@127.0.0.1:5432/bridge"': f'"{stack.dsn}"',
        '"orders-to-pg"': f'"{group}"',
        'state_schema: "bridge"': f'state_schema: "{schema}"',
        "9464": str(port),
        'topic: "orders"': f'topic: "{topic}"',
        '"public.orders"': f'"{table}"',
    })  # fmt: skip
    (tmp_path / "bridge.yaml").write_text(config)

    (consume,) = commands(block_with("bash", "bridge consume"))
    log = tmp_path / "consume.log"
    with log.open("wb") as out:
        service = subprocess.Popen(["bash", "-c", consume], cwd=tmp_path, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:

        def landed() -> bool:
            assert service.poll() is None, log.read_text()[-3000:]
            with psycopg.connect(stack.dsn, autocommit=True) as conn:
                row = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}".encode())
                return row.fetchone() == (ROWS, ROWS)

        assert wait_until(landed, timeout=120, interval=0.5), "the orders did not all land"

        operate = commands(block_with("bash", "bridge offsets show"))
        outputs = {}
        for line in operate:
            command = substituted(line, {"orders-job": prefix} if "orders-job" in line else {})
            if "--topic orders" in command:
                command = substituted(command, {"--topic orders": f"--topic {topic}"})
            done = subprocess.run(
                ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                timeout=120, check=False,
            )  # fmt: skip
            said = f"{command}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            assert done.returncode == 0, said
            words = command.split()
            outputs[f"{words[1]} {words[2]}"] = " ".join(done.stdout.split())
        assert len(outputs) == 4, outputs
        assert topic in outputs["offsets show"], outputs["offsets show"]
        assert "dry run" in outputs["offsets reset"].lower(), outputs["offsets reset"]
        assert prefix in outputs["txn show"], outputs["txn show"]
        assert group in outputs["status --config"], outputs["status --config"]
    finally:
        os.killpg(service.pid, signal.SIGTERM)
        code = service.wait(60)
    assert code == 0, log.read_text()[-3000:]
