"""The member's one PostgreSQL session: every wait bounded, and how it comes back.

Three ways the database can fail a member, told apart because each wants its own answer:

- **lost**: the connection dropped, or the server went silent past `reply_timeout_s` (through
  a proxy or a dead NAT a silent peer is never noticed by TCP; only the client's own clock
  can). Reconnect, with growing delays and a bounded number of attempts, then
  `DatabaseUnavailable`, which ends the service with a non-zero exit for its supervisor.
- **refusing**: the server answers but will not write: read-only (SQLSTATE class 25, e.g. a
  replica after a failover), out of resources (class 53: disk full, too many connections),
  a statement timeout (57014), a serialization failure or deadlock (class 40). Nothing was
  written; wait longer each time (`refusal_backoff`) and try again, saying so on `/readyz`.
  Too many connections shows when a connection opens, where libpq gives the server's text
  but no SQLSTATE; reconnecting then waits as long as a refused write would.
- anything else is a bug, and propagates.

What a lost connection leaves behind is not this module's concern: positions are never taken
from memory afterwards, the offsets table is read again (`consumers.membership.leases`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg.abc import PQGen
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    stop_when_event_set,
    wait_exponential,
)

from bridge.errors import BridgeError
from bridge.private_apis import psycopg_wait_timeout
from consumers.backoff import HoldBackoff
from consumers.database.offsets import application_name
from consumers.database.pg_errors import REFUSALS

log = logging.getLogger("bridge.consumer")

RECONNECT_ATTEMPTS = 60  # about 5 min for a lost link, longer while refused (30 s waits)
CONNECT_TIMEOUT_S = 10  # libpq's bound on opening a connection, handshake included
_FIRST_DELAY_S = 0.2
_LONGEST_DELAY_S = 5.0
_REFUSED_FIRST_DELAY_S = 0.5
_REFUSED_LONGEST_DELAY_S = 30.0
_RUN_BUDGET_S = 300.0  # how long a claim or a read keeps trying through refusals
T = TypeVar("T")
RV = TypeVar("RV")


class DatabaseUnavailable(BridgeError):
    """PostgreSQL stayed unreachable through every reconnection attempt, or while stopping."""

    def __init__(self, attempts: int, last_error: str) -> None:
        self.attempts = attempts
        self.last_error = last_error
        super().__init__(f"database unreachable after {attempts} attempt(s): {last_error}")


class Refusal(NamedTuple):
    """The server answered and refused: nothing of the transaction was written."""

    sqlstate: str
    message: str


# libpq hands over no SQLSTATE for an error while a connection starts, only the server's text
# (in English unless the server's lc_messages says otherwise): the refusals it may carry.
_STARTUP_REFUSALS = (
    ("too many connections", "53300"),  # for the role, or for the database
    ("too many clients already", "53300"),
    ("remaining connection slots are reserved", "53300"),
)


def refusal_of(exc: BaseException) -> Refusal | None:
    """The refusal `exc` stands for, or None (a lost connection, or a bug)."""
    if not isinstance(exc, psycopg.Error):
        return None
    if exc.sqlstate is None:
        return _startup_refusal(exc)
    if isinstance(exc, REFUSALS):
        return Refusal(exc.sqlstate, exc.diag.message_primary or str(exc))
    return None


def _startup_refusal(exc: psycopg.Error) -> Refusal | None:
    if not isinstance(exc, psycopg.OperationalError):
        return None
    text = str(exc)
    for needle, state in _STARTUP_REFUSALS:
        if needle in text:
            fatal = text[text.find("FATAL:") :].removeprefix("FATAL:").strip() or text
            return Refusal(state, fatal.splitlines()[0])
    return None


def is_lost(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.OperationalError) and refusal_of(exc) is None


def refusal_backoff() -> HoldBackoff:
    """While the database refuses writes: 0.5 s, doubling, to at most 30 s between tries."""
    return HoldBackoff(
        what="database refuses writes",
        consequence="nothing was written",
        wait=_wait_refused,
        recovered="the database accepts writes again",
    )


_WAIT_TIMEOUT = psycopg_wait_timeout()


class _BoundedConnection(psycopg.Connection[Any]):
    """A connection whose every wait for the server ends after `reply_timeout_s`."""

    reply_timeout_s = 60.0

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        try:
            return super().wait(gen, interval, self.reply_timeout_s if timeout is None else timeout)
        except _WAIT_TIMEOUT:
            raise psycopg.OperationalError(
                f"no answer from PostgreSQL in {self.reply_timeout_s:.0f}s"
            ) from None


class DatabaseSession:
    def __init__(
        self,
        dsn: str,
        *,
        group_id: str,
        session_timeout_ms: int,
        stop: threading.Event,
        on_reconnect: Callable[[], None] = lambda: None,
        on_refusal: Callable[[Refusal], None] = lambda refusal: None,
    ) -> None:
        self._dsn = dsn
        self._group = group_id
        self._timeout_ms = session_timeout_ms
        self._stop = stop
        self._on_reconnect = on_reconnect
        self._on_refusal = on_refusal
        self._conn: _BoundedConnection | None = None
        self.connecting_since: float | None = None  # monotonic, while reconnecting
        self.refused_by: Refusal | None = None  # what the last refused connection attempt said

    @property
    def reply_timeout_s(self) -> float:
        """The server ends a statement after the session timeout; silence for twice as long
        is a dead connection."""
        return 2 * self._timeout_ms / 1000

    def connect(self) -> psycopg.Connection[Any]:
        # A member paused in the middle of a batch (GC, SIGSTOP, a frozen VM) holds the row locks
        # of its offsets; the member that takes its partitions over would wait on them forever.
        # PostgreSQL ends such a session after the timeout, which frees the locks; the paused
        # member finds its connection gone when it wakes and its batch rolled back.
        timeout = self._timeout_ms
        try:
            conn = _BoundedConnection.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name=application_name(self._group),
                options=f"-c idle_in_transaction_session_timeout={timeout}"
                f" -c statement_timeout={timeout}",
            )
        except psycopg.OperationalError as exc:
            refusal = refusal_of(exc)
            if refusal is not None:  # too many connections, and the like
                self._on_refusal(refusal)
            self.refused_by = refusal
            raise
        self.refused_by = None
        conn.reply_timeout_s = self.reply_timeout_s
        self._conn = conn
        return conn

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
        self.connecting_since = time.monotonic()
        retrying = Retrying(
            retry=retry_if_exception_type(psycopg.OperationalError),
            stop=stop_after_attempt(RECONNECT_ATTEMPTS) | stop_when_event_set(self._stop),
            wait=_reconnect_wait,
            before_sleep=_log_attempt,
        )
        try:
            conn = retrying(self.connect)
        except RetryError as exc:
            attempt = exc.last_attempt
            raise DatabaseUnavailable(attempt.attempt_number, str(attempt.exception())) from None
        finally:
            self.connecting_since = None
        log.info("database reconnected after %d attempt(s)", retrying.statistics["attempt_number"])
        self._on_reconnect()
        return conn

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run `work` (a claim, a read); through a lost connection or a refusal, try again with
        growing delays for at most five minutes, then let the error end the service."""

        def attempt() -> T:
            try:
                return work(self.connection())
            except psycopg.Error as exc:
                refusal = refusal_of(exc)
                if refusal is not None:
                    self._on_refusal(refusal)
                elif is_lost(exc):
                    log.error("database connection lost: %s", exc)
                    self.close()  # the next attempt reconnects
                raise

        return Retrying(
            retry=retry_if_exception(lambda e: is_lost(e) or refusal_of(e) is not None),
            stop=stop_after_delay(_RUN_BUDGET_S) | stop_when_event_set(self._stop),
            wait=wait_exponential(multiplier=_FIRST_DELAY_S, max=_REFUSED_LONGEST_DELAY_S),
            before_sleep=_log_attempt,
            reraise=True,
        )(attempt)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def reasons(self) -> list[str]:
        if self.connecting_since is None:
            return []
        waited = time.monotonic() - self.connecting_since
        if self.refused_by is not None:
            refusal = self.refused_by
            return [
                f"database refuses new connections for {waited:.0f}s "
                f"({refusal.sqlstate}: {refusal.message})"
            ]
        return [f"database unreachable for {waited:.0f}s"]


def at_start(
    work: Callable[[], T],
    *,
    stop: threading.Event,
    waiting: Callable[[str], None] | None = None,
) -> T:
    """`work` (creating the state tables, reading the target tables) against a database that
    may be starting, restarting or refusing: retried with growing delays for at most
    `_RUN_BUDGET_S`, then `DatabaseUnavailable`, one clear line for the supervisor's log rather
    than a traceback on the first refused connection. `waiting(why)` is told of each failed try
    (for /readyz)."""

    def before_sleep(state: RetryCallState) -> None:
        _log_attempt(state)
        if waiting is not None:
            error = state.outcome.exception() if state.outcome else None
            waiting(f"the database is unreachable or refusing ({error})")

    def transient(exc: BaseException) -> bool:
        cause = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's error
        return is_lost(cause) or refusal_of(cause) is not None

    retrying = Retrying(
        retry=retry_if_exception(transient),
        stop=stop_after_delay(_RUN_BUDGET_S) | stop_when_event_set(stop),
        wait=wait_exponential(multiplier=_REFUSED_FIRST_DELAY_S, max=_LONGEST_DELAY_S),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        return retrying(work)
    except Exception as exc:
        if not transient(exc):
            raise
        cause = getattr(exc, "orig", None) or exc
        raise DatabaseUnavailable(retrying.statistics["attempt_number"], str(cause)) from None


_wait_lost = wait_exponential(multiplier=_FIRST_DELAY_S, max=_LONGEST_DELAY_S)
_wait_refused = wait_exponential(multiplier=_REFUSED_FIRST_DELAY_S, max=_REFUSED_LONGEST_DELAY_S)


def _reconnect_wait(state: RetryCallState) -> float:
    """A server that refuses connections (too many) is given longer between tries than one
    that cannot be reached: each try takes a connection slot from someone else."""
    error = state.outcome.exception() if state.outcome else None
    refused = error is not None and refusal_of(error) is not None
    return (_wait_refused if refused else _wait_lost)(state)


def _log_attempt(state: RetryCallState) -> None:
    delay = state.next_action.sleep if state.next_action else 0.0
    error = state.outcome.exception() if state.outcome else None
    log.warning("database unreachable or refusing (%s); retrying in %.1fs", error, delay)
