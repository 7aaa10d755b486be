"""What the benchmarks share: a real stack to run against, and where the figures go."""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bridge.names import DEFAULT_STACK_DIR
from bridge.stack import LocalStack

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Endpoints:
    bootstrap_servers: str
    dsn: str
    # The first broker's JVM and PostgreSQL's postmaster, for CPU accounting (bench/cpu.py).
    kafka_pid: int | None = None
    postgres_pid: int | None = None


@contextmanager
def running_stack() -> Iterator[Endpoints]:
    """The repository's local stack if it is up, else a throwaway one for this run."""
    status = LocalStack(Path(DEFAULT_STACK_DIR)).status()
    if status.running and status.bootstrap_servers and status.dsn:
        yield Endpoints(status.bootstrap_servers, status.dsn, status.kafka_pid, status.postgres_pid)
        return
    scratch = Path(tempfile.mkdtemp(prefix="bridge-bench-"))
    scratch.chmod(0o755)  # the postgres user must reach its data directory
    stack = LocalStack(scratch)
    started = stack.up()
    try:
        assert started.bootstrap_servers and started.dsn
        yield Endpoints(
            started.bootstrap_servers, started.dsn, started.kafka_pid, started.postgres_pid
        )
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
        "machine": {"cpus": _cpus(), "python": platform.python_version()},
        **figures,
    }
    text = json.dumps(document, indent=2) + "\n"
    path = directory / f"{name}-{stamp}.json"
    path.write_text(text)
    (directory / f"{name}-latest.json").write_text(text)
    return path


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))
