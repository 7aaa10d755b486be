"""Routes by topic pattern, without I/O: which patterns are taken, which routes could read one
topic (each pair named with a topic both would read), and the table a topic's records go to."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.errors import ConfigError
from bridge.settings import load_settings
from bridge.topic_patterns import common_topic, matches, subscription, table_of


def _settings(*routes: dict[str, Any]) -> Any:
    return load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:9"},
        postgres={"dsn": "postgresql://u@127.0.0.1/db"},
        consumer={"group_id": "g", "routes": list(routes)},
    )


def test_two_patterns_that_share_a_topic_name_are_refused_naming_one() -> None:
    with pytest.raises(ConfigError) as refused:
        _settings({"topic_pattern": "orders-.*", "table": "public.${topic}"},
                  {"topic_pattern": "[a-z].*-eu", "table": "public.eu"})  # fmt: skip
    ((path, message),) = refused.value.problems
    assert path == "consumer.routes"
    assert "routes 0 (topic_pattern 'orders-.*') and 1 (topic_pattern '[a-z].*-eu')" in message
    assert "could both read topic 'orders-eu'" in message


def test_a_named_topic_a_pattern_matches_is_refused() -> None:
    with pytest.raises(ConfigError, match="could both read topic 'pay-7'"):
        _settings({"topic": "pay-7", "table": "public.p"},
                  {"topic_pattern": r"pay-\d+", "table": "public.${topic}"})  # fmt: skip


def test_patterns_apart_and_names_apart_are_taken() -> None:
    settings = _settings(
        {"topic_pattern": "orders-.*", "table": "public.${topic}"},
        {"topic_pattern": r"pay-\d+", "table": "ledger.${topic}_raw"},
        {"topic": "audit", "table": "public.audit"},
        # Apart only because '+' is no character of a topic name.
        {"topic_pattern": r"a\+b", "table": "public.x"},
        {"topic_pattern": "a.c", "table": "public.y"},
    )
    consumer = settings.require_consumer()
    assert consumer.subscription() == [
        "^(orders-.*)$",
        r"^(pay-\d+)$",
        "audit",
        r"^(a\+b)$",
        "^(a.c)$",
        "bridge-epochs",  # the epoch manifest: whole epochs are the routes' default
    ]
    index, route = consumer.route_for("pay-42")
    assert (index, route.topic, route.table, route.topic_pattern) == (
        1, "pay-42", "ledger.pay_42_raw", None
    )  # fmt: skip
    assert consumer.route_for("pay-x") is None  # matches no route: never read
    assert consumer.route_for("xorders-1") is None  # a pattern matches whole names


def test_a_pattern_that_matches_the_epoch_manifest_never_routes_it() -> None:
    """Whole epochs by default: the group reads the manifest as its own, never as a table's."""
    whole = _settings({"topic_pattern": "bridge-.*", "table": "public.${topic}"})
    assert whole.require_consumer().route_for("bridge-epochs") is None
    assert whole.require_consumer().route_for("bridge-orders") is not None
    apart = _settings(
        {"topic_pattern": "bridge-.*", "table": "public.${topic}", "epochs": "per-partition"}
    )
    index, route = apart.require_consumer().route_for("bridge-epochs") or (None, None)
    assert index == 0 and route is not None and route.table == "public.bridge_epochs"


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ({"topic_pattern": "(?P<x>a)", "table": "t"}, "librdkafka's regex engine"),
        ({"topic_pattern": r"\Aorders", "table": "t"}, "librdkafka's regex engine"),
        ({"topic_pattern": "(?:a)b", "table": "t"}, "librdkafka's regex engine"),
        ({"topic_pattern": "[", "table": "t"}, "is not a regular expression"),
        ({"topic_pattern": ".*", "table": "t"}, "a name of Kafka's internal topics"),
        ({"topic_pattern": r"_\w+", "table": "t"}, "matches '__"),
        ({"topic": "a", "topic_pattern": "b", "table": "t"}, "topic or topic_pattern, not both"),
        ({"table": "t"}, "topic or topic_pattern"),
        ({"topic": "a", "table": "public.${topic}"}, "needs topic_pattern"),
        ({"topic_pattern": "a.*", "table": "public.${topic}-x"}, "is not `table`"),
    ],
)
def test_patterns_and_templates_refused_at_start(route: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _settings(route)
    assert any(message in m for _, m in refused.value.problems), refused.value.problems


def test_a_topic_is_made_a_table_name_by_one_rule() -> None:
    assert table_of("public.${topic}", "Orders.EU-1") == "public.orders_eu_1"
    assert table_of("${topic}_raw", "x") == "x_raw"
    assert table_of("public.${topic}", "t" * 249) == "public." + "t" * 63
    assert subscription("a|b") == "^(a|b)$" and matches("a|b", "b") and not matches("a", "ab")
    assert common_topic("x.*", "y.*") is None
