"""librdkafka's log lines of a short-lived client (the tools', the admin requests'): kept, not
printed, and the last one named as the cause when the client's request fails.

Without a logger, librdkafka prints each line raw on stderr: a tool that could not reach Kafka
printed a `%3|...|FAIL|...` line every 50 ms of its wait above its own error, which said only
"Broker transport failure". The lines that say which address refused or timed out, or which
check of the TLS handshake failed, now come to this collector (librdkafka hands them over in the
client's polls), and the error carries the last of them.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from typing import Protocol

# "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:1/bootstrap]: " before the text itself.
_ORIGIN = re.compile(r"^\S+ \[rdkafka#[^\]]*\] \[thrd:[^\]]*\]: ")
_KEPT = 20


class _Polled(Protocol):
    def poll(self, timeout: float = ..., /) -> object: ...


class ClientLog(logging.Handler):
    """Give `logger` as the client's `logger` setting; `cause(client)` after a failure."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)  # librdkafka's warnings and errors
        self._lines: deque[str] = deque(maxlen=_KEPT)
        # Outside the logging hierarchy: no handler of the application's prints these lines.
        self.logger = logging.Logger("bridge.rdkafka.client")
        self.logger.addHandler(self)
        self.logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        self._lines.append(_ORIGIN.sub("", record.getMessage()))

    def last(self) -> str | None:
        return self._lines[-1] if self._lines else None

    def cause(self, client: _Polled) -> str:
        """` (librdkafka: <its last warning or error>)`, or nothing when it said nothing."""
        client.poll(0)  # hands over the lines queued since the client's last poll
        last = self.last()
        return f" (librdkafka: {last})" if last else ""
