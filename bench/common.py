"""What the benchmarks share: a real stack to run against, and where the figures go."""

from __future__ import annotations

import json
import platform
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient

from bridge.kafka_admin import create_topic
from bridge.names import DEFAULT_STACK_DIR
from bridge_shell.stack import LocalStack

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Endpoints:
    bootstrap_servers: str
    dsn: str
    # The first broker's JVM and PostgreSQL's postmaster, for CPU accounting (bench/cpu.py).
    kafka_pid: int | None = None
    postgres_pid: int | None = None
    registry_url: str | None = None  # the schema registry's Confluent-compatible API


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A directory in the system's temporary directory for one run: its inputs, logs and any
    throwaway stack. Removed when the run ends; a throwaway stack's Kafka logs and PostgreSQL data
    come to gigabytes a run, and left behind they fill the disk within a day of benchmarking.
    A run that fails keeps it for its logs and says where. SIGTERM ends the run through here too
    (as SystemExit), so a benchmark stopped by its supervisor stops its stack and cleans up."""
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    scratch.chmod(0o755)  # the postgres user must reach its data directory
    try:
        yield scratch
    except Exception:
        print(f"kept {scratch} for the failed run's logs; remove it when done", file=sys.stderr)
        raise
    except BaseException:  # stopped (SIGTERM, Ctrl-C): nothing failed that its logs would explain
        _remove(scratch)
        raise
    else:
        _remove(scratch)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _remove(scratch: Path) -> None:
    try:
        shutil.rmtree(scratch)
    except OSError as error:
        print(f"could not remove {scratch}: {error}", file=sys.stderr)


# What this run made, so that a run on the user's own stack drops it at its end: each run's
# topics hold up to a million records, and its tables as many rows.
_made_topics: list[str] = []
_made_tables: list[str] = []


def new_topic(
    stack: Endpoints, name: str, *, partitions: int, topic_config: dict[str, str] | None = None
) -> None:
    create_topic(stack.bootstrap_servers, name, partitions=partitions, topic_config=topic_config)
    _made_topics.append(name)


def new_table(stack: Endpoints, name: str, definition: str) -> None:
    """`public.<name> (<definition>)`."""
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{name} ({definition})".encode())
    _made_tables.append(name)


def _drop_made(stack: Endpoints) -> None:
    if _made_tables:
        with psycopg.connect(stack.dsn, autocommit=True) as conn:
            for table in _made_tables:
                conn.execute(f"DROP TABLE IF EXISTS public.{table}".encode())
    if _made_topics:
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        for topic, deleted in admin.delete_topics(list(_made_topics), operation_timeout=30).items():
            try:
                deleted.result(timeout=60)
            except Exception as error:  # noqa: BLE001 - a leftover is reported, not fatal
                print(f"could not delete topic {topic}: {error}", file=sys.stderr)
    _made_tables.clear()
    _made_topics.clear()


@contextmanager
def running_stack() -> Iterator[Endpoints]:
    """The repository's local stack if it is up, else a throwaway one for this run. On the
    repository's stack, the topics and tables the run made are dropped at its end."""
    status = LocalStack(Path(DEFAULT_STACK_DIR)).status()
    if status.running and status.bootstrap_servers and status.dsn:
        shared = Endpoints(
            status.bootstrap_servers, status.dsn, status.kafka_pid, status.postgres_pid,
            status.registry_url,
        )  # fmt: skip
        try:
            yield shared
        finally:
            _drop_made(shared)
        return
    with scratch_dir("bridge-bench-stack-") as scratch:
        stack = LocalStack(scratch)
        started = stack.up()
        try:
            assert started.bootstrap_servers and started.dsn
            yield Endpoints(
                started.bootstrap_servers, started.dsn, started.kafka_pid, started.postgres_pid,
                started.registry_url,
            )  # fmt: skip
        finally:
            stack.down()


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[max(0, min(98, round(fraction * 100) - 1))]


def write_results(name: str, figures: dict[str, Any], *, directory: Path = RESULTS) -> Path:
    """`bench/results/<name>-<UTC time>.json`, plus `<name>-latest.json` for the docs to plot."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    document = {
        "benchmark": name,
        "at": stamp,
        "commit": RUN_COMMIT,
        "machine": {"cpus": _cpus(), "python": platform.python_version()},
        **figures,
    }
    text = json.dumps(document, indent=2) + "\n"
    path = directory / f"{name}-{stamp}.json"
    path.write_text(text)
    (directory / f"{name}-latest.json").write_text(text)
    return path


def _commit() -> str:
    """The commit the run measures, marked `-dirty` when the checkout had changes then."""
    import subprocess

    root = Path(__file__).parents[1]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (head or "unknown") + ("-dirty" if changed else "")


# Read once, as the run starts (every benchmark imports this module first): the code a run
# measures is what was checked out when it began, not at its end, 40 minutes later for a soak.
RUN_COMMIT = _commit()


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))
