"""Whether this member can reach Kafka at all, from librdkafka's own view of its brokers.

librdkafka reconnects by itself and never gives up, which is right for a blip and wrong for a
cluster that is gone: the member would wait forever, alive and silent. Its statistics say each
broker's connection state; when none is up for longer than the configured bound, the service
ends with `KafkaUnavailable` (a non-zero exit for its supervisor), and says so on `/readyz`
meanwhile.
"""

from __future__ import annotations

import logging
import time

from bridge.errors import BridgeError

log = logging.getLogger("bridge.consumer")


class KafkaUnavailable(BridgeError):
    """Every broker stayed unreachable past `consumer.kafka_unavailable_timeout_ms`."""

    def __init__(self, seconds: float, bootstrap_servers: str) -> None:
        self.seconds = seconds
        super().__init__(
            f"Kafka unreachable for {seconds:.0f}s (bootstrap servers {bootstrap_servers}): "
            "no broker is up; giving up (consumer.kafka_unavailable_timeout_ms)"
        )


class KafkaHealth:
    def __init__(self, *, bootstrap_servers: str, unavailable_after_s: float) -> None:
        self._bootstrap = bootstrap_servers
        self._bound = unavailable_after_s
        self._down_since: float | None = None  # monotonic: since when no broker is up

    def brokers(self, states: dict[str, str]) -> None:
        """Each broker's connection state (UP, DOWN, CONNECT, ...), from the statistics."""
        if any(state == "UP" for state in states.values()):
            if self._down_since is not None:
                log.info("Kafka reachable again")
            self._down_since = None
        elif self._down_since is None:
            self._down_since = time.monotonic()
            log.error("Kafka unreachable: no broker is up (%s)", states)

    def check(self) -> None:
        """Raise once no broker has been up for longer than the bound."""
        if self._down_since is not None and time.monotonic() - self._down_since > self._bound:
            raise KafkaUnavailable(time.monotonic() - self._down_since, self._bootstrap)

    def reasons(self) -> list[str]:
        if self._down_since is None:
            return []
        return [f"Kafka unreachable for {time.monotonic() - self._down_since:.0f}s"]
