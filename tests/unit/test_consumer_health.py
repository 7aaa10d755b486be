"""The pure logic behind the consumer's liveness: when Kafka counts as unreachable or refusing,
and how long a database that refuses writes is left alone."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError

from consumers.database.db_session import refusal_backoff
from consumers.membership.kafka_health import (
    KafkaAccessDenied,
    KafkaHealth,
    KafkaRefused,
    KafkaUnavailable,
)

UP, DOWN = {"b1": "UP", "b2": "DOWN"}, {"b1": "DOWN", "b2": "CONNECT"}


def health(bound_s: float = 3600, **options: str) -> KafkaHealth:
    return KafkaHealth(bootstrap_servers="k1:9092", unavailable_after_s=bound_s, **options)


def test_one_broker_up_is_enough_and_none_up_is_reported_then_raised_past_the_bound() -> None:
    kafka = health()
    kafka.brokers(UP)
    kafka.check()
    assert kafka.reasons() == []
    kafka.brokers(DOWN)
    kafka.check()  # within the bound: said on /readyz, not raised
    assert kafka.reasons()[0].startswith("Kafka unreachable for ")

    kafka = health(bound_s=-1)
    kafka.brokers(UP)
    kafka.brokers(DOWN)
    with pytest.raises(KafkaUnavailable, match="k1:9092"):
        kafka.check()


def test_a_broker_back_up_clears_the_outage() -> None:
    kafka = health(bound_s=-1)
    kafka.brokers(DOWN)
    kafka.brokers(UP)
    kafka.check()
    assert kafka.reasons() == []


def test_refused_credentials_at_start_raise_at_once_naming_the_principal() -> None:
    kafka = health(principal="bridge-consumer")
    kafka.client_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication failed"))
    with pytest.raises(KafkaRefused, match=r"User:bridge-consumer.*sasl\.username"):
        kafka.check()


def test_refused_credentials_after_a_broker_was_up_are_an_outage_not_a_refusal() -> None:
    kafka = health()
    kafka.brokers(UP)
    kafka.client_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication failed"))
    kafka.check()  # it worked before: a rotation in progress rides the outage bound
    kafka.brokers(DOWN)
    assert "SASL authentication failed" in kafka.reasons()[0]


def test_a_plaintext_client_never_up_is_told_about_security_protocol() -> None:
    kafka = health()
    kafka.brokers(DOWN)
    assert "security.protocol" in kafka.reasons()[0]
    kafka = health(security_protocol="SASL_SSL")
    kafka.brokers(DOWN)
    (reason,) = kafka.reasons()
    assert "security.protocol" not in reason


def test_an_acl_refusal_names_the_right_to_grant() -> None:
    kafka = health(principal="c")
    with pytest.raises(KafkaAccessDenied, match="Read on group g-1"):
        kafka.denied(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), group="g-1", topic=None)
    with pytest.raises(KafkaAccessDenied, match="Read and Describe on topic orders"):
        kafka.denied(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), group="g", topic="orders")
    kafka.denied(KafkaError(KafkaError._TRANSPORT), group="g", topic="orders")  # not an ACL


def test_refused_writes_wait_twice_as_long_each_time_up_to_a_bound() -> None:
    backoff = refusal_backoff()
    refusal = "25006: cannot execute INSERT in a read-only transaction"
    waits = []
    for _ in range(10):
        before = time.monotonic()
        backoff.failed(refusal)
        waits.append(round(backoff.retry_at - before, 1))
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(waits) == 30.0 and waits[-1] == 30.0
    (reason,) = backoff.reasons()
    assert "database refuses writes" in reason and "25006" in reason


def test_refused_writes_cleared_start_again_from_the_first_wait() -> None:
    backoff = refusal_backoff()
    refusal = "53100: could not extend file: No space left on device"
    for _ in range(3):
        backoff.failed(refusal)
    backoff.cleared()
    assert backoff.reasons() == [] and backoff.retry_at == 0.0
    before = time.monotonic()
    backoff.failed(refusal)
    assert round(backoff.retry_at - before, 1) == 0.5
