"""docker-compose.yml cannot be run here (no Docker engine), so its shape is checked instead."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from bridge.names import ENV_PREFIX
from bridge.settings import BridgeSettings, load_settings

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
    assert needs <= set(depends)
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


def test_dockerfile_builds_the_bridge_command_on_a_release_with_java_17() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    # python:3.11-slim follows Debian's newest release, which no longer ships Java 17.
    assert "FROM python:3.11-slim-bookworm" in dockerfile
    assert "openjdk-17-jre-headless" in dockerfile
    assert "java-17-openjdk-amd64" not in dockerfile, "JAVA_HOME must not name one architecture"
    assert 'ENTRYPOINT ["bridge"]' in dockerfile


def test_consumer_healthcheck_and_published_port_are_the_configured_http_port(
    services: dict[str, Any],
) -> None:
    port = load_settings(ROOT / "deploy" / "bridge.yaml").require_consumer().http_port
    assert port is not None, "deploy/bridge.yaml sets no consumer.http_port: never healthy"
    consumer = services["consumer"]
    assert f"localhost:{port}/readyz" in " ".join(consumer["healthcheck"]["test"])
    assert any(str(mapping).endswith(f":{port}") for mapping in consumer["ports"])


def test_every_bind_mount_exists_and_every_named_volume_is_declared(
    services: dict[str, Any],
) -> None:
    declared = set(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["volumes"])
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = str(mount).split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in declared, f"{name} mounts undeclared volume {source}"


def test_every_bridge_variable_names_a_setting(services: dict[str, Any]) -> None:
    fields = _setting_paths(BridgeSettings)
    for name, service in services.items():
        for key in service.get("environment", {}):
            if key.startswith(ENV_PREFIX):
                path = tuple(key.removeprefix(ENV_PREFIX).lower().split("__"))
                assert path in fields, f"{name}: {key} is not a setting"


def test_the_init_sql_creates_every_routed_table_with_its_upsert_key() -> None:
    init = " ".join(p.read_text() for p in sorted((ROOT / "deploy" / "postgres-init").iterdir()))
    for route in load_settings(ROOT / "deploy" / "bridge.yaml").require_consumer().routes:
        match = re.search(rf"CREATE TABLE IF NOT EXISTS {re.escape(route.table)} \((.*?)\);",
                          init, re.DOTALL)  # fmt: skip
        assert match, f"deploy/postgres-init creates no {route.table}"
        for key in route.key_columns:
            assert re.search(rf"\b{key}\b[^,]*PRIMARY KEY", match.group(1)), key


def test_the_producer_reads_what_the_sample_data_service_writes(
    services: dict[str, Any],
) -> None:
    writes = _option(services["sample-data"]["command"], "--output")
    assert _option(services["producer"]["command"], "--input") == writes
    shared = set(services["sample-data"]["volumes"]) & set(services["producer"]["volumes"])
    assert any(writes.startswith(str(v).split(":")[1]) for v in shared)
    depends = services["producer"]["depends_on"]["sample-data"]
    assert depends["condition"] == "service_completed_successfully"


def _option(command: list[str], name: str) -> str:
    return next(arg.split("=", 1)[1] for arg in command if arg.startswith(f"{name}="))


def _setting_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for name, field in model.model_fields.items():
        # A section that may be absent (`X | None`) is a section all the same.
        candidates = [field.annotation, *get_args(field.annotation)]
        sections = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if sections:
            paths |= _setting_paths(sections[0], (*prefix, name))
        else:
            paths.add((*prefix, name))
    return paths
