"""docker-compose.yml cannot be run here (no Docker engine), so its shape is checked instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    result: dict[str, Any] = compose["services"]
    return result


def test_official_images_for_the_servers(services: dict[str, Any]) -> None:
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["postgres"]["image"].startswith("postgres:")


def test_kafka_runs_kraft_with_single_node_transaction_settings(services: dict[str, Any]) -> None:
    env = services["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"


@pytest.mark.parametrize("name", ["kafka", "postgres", "consumer"])
def test_services_have_health_checks(services: dict[str, Any], name: str) -> None:
    check = services[name]["healthcheck"]
    assert check["test"][0] in ("CMD", "CMD-SHELL")


@pytest.mark.parametrize(
    ("name", "needs"), [("producer", {"kafka"}), ("consumer", {"kafka", "postgres"})]
)
def test_pipeline_waits_for_healthy_servers(
    services: dict[str, Any], name: str, needs: set[str]
) -> None:
    depends = services[name]["depends_on"]
    assert set(depends) == needs
    assert all(depends[n]["condition"] == "service_healthy" for n in needs)
    assert services[name]["build"] == "."


def test_pipeline_environment_is_valid_configuration(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in services["consumer"]["environment"].items():
        monkeypatch.setenv(key, value)
    settings = load_settings(ROOT / "deploy" / "bridge.yaml")
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert settings.require_consumer().group_id == "orders-to-pg"


def test_dockerfile_builds_the_bridge_command() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "openjdk-17" in dockerfile
    assert 'ENTRYPOINT ["bridge"]' in dockerfile
