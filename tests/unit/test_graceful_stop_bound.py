"""The graceful stop's bound is one number: the code's, the one docs/sink.md quotes, and below
the grace period of every manifest and compose file that runs the producer, so that the
supervisor's SIGKILL never cuts the epoch the stop lets finish."""

from __future__ import annotations

from pathlib import Path

import yaml

from spark_jobs.graceful_stop import DEFAULT_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]
# Spark's own shutdown after the query stops: the session, the executors, the metrics server.
SHUTDOWN_S = 10


def _seconds(text: str) -> float:
    return float(text.removesuffix("s"))


def test_the_kubernetes_producer_waits_longer_than_the_stop() -> None:
    documents = yaml.safe_load_all((ROOT / "deploy/kubernetes/producer.yaml").read_text())
    deployment = next(d for d in documents if d and d["kind"] == "Deployment")
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= DEFAULT_TIMEOUT_S + SHUTDOWN_S


def test_the_compose_producer_waits_longer_than_the_stop() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    grace = _seconds(compose["services"]["producer"]["stop_grace_period"])
    assert grace >= DEFAULT_TIMEOUT_S + SHUTDOWN_S


def test_the_docs_quote_the_bound_the_code_has() -> None:
    sink = (ROOT / "docs/sink.md").read_text()
    assert f"Past {DEFAULT_TIMEOUT_S:.0f} s it is stopped inside the epoch" in sink
