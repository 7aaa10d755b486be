"""Credentials or TLS the brokers refuse, told apart from a network that does not answer.

librdkafka reports a refused login or handshake only to the client's error callback; the call
the client blocks in meanwhile (a transaction's start, an admin request) ends in a bare
timeout. Every client of the project listens with `RefusalWatch` and names the refusal, with
the settings to check, in the error it raises.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

# What to check, by the error librdkafka reports for a refused connection.
_HINTS = {
    KafkaError._AUTHENTICATION: (
        "check kafka.properties sasl.username, sasl.password and sasl.mechanism"
    ),
    KafkaError._SSL: (
        "check kafka.properties ssl.ca.location (the CA that signed the brokers' certificates) "
        "and security.protocol"
    ),
}


def refusal(error: KafkaError) -> str | None:
    """The error's text and what to check, when it is a refusal of credentials or TLS."""
    hint = _HINTS.get(error.code())
    return None if hint is None else f"{error.str()}; {hint}"


class RefusalWatch:
    """An `error_cb` that keeps the last refusal of credentials or TLS. It runs inside the
    client's poll: whoever reads `refused` polls first (or is inside a poll)."""

    def __init__(self) -> None:
        self.refused: str | None = None

    def __call__(self, error: KafkaError) -> None:
        why = refusal(error)
        if why is not None:
            self.refused = why
