"""A refusal of credentials or TLS is told apart from other client errors, with what to check."""

from __future__ import annotations

from confluent_kafka import KafkaError

from bridge.kafka_refusal import RefusalWatch, refusal


def test_a_refused_login_or_handshake_names_the_settings_to_check() -> None:
    login = refusal(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication failed"))
    assert login is not None and login.startswith("SASL authentication failed; check")
    assert "sasl.username, sasl.password and sasl.mechanism" in login
    handshake = refusal(KafkaError(KafkaError._SSL, "certificate verify failed"))
    assert handshake is not None and "ssl.ca.location" in handshake
    assert refusal(KafkaError(KafkaError._TRANSPORT, "connection reset")) is None


def test_the_watch_keeps_the_last_refusal_and_ignores_other_errors() -> None:
    watch = RefusalWatch()
    watch(KafkaError(KafkaError._TRANSPORT, "connection reset"))
    assert watch.refused is None
    watch(KafkaError(KafkaError._AUTHENTICATION, "wrong password"))
    watch(KafkaError(KafkaError._ALL_BROKERS_DOWN, "all down"))
    assert watch.refused is not None and watch.refused.startswith("wrong password")
