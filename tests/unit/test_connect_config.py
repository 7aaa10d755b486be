"""Kafka Connect JDBC sink configurations translated into routes: each row of docs/routes.md's
table "Coming from Kafka Connect", and every untranslatable key refused in one error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.errors import ConfigError
from bridge.settings import load_settings
from bridge_shell.connect_config import ConnectConfigRefused, read_connect_config, translate

BASE = {
    "name": "orders-sink",
    "connector.class": "io.confluent.connect.jdbc.JdbcSinkConnector",
    "topics": "orders",
    "connection.url": "jdbc:postgresql://db/shop",
    "tasks.max": "2",
}
AVRO = "io.confluent.connect.avro.AvroConverter"
PROTOBUF = "io.confluent.connect.protobuf.ProtobufConverter"
JSON = "org.apache.kafka.connect.json.JsonConverter"
UNWRAP = "io.debezium.transforms.ExtractNewRecordState"


@pytest.mark.parametrize(
    ("connect", "route"),
    [
        ({}, {"topic": "orders", "table": "public.orders", "mode": "insert"}),
        ({"topics": "", "topics.regex": "orders-.*", "table.name.format": "sales.${topic}"},
         {"topic_pattern": "orders-.*", "table": 'sales."${topic}"'}),
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
        ({"value.converter": JSON, "value.converter.schemas.enable": "false",
          "transforms": "unwrap", "transforms.unwrap.type": UNWRAP,
          "transforms.unwrap.add.fields": "op,source.ts_ms",
          "transforms.unwrap.delete.tombstone.handling.mode": "tombstone"},
         {"unwrap": "debezium", "unwrap_fields": ["op", "source.ts_ms"]}),
        ({"key.converter": "org.apache.kafka.connect.storage.StringConverter",
          "insert.mode": "upsert", "pk.mode": "record_key", "pk.fields": "id"},
         {"key_format": "string", "key_source": "record_key", "key_columns": ["id"]}),
        ({"value.converter": PROTOBUF, "value.converter.schema.registry.url": "http://r:8081",
          "key.converter": PROTOBUF, "key.converter.schema.registry.url": "http://r:8081",
          "insert.mode": "upsert", "pk.mode": "record_key", "pk.fields": "id",
          "auto.create": "true", "auto.evolve": "true"},
         {"value_format": "protobuf", "key_format": "protobuf", "key_source": "record_key",
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
    assert translated.document()["postgres"] == {"dsn": "postgresql://db/shop"}
    load_settings(**translated.document())


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


# Every key of the Confluent JDBC sink's configuration (JdbcSinkConfig, kafka-connect-jdbc main,
# and the connector-level keys every sink takes), each with a value a user would give it.
CONFLUENT_KEYS = {
    "name": "orders-sink", "connector.class": "io.confluent.connect.jdbc.JdbcSinkConnector",
    "tasks.max": "2", "topics": "orders", "topics.regex": "orders-.*",
    "key.converter": AVRO, "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "key.converter.schema.registry.url": "http://r:8081",
    "key.converter.basic.auth.credentials.source": "USER_INFO",
    "key.converter.basic.auth.user.info": "user:secret",
    "key.converter.schemas.enable": "false", "value.converter.schemas.enable": "false",
    "header.converter": "org.apache.kafka.connect.storage.SimpleHeaderConverter",
    "config.action.reload": "restart", "transforms": "meta",
    "transforms.meta.type": "org.apache.kafka.connect.transforms.InsertField$Value",
    "transforms.meta.offset.field": "src_offset", "predicates": "isOrder",
    "errors.retry.timeout": "0", "errors.retry.delay.max.ms": "60000",
    "errors.tolerance": "all", "errors.log.enable": "true",
    "errors.log.include.messages": "true", "errors.deadletterqueue.topic.name": "dlq",
    "errors.deadletterqueue.topic.replication.factor": "3",
    "errors.deadletterqueue.context.headers.enable": "true",
    "connection.url": "jdbc:postgresql://db:5432/shop", "connection.user": "bridge",
    "connection.password": "s3cret", "connection.attempts": "3",
    "connection.backoff.ms": "10000", "connection.loginTimeout": "10",
    "jdbc.credentials.provider.class":
        "io.confluent.connect.jdbc.util.DefaultJdbcCredentialsProvider",
    "dialect.name": "PostgreSqlDatabaseDialect", "insert.mode": "insert", "batch.size": "3000",
    "delete.enabled": "true", "table.name.format": "kafka_${topic}", "pk.mode": "kafka",
    "pk.fields": "t,p,o", "fields.whitelist": "id,name", "db.timezone": "UTC",
    "date.timezone": "DB_TIMEZONE", "date.calendar.system": "LEGACY", "table.types": "TABLE",
    "auto.create": "true", "auto.evolve": "true", "quote.sql.identifiers": "always",
    "mssql.use.merge.holdlock": "true", "max.retries": "10", "retry.backoff.ms": "3000",
    "replace.null.with.default": "false", "string.output.value.column.name": "record_value",
    "timestamp.fields.list": "created", "timestamp.precision.mode": "microseconds",
    "trim.sensitive.log": "false",
}  # fmt: skip
# Every key of Debezium's JDBC sink (its documentation's configuration properties, 2.x and 3.x).
DEBEZIUM_KEYS = {
    "name": "orders-sink", "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
    "tasks.max": "1", "topics": "orders", "topics.regex": "orders-.*",
    "connection.provider": "org.hibernate.c3p0.internal.C3P0ConnectionProvider",
    "connection.url": "jdbc:postgresql://db:5432/shop", "connection.username": "bridge",
    "connection.password": "s3cret", "connection.pool.min_size": "5",
    "connection.pool.max_size": "32", "connection.pool.acquire_increment": "32",
    "connection.pool.timeout": "1800", "connection.restart.on.errors": "false",
    "use.time.zone": "UTC", "database.time_zone": "UTC", "delete.enabled": "true",
    "truncate.enabled": "false", "insert.mode": "upsert", "primary.key.mode": "record_key",
    "primary.key.fields": "id", "quote.identifiers": "false", "schema.evolution": "none",
    "table.name.format": "${topic}", "collection.name.format": "${topic}",
    "dialect.postgres.postgis.schema": "public", "dialect.sqlserver.identity.insert": "false",
    "batch.size": "500", "use.reduction.buffer": "false", "field.include.list": "orders:id",
    "field.exclude.list": "orders:secret", "flush.max.retries": "5",
    "flush.retry.delay.ms": "1000", "flush.failure.max.retries": "5",
    "flush.failure.retries.wait.ms": "1000",
    "column.naming.strategy": "io.debezium.connector.jdbc.naming.DefaultColumnNamingStrategy",
    "table.naming.strategy": "io.debezium.connector.jdbc.naming.DefaultTableNamingStrategy",
    "collection.naming.strategy":
        "io.debezium.connector.jdbc.naming.DefaultCollectionNamingStrategy",
    "hibernate.c3p0.idle_test_period": "300",
}  # fmt: skip
GENERIC = "no bridge setting does what this does"


def _fate(config: dict[str, str], key: str) -> str:
    """What became of `key` in `config`: translated, left out (why), or refused (why)."""
    try:
        return translate(config).fates[key]
    except ConnectConfigRefused as refused:
        return refused.fates[key]


@pytest.mark.parametrize(("documented", "base"), [
    (CONFLUENT_KEYS, {**BASE}),
    (DEBEZIUM_KEYS, {**BASE, "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector"}),
], ids=["confluent", "debezium"])  # fmt: skip
def test_every_documented_key_is_translated_left_out_with_why_or_refused_with_why(
    documented: dict[str, str], base: dict[str, str]
) -> None:
    fates = {}
    for key, value in documented.items():
        config = {**base, key: value}
        if key == "topics.regex":
            config["topics"] = ""
        fates[key] = _fate(config, key)
    generic = [key for key, fate in fates.items() if GENERIC in fate]
    assert generic == [], fates
    assert all(
        f == "translated" or f.startswith(("left out: ", "refused: ")) for f in fates.values()
    )


def test_every_key_of_a_whole_configuration_has_a_fate_and_left_out_ones_are_named() -> None:
    config = {**BASE, "batch.size": "500", "max.retries": "3", "quote.sql.identifiers": "always",
              "db.timezone": "UTC", "errors.log.enable": "true"}  # fmt: skip
    translated = translate(config)
    assert set(translated.fates) == set(config)
    assert translated.fates["quote.sql.identifiers"] == "translated"  # the tables' quoting
    named = " ".join(translated.notes)
    for key in ("batch.size", "max.retries", "errors.log.enable", "tasks.max"):
        assert translated.fates[key].startswith("left out: ") and key in named, key
    assert translated.fates["db.timezone"] == "translated"  # UTC: the route's default zone
    assert "offsets: Connect's committed offsets are not carried over" in named
    assert "bridge offsets reset --group connect-orders-sink" in named


def test_credentials_become_file_references_and_are_never_printed() -> None:
    translated = translate({
        **BASE, "connection.user": "shop", "connection.password": "s3cret",
        "value.converter": AVRO, "value.converter.schema.registry.url": "https://r:8081",
        "value.converter.basic.auth.credentials.source": "USER_INFO",
        "value.converter.basic.auth.user.info": "reader:hunter2",
    })  # fmt: skip
    printed = translated.yaml()
    assert "s3cret" not in printed and "hunter2" not in printed
    document = translated.document()
    assert document["postgres"] == {"dsn": "${file:/run/secrets/postgres-dsn}"}
    # basic.auth.user.info alone: the registry's client refuses Connect's credentials.source.
    assert document["schema_registry"]["properties"] == {
        "basic.auth.user.info": "${file:/run/secrets/registry-user-info}",
    }
    notes = " ".join(translated.notes)
    assert "postgresql://shop:<password>@db/shop into /run/secrets/postgres-dsn" in notes
    assert "user:password into /run/secrets/registry-user-info" in notes


def test_table_names_come_out_as_connect_writes_them_quoted_where_it_quotes() -> None:
    def table(config: dict[str, str]) -> str:
        (route,) = translate(config).consumer["routes"]
        return str(route["table"])

    assert table({**BASE, "topics": "shop.orders"}) == "shop.orders"  # schema.table from the dot
    assert table({**BASE, "topics": "shop-orders"}) == 'public."shop-orders"'  # as Connect
    assert table({**BASE, "topics": "Orders"}) == 'public."Orders"'  # case kept, quoted
    unquoted = {**BASE, "quote.sql.identifiers": "never"}
    assert table({**unquoted, "topics": "Orders"}) == "public.orders"  # folded, as PostgreSQL
    with pytest.raises(ConfigError, match=r"unquoted \(quote\.sql\.identifiers\)"):
        translate({**unquoted, "topics": "shop-orders"})
    debezium = {**BASE, "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector"}
    # Debezium's naming makes dots underscores, and quotes nothing unless told to.
    assert table({**debezium, "topics": "shop.orders"}) == "public.shop_orders"
    assert table({**debezium, "topics": "Shop", "quote.identifiers": "true"}) == 'public."Shop"'
    for config in (
        {**BASE, "topics": "shop-orders"},
        {**BASE, "topics": "", "topics.regex": "o-.*"},
    ):
        routes = translate(config).consumer["routes"]
        load_settings(
            postgres={"dsn": "postgresql://db/shop"},
            kafka={"bootstrap_servers": "k:9092"},
            consumer={"group_id": "g", "routes": routes},
        )  # the settings take it


def test_a_debezium_jdbc_sink_config_translates_with_its_own_keys() -> None:
    translated = translate({
        **BASE, "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "insert.mode": "upsert", "primary.key.mode": "record_key", "primary.key.fields": "id",
        "delete.enabled": "true", "schema.evolution": "basic", "value.converter": AVRO,
        "value.converter.schema.registry.url": "http://r:8081", "key.converter": AVRO,
        "key.converter.schema.registry.url": "http://r:8081",
        "field.exclude.list": "orders:secret",
    })  # fmt: skip
    (route,) = translated.consumer["routes"]
    assert {
        k: route[k]
        for k in ("mode", "key_source", "key_columns", "auto_create", "auto_evolve", "fields")
    } == {
        "mode": "upsert",
        "key_source": "record_key",
        "key_columns": ["id"],
        "auto_create": True,
        "auto_evolve": True,
        "fields": {"exclude": ["secret"]},
    }
    assert any("ExtractNewRecordState" in note for note in translated.notes)
    load_settings(**translated.document())


def test_a_debezium_sink_of_json_events_unwraps_them_as_debeziums_own_sink_reads_them() -> None:
    translated = translate({
        **BASE, "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "insert.mode": "upsert", "primary.key.mode": "record_key", "primary.key.fields": "id",
        "delete.enabled": "true", "value.converter": JSON,
        "value.converter.schemas.enable": "false",
    })  # fmt: skip
    (route,) = translated.consumer["routes"]
    assert route["unwrap"] == "debezium"
    assert not any("ExtractNewRecordState" in note for note in translated.notes)
    load_settings(**translated.document())


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("transforms.unwrap.delete.handling.mode", "rewrite"),
        ("transforms.unwrap.delete.tombstone.handling.mode", "drop"),
        ("transforms.unwrap.drop.tombstones", "true"),
        ("transforms.unwrap.add.fields", "op,before.id"),
        ("transforms.unwrap.add.fields.prefix", "_"),
        ("transforms.unwrap.route.by.field", "table"),
    ],
)
def test_an_unwrap_that_would_keep_deletes_or_name_fields_otherwise_is_refused_naming_why(
    option: str, value: str
) -> None:
    with pytest.raises(ConnectConfigRefused) as refused:
        translate({**BASE, "value.converter": JSON, "value.converter.schemas.enable": "false",
                   "transforms": "unwrap", "transforms.unwrap.type": UNWRAP,
                   option: value})  # fmt: skip
    assert [key for key, _ in refused.value.problems] == [option]


def test_an_unwrap_of_avro_events_is_refused_with_the_alternative() -> None:
    with pytest.raises(ConnectConfigRefused) as refused:
        translate({**BASE, "value.converter": AVRO,
                   "value.converter.schema.registry.url": "http://r:8081",
                   "transforms": "unwrap", "transforms.unwrap.type": UNWRAP})  # fmt: skip
    (problem,) = refused.value.problems
    assert problem[0] == "transforms.unwrap.type" and "source connector" in problem[1]


def test_the_yaml_has_no_anchors_where_routes_share_a_value() -> None:
    printed = translate(
        {**BASE, "topics": "orders,refunds", "fields.whitelist": "id,amount"}
    ).yaml()
    assert "&id" not in printed and "*id" not in printed


CAST = "org.apache.kafka.connect.transforms.Cast$Value"
TIMESTAMPS = "org.apache.kafka.connect.transforms.TimestampConverter$Value"
ROUTER = "org.apache.kafka.connect.transforms.RegexRouter"


def test_regex_router_cast_timestamp_converter_and_db_timezone_translate_to_the_route() -> None:
    translated = translate({
        **BASE, "topics": "shop.orders.v1,shop.refunds.v1", "table.name.format": "ledger.${topic}",
        "transforms": "route,rename,cast,when",
        "transforms.route.type": ROUTER, "transforms.route.regex": r"shop\.(.*)\.v(\d+)",
        "transforms.route.replacement": "$1_v$2",
        "transforms.rename.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
        "transforms.rename.renames": "amount:total",
        "transforms.cast.type": CAST, "transforms.cast.spec": "total:float64, qty:int32",
        "transforms.when.type": TIMESTAMPS, "transforms.when.field": "placed",
        "transforms.when.target.type": "Timestamp",
        "transforms.when.format": "yyyy-MM-dd HH:mm:ss",
        "transforms.when.unix.precision": "seconds",
        "db.timezone": "Europe/Paris",
    })  # fmt: skip
    routes = translated.consumer["routes"]
    assert [(r["topic"], r["table"]) for r in routes] == [
        ("shop.orders.v1", "ledger.orders_v1"), ("shop.refunds.v1", "ledger.refunds_v1")
    ]  # fmt: skip
    assert routes[0]["fields"] == {
        "rename": {"amount": "total"},
        "cast": {"amount": "float64", "qty": "int32"},  # the record's field, before its rename
        "timestamps": {"placed": {"type": "timestamp", "format": "yyyy-MM-dd HH:mm:ss",
                                  "unix_precision": "seconds"}},
    }  # fmt: skip
    assert routes[0]["timestamp_zone"] == "Europe/Paris"
    assert all(fate == "translated" for key, fate in translated.fates.items()
               if key.startswith("transforms.") or key == "db.timezone")  # fmt: skip
    load_settings(consumer=translated.consumer)  # every route as bridge reads it


def test_regex_router_with_topics_regex_renames_each_topic_at_run_time() -> None:
    translated = translate({
        **BASE, "topics": "", "topics.regex": r"shop\..*", "transforms": "route",
        "transforms.route.type": ROUTER, "transforms.route.regex": r"shop\.(.*)",
        "transforms.route.replacement": "$1",
    })  # fmt: skip
    route = translated.consumer["routes"][0]
    assert route["topic_rename"] == {"regex": r"shop\.(.*)", "replacement": "$1"}
    consumer = load_settings(consumer=translated.consumer).consumer
    assert consumer is not None
    assert consumer.routes[0].for_topic("shop.Orders").table == 'public."Orders"'


@pytest.mark.parametrize(("more", "key", "why"), [
    ({"transforms.t.type": CAST, "transforms.t.spec": "int64"}, "transforms.t.spec",
     "a cast of the whole value"),
    ({"transforms.t.type": CAST, "transforms.t.spec": "a:decimal"}, "transforms.t.spec",
     "decimal is not one of"),
    ({"transforms.t.type": TIMESTAMPS, "transforms.t.target.type": "Timestamp"},
     "transforms.t.field", "name its field"),
    ({"transforms.t.type": TIMESTAMPS, "transforms.t.field": "f",
      "transforms.t.target.type": "string"}, "transforms.t.format", "needs format"),
    ({"transforms.t.type": TIMESTAMPS, "transforms.t.field": "f", "transforms.t.target.type":
      "Timestamp", "transforms.t.format": "yyyy-QQ"}, "transforms.t.format", "'QQ' is not read"),
    ({"transforms.t.type": ROUTER, "transforms.t.regex": "(a", "transforms.t.replacement": "x"},
     "transforms.t.regex", "(a"),
    ({"transforms.t.type": ROUTER, "transforms.t.regex": "a", "transforms.t.replacement": "x",
      "pk.mode": "kafka", "insert.mode": "upsert"}, "pk.mode", "RegexRouter renamed"),
    ({"transforms.t.type": "org.apache.kafka.connect.transforms.Cast$Key",
      "transforms.t.spec": "int64"}, "transforms.t.type", "no bridge setting does it"),
    ({"db.timezone": "Mars/Olympus"}, "db.timezone", "not a time zone"),
    ({"date.timezone": "DB_TIMEZONE", "db.timezone": "Europe/Paris"}, "date.timezone",
     "as the date it is"),
])  # fmt: skip
def test_a_conversion_bridge_would_do_otherwise_is_refused_naming_its_key(
    more: dict[str, str], key: str, why: str
) -> None:
    config = {**BASE, **({"transforms": "t"} if any(k.startswith("transforms.") for k in more)
                         else {}), **more}  # fmt: skip
    assert why in _fate(config, key)
