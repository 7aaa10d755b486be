"""Whether this member can reach Kafka at all, from librdkafka's own view of its brokers.

librdkafka reconnects by itself and never gives up, which is right for a blip and wrong for a
cluster that is gone: the member would wait forever, alive and silent. Its statistics say each
broker's connection state; when none is up for longer than the configured bound, the service
ends with `KafkaUnavailable` (a non-zero exit for its supervisor), and says so on `/readyz`
meanwhile.

Some failures are not the network's, and waiting does not mend them: credentials the brokers
refuse, a certificate the client cannot verify, a right the ACLs do not give. Refused before
any broker was ever up, credentials or TLS are a configuration error and end the service at
once, as a Java client's `SaslAuthenticationException` would; refused later (a password
rotated under a running member), they count as unavailability, with the reason. A denied
right ends the service with the right to grant.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError

from bridge.errors import BridgeError
from bridge.kafka_refusal import refusal

log = logging.getLogger("bridge.consumer")


class KafkaUnavailable(BridgeError):
    """Every broker stayed unreachable past `consumer.kafka_unavailable_timeout_ms`."""

    def __init__(self, seconds: float, bootstrap_servers: str, last_error: str | None) -> None:
        self.seconds = seconds
        super().__init__(
            f"Kafka unreachable for {seconds:.0f}s (bootstrap servers {bootstrap_servers}): "
            "no broker is up; giving up (consumer.kafka_unavailable_timeout_ms)"
            + (f"; last error: {last_error}" if last_error else "")
        )


class KafkaRefused(BridgeError):
    """The brokers refused this client's credentials or TLS at start-up."""


class KafkaAccessDenied(BridgeError):
    """The ACLs do not give this member's principal a right it needs."""


# A client that speaks PLAINTEXT to a TLS or SASL listener is hung up on before any answer:
# librdkafka reports no error of its own, only that the brokers are down.
_PLAINTEXT_HINT = (
    "the brokers closed every connection: if their listener uses TLS or SASL, set "
    "kafka.properties security.protocol (now PLAINTEXT) and its settings"
)
_DENIALS = {
    KafkaError.GROUP_AUTHORIZATION_FAILED: "Read on group {group}",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "Read and Describe on topic {topic}",
}


class KafkaHealth:
    def __init__(
        self,
        *,
        bootstrap_servers: str,
        unavailable_after_s: float,
        security_protocol: str = "plaintext",
        principal: str | None = None,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._bound = unavailable_after_s
        self._plaintext = security_protocol.lower() == "plaintext"
        self._principal = f"User:{principal}" if principal else "this member's principal"
        self._down_since: float | None = None  # monotonic: since when no broker is up
        self._ever_up = False
        self._last_error: str | None = None
        self._refused: KafkaRefused | None = None

    def brokers(self, states: dict[str, str]) -> None:
        """Each broker's connection state (UP, DOWN, CONNECT, ...), from the statistics."""
        if any(state == "UP" for state in states.values()):
            if self._down_since is not None:
                log.info("Kafka reachable again")
            self._down_since = None
            self._ever_up = True
            self._last_error = None
        elif self._down_since is None:
            self._down_since = time.monotonic()
            log.error("Kafka unreachable: no broker is up (%s)", states)

    def client_error(self, error: KafkaError) -> None:
        """librdkafka's error callback (it runs inside a poll, on the polling thread)."""
        code = error.code()
        if code == KafkaError._ALL_BROKERS_DOWN:
            return  # the statistics say so, broker by broker
        refused = refusal(error)
        if refused is not None:
            self._last_error = refused
            log.error("Kafka refused the connection: %s", self._last_error)
            if not self._ever_up:
                self._refused = KafkaRefused(
                    f"Kafka ({self._bootstrap}) refused {self._principal}: {self._last_error}"
                )
            return
        self._last_error = error.str()
        log.warning("kafka client error: %s", self._last_error)

    def denied(self, error: KafkaError, *, group: str, topic: str | None) -> None:
        """Raise KafkaAccessDenied if `error` is an ACL's refusal; else return."""
        right = _DENIALS.get(error.code())
        if right is not None:
            raise KafkaAccessDenied(
                f"Kafka denies {self._principal} {right.format(group=group, topic=topic)}, "
                f"which this consumer needs ({error.str()}): grant it (README, Security)"
            )

    def check(self) -> None:
        """Raise once no broker has been up for longer than the bound, or at once for
        credentials or TLS refused at start-up."""
        if self._refused is not None:
            raise self._refused
        if self._down_since is not None and time.monotonic() - self._down_since > self._bound:
            raise KafkaUnavailable(
                time.monotonic() - self._down_since, self._bootstrap, self._why_down()
            )

    def _why_down(self) -> str | None:
        if self._last_error is None and self._plaintext and not self._ever_up:
            return _PLAINTEXT_HINT
        return self._last_error

    def reasons(self) -> list[str]:
        if self._down_since is None:
            return []
        why = self._why_down()
        return [
            f"Kafka unreachable for {time.monotonic() - self._down_since:.0f}s"
            + (f": {why}" if why else "")
        ]
