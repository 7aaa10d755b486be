"""The stack's schema registry (Apicurio Registry 2.6, Confluent-compatible API) as bridge's
clients use it: confluent-kafka's registry client registers and reads schemas by subject and id,
and a restarted registry still has every one of them, as records in Kafka that carry the ids
require."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.harness import Endpoints


@pytest.fixture
def registry(stack: Endpoints) -> Iterator[SchemaRegistryClient]:
    if stack.registry_url is None:
        pytest.skip("no schema registry: set BRIDGE_TEST_SCHEMA_REGISTRY_URL with the others")
    with SchemaRegistryClient({"url": stack.registry_url}) as client:
        yield client


def _avro(name: str, *fields: str) -> Schema:
    record = {
        "type": "record",
        "name": name,
        "fields": [{"name": f, "type": "long"} for f in fields],
    }
    return Schema(json.dumps(record), "AVRO")


def test_a_schema_is_registered_under_its_subject_and_read_back_by_id(
    registry: SchemaRegistryClient,
) -> None:
    subject = f"orders-{uuid.uuid4().hex[:8]}-value"
    schema_id = registry.register_schema(subject, _avro("Order", "id"))
    assert subject in registry.get_subjects()
    assert json.loads(registry.get_schema(schema_id).schema_str or "{}")["name"] == "Order"
    # The same schema again is the same id; a compatible change is a new version.
    assert registry.register_schema(subject, _avro("Order", "id")) == schema_id
    latest = registry.get_latest_version(subject)
    assert latest.schema_id == schema_id and latest.version == 1


def test_an_unknown_schema_id_is_refused_by_the_registry(registry: SchemaRegistryClient) -> None:
    with pytest.raises(SchemaRegistryError) as refused:
        registry.get_schema(987_654_321)
    assert refused.value.http_status_code == 404


def test_schemas_survive_a_registry_restart(stack: Endpoints) -> None:
    if stack.registry is None:
        pytest.skip("needs the local stack's registry process to restart it")
    subject = f"restart-{uuid.uuid4().hex[:8]}-value"
    with SchemaRegistryClient({"url": stack.registry.url}) as before:
        schema_id = before.register_schema(subject, _avro("Restarted", "id", "qty"))

    stack.registry.stop()
    assert not stack.registry.running()
    stack.registry.start()
    stack.registry.wait_ready(60)

    with SchemaRegistryClient({"url": stack.registry.url}) as after:  # a cache of its own
        assert subject in after.get_subjects()
        fields = json.loads(after.get_schema(schema_id).schema_str or "{}")["fields"]
    assert [field["name"] for field in fields] == ["id", "qty"]
