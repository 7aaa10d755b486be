"""Each refusal of the configuration names the offending key; good configurations load."""

from __future__ import annotations

from pathlib import Path

import certifi
import pytest

from bridge.errors import ConfigError
from bridge.settings import load_settings

GOOD = """
kafka:
  bootstrap_servers: "127.0.0.1:9092"
  properties: {"linger.ms": 5}
postgres:
  dsn: "postgresql://user:secret@127.0.0.1:5432/db"
consumer:
  group_id: "orders-to-pg"
  routes:
    - topic: "orders"
      table: "public.orders"
      mode: "insert"
    - topic: "customers"
      table: "customers"
      mode: "upsert"
      key_columns: ["id"]
"""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("BRIDGE_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "bridge.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refusal(tmp_path: Path, text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, text))
    return raised.value.problems


def test_good_configuration_loads(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, GOOD))
    consumer = settings.require_consumer()
    assert [r.topic for r in consumer.routes] == ["orders", "customers"]
    assert consumer.routes[1].key_columns == ("id",)
    assert settings.kafka.client_config(acks="all") == {
        "bootstrap.servers": "127.0.0.1:9092",
        "linger.ms": 5,
        "acks": "all",
    }
    # Defaults sit under the user's properties, which sit under what the caller insists on.
    layered = settings.kafka.client_config(
        defaults={"linger.ms": 50, "fetch.queue.backoff.ms": 10}, acks="all"
    )
    assert layered["linger.ms"] == 5
    assert layered["fetch.queue.backoff.ms"] == 10
    assert layered["acks"] == "all"


def test_dsn_is_secret_in_reprs(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, GOOD))
    assert "secret" not in repr(settings)
    assert "secret" in settings.postgres.dsn.get_secret_value()


def test_unknown_top_level_key_is_refused(tmp_path: Path) -> None:
    assert refusal(tmp_path, GOOD + "\nkafak: {}\n") == [("kafak", "unknown key")]


def test_unknown_nested_key_is_refused_with_its_path(tmp_path: Path) -> None:
    text = GOOD.replace('mode: "insert"', 'mode: "insert"\n      colums: []')
    assert refusal(tmp_path, text) == [("consumer.routes.0.colums", "unknown key")]


def test_bad_mode_is_refused(tmp_path: Path) -> None:
    problems = refusal(tmp_path, GOOD.replace('mode: "insert"', 'mode: "merge"'))
    assert [path for path, _ in problems] == ["consumer.routes.0.mode"]
    assert "insert" in problems[0][1]


def test_upsert_without_key_columns_is_refused(tmp_path: Path) -> None:
    problems = refusal(tmp_path, GOOD.replace('key_columns: ["id"]', "key_columns: []"))
    assert problems[0][0] == "consumer.routes.1"
    assert "key_columns" in problems[0][1]


@pytest.mark.parametrize(
    ("bootstrap", "fragment"),
    [("", "at least one"), ("localhost", "host:port"), ("a:1,b", "host:port")],
)
def test_bad_bootstrap_servers_are_refused(tmp_path: Path, bootstrap: str, fragment: str) -> None:
    problems = refusal(tmp_path, GOOD.replace('"127.0.0.1:9092"', f'"{bootstrap}"'))
    assert problems[0][0] == "kafka.bootstrap_servers"
    assert fragment in problems[0][1]


def test_bootstrap_servers_inside_properties_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace('{"linger.ms": 5}', '{"bootstrap.servers": "x:1"}')
    assert refusal(tmp_path, text)[0][0] == "kafka.properties"


def test_bad_dsn_is_refused(tmp_path: Path) -> None:
    problems = refusal(tmp_path, GOOD.replace("postgresql://user:secret@", "mysql://user@"))
    assert problems[0][0] == "postgres.dsn"


def test_bad_table_name_is_refused(tmp_path: Path) -> None:
    problems = refusal(tmp_path, GOOD.replace('"public.orders"', '"a.b.c"'))
    assert problems[0][0] == "consumer.routes.0.table"


def test_topic_routed_twice_is_refused(tmp_path: Path) -> None:
    problems = refusal(tmp_path, GOOD.replace('topic: "customers"', 'topic: "orders"'))
    assert problems[0][0] == "consumer.routes"
    assert "orders" in problems[0][1]


def test_no_routes_is_refused(tmp_path: Path) -> None:
    text = 'consumer:\n  group_id: "g"\n  routes: []\n'
    assert refusal(tmp_path, text)[0][0] == "consumer.routes"


def test_batch_size_out_of_range_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace('group_id: "orders-to-pg"', 'group_id: "g"\n  batch_max_records: 0')
    assert refusal(tmp_path, text)[0][0] == "consumer.batch_max_records"


def test_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    assert refusal(tmp_path, "- a\n- b\n") == [("<file>", "the top level must be a mapping")]


def test_invalid_yaml_is_refused(tmp_path: Path) -> None:
    assert refusal(tmp_path, "kafka: [unclosed\n")[0][0] == "<file>"


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_settings(tmp_path / "absent.yaml")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = GOOD.replace('mode: "insert"', 'mode: "merge"').replace("kafka:", "kafka:\n  x: 1")
    paths = {path for path, _ in refusal(tmp_path, text)}
    assert paths == {"kafka.x", "consumer.routes.0.mode"}


def test_message_names_the_file_and_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, GOOD.replace('mode: "insert"', 'mode: "merge"')))
    assert "bridge.yaml" in str(raised.value)
    assert "consumer.routes.0.mode" in str(raised.value)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", "10.0.0.1:9093")
    settings = load_settings(write(tmp_path, GOOD))
    assert settings.kafka.bootstrap_servers == "10.0.0.1:9093"
    assert settings.kafka.properties == {"linger.ms": 5}


def test_bad_environment_value_is_refused_with_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", "nonsense")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert raised.value.problems[0][0] == "kafka.bootstrap_servers"


def test_stack_env_file_is_the_lowest_layer(tmp_path: Path) -> None:
    env_file = write(
        tmp_path,
        "BRIDGE_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:40000\n"
        "BRIDGE_POSTGRES__DSN=postgresql://bridge@127.0.0.1:40001/bridge\n",
        "stack.env",
    )
    only_stack = load_settings(env_file=env_file)
    assert only_stack.kafka.bootstrap_servers == "127.0.0.1:40000"
    assert only_stack.postgres.dsn.get_secret_value().endswith(":40001/bridge")
    # The configuration file wins over stack.env.
    with_file = load_settings(write(tmp_path, GOOD), env_file=env_file)
    assert with_file.kafka.bootstrap_servers == "127.0.0.1:9092"


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRIDGE_CONFIG", str(write(tmp_path, GOOD)))
    assert load_settings().require_consumer().group_id == "orders-to-pg"


def test_require_consumer_refuses_when_absent() -> None:
    with pytest.raises(ConfigError, match="consumer"):
        load_settings().require_consumer()


def test_a_state_schema_from_the_command_line_must_be_a_plain_name(tmp_path: Path) -> None:
    from bridge.names import DEFAULT_STATE_SCHEMA
    from bridge_shell.cli.options import state_schema

    settings = load_settings(write(tmp_path, GOOD))
    with pytest.raises(ConfigError) as raised:
        state_schema(settings, 'bridge"; DROP TABLE public.orders; --')
    [(where, why)] = raised.value.problems
    assert where == "--schema" and "is not a schema name" in why
    assert state_schema(settings, "audit_2") == "audit_2"
    assert state_schema(settings, None) == DEFAULT_STATE_SCHEMA


def test_the_new_group_protocol_refuses_the_settings_the_broker_owns(tmp_path: Path) -> None:
    consumer = {"group_id": "g", "group_protocol": "consumer",
                "routes": [{"topic": "t", "table": "public.t"}]}  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        load_settings(
            env_file=tmp_path / "none",
            kafka={"properties": {"session.timeout.ms": 6000}},
            consumer=consumer,
        )
    assert "session.timeout.ms" in str(raised.value) and "group.consumer" in str(raised.value)
    # Under the classic protocol the member sets its own session, as before.
    classic = {**consumer, "group_protocol": "classic"}
    loaded = load_settings(
        env_file=tmp_path / "none",
        kafka={"properties": {"session.timeout.ms": 6000}},
        consumer=classic,
    )
    assert loaded.require_consumer().group_protocol == "classic"


def test_kafka_secrets_never_show_in_a_repr_but_reach_the_client(tmp_path: Path) -> None:
    settings = load_settings(
        env_file=tmp_path / "none",
        kafka={
            "properties": {
                "sasl.password": "hunter2-kafka",
                "sasl.username": "producer",
                "sasl.jaas.config": "x password=hunter2-jaas;",
                "ssl.key.password": "hunter2-key",
            }
        },
        postgres={"dsn": "postgresql://u:hunter2-pg@127.0.0.1:5432/db"},
    )
    shown = repr(settings) + str(settings) + repr(settings.kafka)
    assert "hunter2" not in shown, "a secret shows in the settings' repr"
    assert "producer" in repr(settings.kafka)  # not a secret: still shown
    config = settings.kafka.client_config()
    assert config["sasl.password"] == "hunter2-kafka"
    assert config["ssl.key.password"] == "hunter2-key"


def test_secrets_can_come_from_files_named_in_the_settings(tmp_path: Path) -> None:
    (tmp_path / "kafka-password").write_text("from-a-file\n")
    (tmp_path / "dsn").write_text("postgresql://u:pw@127.0.0.1:5432/db\n")
    settings = load_settings(
        env_file=tmp_path / "none",
        kafka={"properties": {"sasl.password": f"${{file:{tmp_path / 'kafka-password'}}}"}},
        postgres={"dsn": f"${{file:{tmp_path / 'dsn'}}}"},
    )
    assert settings.kafka.client_config()["sasl.password"] == "from-a-file"
    assert settings.postgres.dsn.get_secret_value() == "postgresql://u:pw@127.0.0.1:5432/db"
    with pytest.raises(ConfigError) as raised:
        missing = {"properties": {"sasl.password": "${file:/nonexistent/pw}"}}
        load_settings(env_file=tmp_path / "none", kafka=missing)
    assert "kafka.properties" in str(raised.value) and "/nonexistent/pw" in str(raised.value)


@pytest.mark.parametrize(
    ("consumer", "field"),
    [
        ({"routes": [{"topic": "t", "table": "public.orders; DROP TABLE x"}]}, "table"),
        ({"routes": [{"topic": "t", "table": 'a."b'}]}, "table"),  # a quote left open
        ({"routes": [{"topic": "t", "table": '"a"b'}]}, "table"),  # text after a quoted name
        ({"routes": [{"topic": "t", "table": 'a.b."c"'}]}, "table"),  # three parts
        ({"routes": [{"topic": "t", "table": "t", "key_columns": ["id) --"]}]}, "key_columns"),
        ({"routes": [{"topic": "t", "table": "t"}], "state_schema": "s; --"}, "state_schema"),
    ],
)
def test_names_that_reach_sql_must_be_plain_or_quoted_identifiers(
    tmp_path: Path, consumer: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(env_file=tmp_path / "none", consumer={"group_id": "g", **consumer})
    assert any(field in where for where, _ in raised.value.problems), raised.value.problems


def test_the_schema_registry_takes_a_url_and_its_clients_settings_with_secrets_masked() -> None:
    settings = load_settings(
        schema_registry={
            "url": "https://registry.example:8081/apis/ccompat/v7/",
            "properties": {"basic.auth.user.info": "bridge:s3cret",
                           "ssl.ca.location": certifi.where()},
        }
    )  # fmt: skip
    assert settings.schema_registry is not None
    config = settings.schema_registry.client_config()
    assert config["url"] == "https://registry.example:8081/apis/ccompat/v7"
    assert config["basic.auth.user.info"] == "bridge:s3cret"
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("registry", "path"),
    [
        ({"url": "registry:8081"}, "schema_registry.url"),
        (
            {"url": "http://r:1", "properties": {"url": "http://other"}},
            "schema_registry.properties",
        ),
        ({"url": "http://r:1", "extra": 1}, "schema_registry.extra"),
        # What the registry's client would refuse when first built, refused at start instead.
        ({"url": "http://r:1", "properties": {"basic.auth.credentials.source": "SASL_INHERIT",
                                              "basic.auth.user.info": "u:p"}},
         "schema_registry.properties"),
        ({"url": "http://r:1", "properties": {"basic.auth.credentials.source": "USER_INFO"}},
         "schema_registry.properties"),
        ({"url": "http://r:1", "properties": {"max.retries": "three"}},
         "schema_registry.properties"),
        ({"url": "http://r:1", "properties": {"no.such.setting": "1"}},
         "schema_registry.properties"),
        ({"url": "https://r:1", "properties": {"ssl.ca.location": "/no/such/ca.pem"}},
         "schema_registry.properties"),
    ],
)  # fmt: skip
def test_a_bad_schema_registry_setting_is_refused_naming_it(
    registry: dict[str, object], path: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(schema_registry=registry)
    assert path in str(refused.value)


def test_a_kafka_connect_converters_registry_settings_are_taken_as_the_client_takes_them() -> None:
    """Connect's `basic.auth.credentials.source: USER_INFO` is what `basic.auth.user.info`
    means to confluent-kafka's client, which refuses the key itself; its numbers come as text."""
    settings = load_settings(
        schema_registry={
            "url": "http://r:1",
            "properties": {"basic.auth.credentials.source": "USER_INFO",
                           "basic.auth.user.info": "reader:pw", "max.retries": "2"},
        }
    )  # fmt: skip
    assert settings.schema_registry is not None
    assert settings.schema_registry.client_config() == {
        "url": "http://r:1", "basic.auth.user.info": "reader:pw", "max.retries": 2,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("route_epochs", "members", "whole", "elects"),
    [
        (None, "one", True, False),  # the default: whole, elected at the first epoch
        ("whole", "one", True, True),  # said: elected from the start
        ("whole", "all", True, False),  # every member reads them: no election
        ("per-partition", "one", False, False),  # the way back: no manifest, no election
    ],
)
def test_routes_are_whole_by_default_and_elect_at_start_only_when_they_say_so(
    tmp_path: Path, route_epochs: str | None, members: str, whole: bool, elects: bool
) -> None:
    said = "" if route_epochs is None else f"\n      epochs: {route_epochs}"
    path = write(tmp_path, GOOD.replace('mode: "insert"', f'mode: "insert"{said}')
                 + f"  epochs_members: {members}\n")  # fmt: skip
    consumer = load_settings(path).require_consumer()
    assert consumer.whole_topic("orders") is whole
    assert consumer.whole_topic("customers")  # names nothing: whole
    assert consumer.elects_at_start is elects
    assert ("bridge-epochs" in consumer.subscription()) is True
