"""The Grafana dashboard and the Prometheus scrape config against what the code exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from bridge.settings import load_settings
from consumers.metrics import ConsumerMetrics
from spark_jobs.producer_metrics import ProducerMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "bridge.json"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry exposes, labelled children or not."""
    names = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def queried(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each metric name a panel's PromQL uses -> the panel's title."""
    found = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\b(bridge_[a-z_]+)\b", target["expr"]):
                found[name] = panel["title"]
    return found


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    known = exported(ConsumerMetrics("g").registry) | exported(ProducerMetrics("q").registry)
    used = queried(json.loads(DASHBOARD.read_text()))
    unknown = {name: title for name, title in used.items() if name not in known}
    assert not unknown, f"queried but never exported: {unknown}"
    # The panels the operators asked for, each backed by a metric.
    for needed in ("bridge_consumer_lag", "bridge_consumer_dead_letters_total",
                   "bridge_consumer_partitions", "bridge_producer_rows_written_total",
                   "bridge_consumer_records_applied_total",
                   "bridge_consumer_batch_duration_seconds_bucket",
                   "bridge_producer_batch_duration_seconds_bucket"):  # fmt: skip
        assert needed in used, needed


def test_the_check_above_can_fail() -> None:
    known = exported(ConsumerMetrics("g").registry)
    assert "bridge_consumer_lag" in known and "bridge_consumer_lagg" not in known
    assert "bridge_consumer_batches_total" in known and "bridge_consumer_batches" not in known


def test_prometheus_scrapes_the_ports_the_services_serve_on() -> None:
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"][0] for job in scrape["scrape_configs"]
    }
    consumer_port = load_settings(ROOT / "deploy" / "bridge.yaml").require_consumer().http_port
    assert targets["bridge-consumer"] == f"consumer:{consumer_port}"
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    producer_port = next(
        a.split("=", 1)[1]
        for a in services["producer"]["command"]
        if a.startswith("--metrics-port=")
    )
    assert targets["bridge-producer"] == f"producer:{producer_port}"


def test_grafana_provisions_the_dashboard_from_the_mounted_directory() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    mounts = dict(str(v).split(":")[:2] for v in services["grafana"]["volumes"])
    provider = yaml.safe_load(
        (ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "bridge.yaml").read_text()
    )["providers"][0]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
