"""`bridge consume --check` against the real stack: each route's plan for a valid
configuration, and three problems of another reported together; nothing consumed either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import sql
from tests.harness import Endpoints
from tests.integration.test_operator_tools import bridge

# In `make check`'s quick loop too.
pytestmark = pytest.mark.quick


WHOLE_BY_DEFAULT = (
    "  visible by whole Spark epochs of bridge's sink, other producers' records as their "
    "batches commit (epochs: whole, the default)"
)


def _config(
    tmp_path: Path,
    names: dict[str, str],
    routes: list[dict[str, Any]],
    registry_url: str | None = None,
) -> Path:
    path = tmp_path / "bridge.yaml"
    consumer = {"group_id": names["group"], "state_schema": names["schema"], "routes": routes}
    registry = {"schema_registry": {"url": registry_url}} if registry_url else {}
    path.write_text(yaml.safe_dump({"consumer": consumer, **registry}))
    return path


def test_check_prints_each_routes_plan_and_consumes_nothing(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    topic, table = names["topic"], f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, topic, partitions=2)
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, amount_eur numeric NOT NULL, "
               "note text DEFAULT 'none', source_topic text)")  # fmt: skip
    route: dict[str, Any] = {
        "topic": topic, "table": table, "mode": "upsert", "key_columns": ["id"],
        "fields": {"rename": {"amount": "amount_eur"}}, "metadata": {"source_topic": "topic"},
    }  # fmt: skip
    checked = bridge(
        stack, "consume", "--check", "--config", str(_config(tmp_path, names, [route]))
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines() == [
        f"route 0: topic {topic} -> {table} (upsert, values json)",
        "  id <- the value's field id (key); when absent, a dead letter (NOT NULL, no default)",
        "  amount_eur <- the value's field amount; when absent, a dead letter (NOT NULL, no "
        "default)",
        "  note <- the value's field note; when absent, its default",
        "  source_topic <- the record's topic",
        "  key: id, from the value's fields",
        "  a tombstone: deletes the row of its record key (json)",
        "  a bad record: a dead letter, with where and why",
        WHOLE_BY_DEFAULT,
        "no problems: the consumer can run as configured",
    ]
    assert sql(stack, f"SELECT to_regnamespace('{names['schema']}')") == [(None,)]


def test_check_reports_three_problems_together(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    topic, table = names["topic"], f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, topic, partitions=1)
    create_topic(stack.bootstrap_servers, f"{topic}-b", partitions=1)
    sql(stack, f"CREATE TABLE {table} (id bigint, note text)")
    routes: list[dict[str, Any]] = [
        {"topic": topic, "table": f"public.{names['table']}_missing"},  # no such table
        {"topic": f"{topic}-b", "table": table, "mode": "upsert", "key_columns": ["ref"]},
        {"topic": f"{topic}-never", "table": table},  # no such topic
    ]
    checked = bridge(stack, "consume", "--check", "--config", str(_config(tmp_path, names, routes)))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    said = checked.stderr
    assert "consumer.routes.0" in said and "_missing" in said, said
    assert "consumer.routes.1" in said and "ref" in said, said
    assert f"consumer.routes.2.topic: topic '{topic}-never' does not exist in Kafka" in said, said
    assert "3 problem(s)" in said, said
    assert sql(stack, f"SELECT to_regnamespace('{names['schema']}')") == [(None,)]


def test_check_shows_a_protobuf_route_like_the_others(
    stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    """A Protobuf route whose table is still to be created from its schemas, keyed by its
    Protobuf record keys: the plan says so, with the registry asked; without a registry, the
    problem is named (it once failed with an AssertionError's traceback)."""
    topic, table = names["topic"], f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, topic, partitions=1)
    route: dict[str, Any] = {
        "topic": topic, "table": table, "mode": "upsert", "key_columns": ["id"],
        "value_format": "protobuf", "key_format": "protobuf", "key_source": "record_key",
        "auto_create": True, "auto_evolve": True,
    }  # fmt: skip
    without = bridge(
        stack, "consume", "--check", "--config", str(_config(tmp_path, names, [route]))
    )
    assert without.returncode != 0 and "Traceback" not in without.stderr, without.stderr
    said = without.stdout + without.stderr
    assert "consumer.routes.0.value_format" in said, said
    assert "records in the registry's format need schema_registry.url" in said, said
    config = _config(tmp_path, names, [route], registry_url)
    checked = bridge(stack, "consume", "--check", "--config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines() == [
        f"route 0: topic {topic} -> {table} (upsert, values protobuf)",
        "  table: not there yet; created from the first record's writer schema (auto_create), "
        "its key columns the primary key",
        "  key: id, from the record key (protobuf)",
        "  a tombstone: deletes the row of its record key (protobuf)",
        "  a bad record: a dead letter, with where and why",
        WHOLE_BY_DEFAULT,
        "no problems: the consumer can run as configured",
    ]
