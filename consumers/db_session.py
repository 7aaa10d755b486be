"""The member's one PostgreSQL session, and how it comes back after a lost connection.

Reconnecting is bounded: a growing delay, a fixed number of attempts, then `DatabaseUnavailable`,
which ends the service with a non-zero exit for its supervisor. What a lost connection leaves
behind is not this module's concern: positions are never taken from memory afterwards, the
offsets table is read again (`consumers.leases`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_when_event_set,
    wait_exponential,
)

from bridge.errors import BridgeError
from consumers.offsets import application_name

log = logging.getLogger("bridge.consumer")

RECONNECT_ATTEMPTS = 60  # about five minutes at the longest delay, then give up loudly
_FIRST_DELAY_S = 0.2
_LONGEST_DELAY_S = 5.0
T = TypeVar("T")


class DatabaseUnavailable(BridgeError):
    """PostgreSQL stayed unreachable through every reconnection attempt, or while stopping."""

    def __init__(self, attempts: int, last_error: str) -> None:
        self.attempts = attempts
        self.last_error = last_error
        super().__init__(f"database unreachable after {attempts} attempt(s): {last_error}")


class DatabaseSession:
    def __init__(
        self,
        dsn: str,
        *,
        group_id: str,
        session_timeout_ms: int,
        stop: threading.Event,
        on_reconnect: Callable[[], None] = lambda: None,
    ) -> None:
        self._dsn = dsn
        self._group = group_id
        self._timeout_ms = session_timeout_ms
        self._stop = stop
        self._on_reconnect = on_reconnect
        self._conn: psycopg.Connection[Any] | None = None

    def connect(self) -> psycopg.Connection[Any]:
        # A member paused in the middle of a batch (GC, SIGSTOP, a frozen VM) holds the row locks
        # of its offsets; the member that takes its partitions over would wait on them forever.
        # PostgreSQL ends such a session after the timeout, which frees the locks; the paused
        # member finds its connection gone when it wakes and its batch rolled back.
        timeout = self._timeout_ms
        self._conn = psycopg.connect(
            self._dsn,
            autocommit=True,
            application_name=application_name(self._group),
            options=f"-c idle_in_transaction_session_timeout={timeout}"
            f" -c statement_timeout={timeout}",
        )
        return self._conn

    def connection(self) -> psycopg.Connection[Any]:
        """The open connection, or a new one if it was lost."""
        if self._conn is None or self._conn.closed:
            return self.reconnect()
        return self._conn

    def open_connection(self) -> psycopg.Connection[Any] | None:
        """The connection if it is open; never reconnects."""
        return self._conn if self._conn is not None and not self._conn.closed else None

    def reconnect(self) -> psycopg.Connection[Any]:
        """Drop the connection and open a new one, waiting longer after each failure."""
        self.close()
        retrying = Retrying(
            retry=retry_if_exception_type(psycopg.OperationalError),
            stop=stop_after_attempt(RECONNECT_ATTEMPTS) | stop_when_event_set(self._stop),
            wait=wait_exponential(multiplier=_FIRST_DELAY_S, max=_LONGEST_DELAY_S),
            before_sleep=_log_attempt,
        )
        try:
            conn = retrying(self.connect)
        except RetryError as exc:
            attempt = exc.last_attempt
            raise DatabaseUnavailable(attempt.attempt_number, str(attempt.exception())) from None
        log.info("database reconnected after %d attempt(s)", retrying.statistics["attempt_number"])
        self._on_reconnect()
        return conn

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run `work`; if the connection drops, reconnect (itself bounded) and run it once more.
        A second failure propagates: the service exits and its supervisor restarts it."""
        try:
            return work(self.connection())
        except psycopg.OperationalError as exc:
            log.error("database connection lost: %s", exc)
            return work(self.reconnect())

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _log_attempt(state: RetryCallState) -> None:
    delay = state.next_action.sleep if state.next_action else 0.0
    error = state.outcome.exception() if state.outcome else None
    log.warning("database unreachable (%s); retrying in %.1fs", error, delay)
