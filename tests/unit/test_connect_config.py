"""Kafka Connect JDBC sink configurations translated into routes: each row of docs/routes.md's
table "Coming from Kafka Connect", and every untranslatable key refused in one error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.errors import ConfigError
from bridge.settings import load_settings
from bridge_shell.connect_config import read_connect_config, translate

BASE = {
    "name": "orders-sink",
    "connector.class": "io.confluent.connect.jdbc.JdbcSinkConnector",
    "topics": "orders",
    "connection.url": "jdbc:postgresql://db/shop",
    "tasks.max": "2",
}
AVRO = "io.confluent.connect.avro.AvroConverter"


@pytest.mark.parametrize(
    ("connect", "route"),
    [
        ({}, {"topic": "orders", "table": "public.orders", "mode": "insert"}),
        ({"topics": "", "topics.regex": "orders-.*", "table.name.format": "sales.${topic}"},
         {"topic_pattern": "orders-.*", "table": "sales.${topic}"}),
        ({"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id"},
         {"mode": "upsert", "key_source": "value", "key_columns": ["id"]}),
        ({"insert.mode": "update", "pk.mode": "record_key", "pk.fields": "id",
          "delete.enabled": "true"},
         {"mode": "update", "key_source": "record_key", "key_columns": ["id"]}),
        ({"pk.mode": "kafka"}, {"key_source": "kafka", "key_columns": [
            "__connect_topic", "__connect_partition", "__connect_offset"]}),
        ({"transforms": "pick", "transforms.pick.type":
          "org.apache.kafka.connect.transforms.ReplaceField$Value",
          "transforms.pick.exclude": "secret", "transforms.pick.renames": "name:label"},
         {"fields": {"exclude": ["secret"], "rename": {"name": "label"}}}),
        ({"fields.whitelist": "id,name"}, {"fields": {"include": ["id", "name"]}}),
        ({"errors.tolerance": "all", "errors.deadletterqueue.topic.name": "dlq"},
         {"on_record_error": "dead_letter"}),
        ({"errors.tolerance": "none"}, {"on_record_error": "stop"}),
        ({"transforms": "meta", "transforms.meta.type":
          "org.apache.kafka.connect.transforms.InsertField$Value",
          "transforms.meta.topic.field": "src_topic", "transforms.meta.offset.field": "src_off!"},
         {"metadata": {"src_topic": "topic", "src_off": "offset"}}),
        ({"value.converter": AVRO, "value.converter.schema.registry.url": "http://r:8081",
          "key.converter": AVRO, "key.converter.schema.registry.url": "http://r:8081",
          "insert.mode": "upsert", "pk.mode": "record_key", "pk.fields": "id",
          "auto.create": "true", "auto.evolve": "true"},
         {"value_format": "avro", "key_format": "avro", "key_source": "record_key",
          "auto_create": True, "auto_evolve": True}),
    ],
)  # fmt: skip
def test_each_row_of_the_connect_table_translates_to_a_route_the_settings_take(
    connect: dict[str, str], route: dict[str, Any]
) -> None:
    translated = translate({**BASE, **connect})
    (made,) = translated.consumer["routes"]
    assert {k: made[k] for k in route} == route, made
    assert translated.consumer["group_id"] == "connect-orders-sink"
    # What it prints is a configuration the consumer's settings accept as it is.
    load_settings(postgres={"dsn": "postgresql://u@h/db"}, **translated.document())


def test_every_key_that_cannot_be_translated_is_refused_at_once() -> None:
    with pytest.raises(ConfigError) as refused:
        translate({**BASE, "insert.mode": "multi", "pk.mode": "record_value",
                   "transforms": "t", "transforms.t.type": "com.example.Mask",
                   "value.converter": "com.example.Converter",
                   "behavior.on.null.values": "fail"})  # fmt: skip
    keys = [key for key, _ in refused.value.problems]
    assert keys == ["insert.mode", "pk.fields", "value.converter", "transforms.t.type",
                    "behavior.on.null.values"], refused.value.problems  # fmt: skip


def test_a_properties_file_and_the_rest_apis_json_read_alike(tmp_path: Path) -> None:
    properties = tmp_path / "sink.properties"
    properties.write_text("# the sink\nname=orders-sink\ntopics = orders\n\ninsert.mode=upsert\n")
    as_json = tmp_path / "sink.json"
    as_json.write_text('{"name": "orders-sink", "config": {"topics": "orders", '
                       '"insert.mode": "upsert"}}')  # fmt: skip
    assert read_connect_config(properties) == read_connect_config(as_json) == {
        "name": "orders-sink", "topics": "orders", "insert.mode": "upsert"}  # fmt: skip
