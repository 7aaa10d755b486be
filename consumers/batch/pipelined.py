"""A batch's whole transaction sent as one message, its outcome read later.

Statement by statement, a batch waits on PostgreSQL seven times: BEGIN, the offset advance, a
savepoint, the start of the COPY and its end, the release, COMMIT. A simple-query message may
hold several statements, COPY FROM STDIN among them, and PostgreSQL runs them in order. So
`BEGIN; <strict offset advance>; COPY ... FROM STDIN; ...; COMMIT` goes as one message: the
sender waits once, for the first COPY to start, streams the rows, and goes on (consuming the
next batch) while PostgreSQL finishes the COPY and commits; `PipelinedTransaction.finish`
reads the outcome.

The rows of a COPY are best formatted ahead (`formatted`), while the batch before is still in
flight: then sending queues the whole text at once and returns without waiting for PostgreSQL
to read it (the socket's buffers take most of a batch, and `finish` sends what is left), and
PostgreSQL parses one batch while the service decodes the next. Formatted while sending, the
two took turns: PostgreSQL idled while the service decoded, and the service waited for
PostgreSQL to read each buffer.

Nothing is lost by sending before knowing: PostgreSQL stops at the first statement that fails
and skips the rest of the message, COMMIT included, so a refused batch leaves an aborted
transaction behind and nothing written. The strict advance refuses the batch when a lease no
longer holds. Whoever sent it rolls back and writes the batch again, statement by statement,
to learn which partition or record was refused.

This drives psycopg's libpq connection (`psycopg.pq`) directly: psycopg's own cursors take one
statement at a time. The connection must be idle, in autocommit mode, and used for nothing else
until `finish` returns.
"""

from __future__ import annotations

import select
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.abc import Buffer, Transformer
from psycopg.adapt import Transformer as Adapting
from psycopg.copy import Copy, Writer
from psycopg.pq.abc import PGconn, PGresult

from bridge.private_apis import PrivateApiMoved, psycopg_row_text_formatter
from consumers.decoding.rows import row_cursor
from consumers.tables.applier import Step

_COPY_IN = pq.ExecStatus.COPY_IN
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_SQLSTATE, _PRIMARY = pq.DiagnosticField.SQLSTATE, pq.DiagnosticField.MESSAGE_PRIMARY


class PipelinedTransaction:
    """One batch's transaction, sent; `finish` tells whether it committed."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        steps: list[Step],
        *,
        advance: sql.Composable,
        timeout_s: float,
    ) -> None:
        """Send `BEGIN; advance; steps; COMMIT` and the rows of every COPY among the steps.
        `advance` must raise when a lease does not hold. Raises OperationalError when the
        connection fails."""
        self._wire = _Wire(conn.pgconn, timeout_s)
        self._refusal: str | None = None
        self._done = False
        statements = [b"BEGIN", advance.as_bytes(conn)]
        statements += [step.statement.as_bytes(conn) for step in steps]
        self._wire.send(b";\n".join([*statements, b"COMMIT"]))
        for step in steps:
            if step.rows is None:
                continue
            if not self._until_copy_starts():
                return  # refused before this COPY: the rest of the message is skipped
            if step.data is None:
                self._copy(conn, step.rows)
            else:
                self._wire.put(step.data)
                self._wire.end_copy(None)

    def finish(self) -> str | None:
        """Wait for the outcome: None when the transaction committed, else why PostgreSQL
        refused it; the connection is then in an aborted transaction, to be rolled back."""
        if not self._done:
            while (result := self._wire.result()) is not None:
                self._note(result)
            self._done = True
        self._wire.check()
        return self._refusal

    def _until_copy_starts(self) -> bool:
        while (result := self._wire.result()) is not None:
            if result.status == _COPY_IN:
                return True
            self._note(result)
        self._done = True  # the message ended early: a statement failed
        return False

    def _copy(self, conn: psycopg.Connection[Any], rows: list[Any]) -> None:
        copy = Copy(row_cursor(conn), binary=False, writer=_CopyWriter(self._wire))
        try:
            # Rows go to psycopg's C formatting as they are, without a Python loop per row.
            deque(map(copy.write_row, rows), maxlen=0)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:  # a value psycopg will not send (text holding NUL)
            copy.finish(exc)  # the COPY fails, and with it the rest of the message
            return
        copy.finish(None)

    def _note(self, result: PGresult) -> None:
        if result.status == _FATAL_ERROR and self._refusal is None:
            # The code and the primary message: the detail may hold a row's contents
            # ("Failing row contains ..."), which never go to the log.
            code = result.error_field(_SQLSTATE) or b"?????"
            primary = (result.error_field(_PRIMARY) or b"").decode("utf-8", "replace").strip()
            self._refusal = f"{code.decode('ascii', 'replace')}: {primary or 'refused'}"


def formatted(conn: psycopg.Connection[Any], rows: list[Any]) -> bytes:
    """`rows` as the text COPY FROM STDIN reads, by psycopg's C formatting, for `Step.data`.
    Raises psycopg.DataError for a value psycopg will not send (text holding NUL). Nothing
    goes over the connection: it may be busy with the batch in flight."""
    cursor = row_cursor(conn)
    if _format_row_text is None:
        return formatted_by_copy(cursor, rows)
    # The row formatter `Copy.write_row` calls, called straight from a C loop: the two Python
    # frames around it cost a third of the formatting.
    text = bytearray()
    deque(map(_format_row_text, rows, repeat(Adapting(cursor)), repeat(text)), maxlen=0)
    return bytes(text)


def formatted_by_copy(cursor: psycopg.Cursor[Any], rows: list[Any]) -> bytes:
    """The same text through psycopg's public `Copy`, row by row."""
    collected = _Collected()
    copy = Copy(cursor, binary=False, writer=collected)
    deque(map(copy.write_row, rows), maxlen=0)
    copy.finish(None)
    return b"".join(collected.chunks)


def _row_formatter() -> Callable[[Sequence[Any], Transformer, bytearray], None] | None:
    """psycopg's text COPY row formatter (C in its binary and C builds), where this psycopg
    version keeps it; None elsewhere, and `formatted` goes through `Copy` like any user.
    tests/integration/test_pipelined.py holds both ways to the same bytes."""
    try:
        return psycopg_row_text_formatter()
    except PrivateApiMoved:
        return None


_format_row_text = _row_formatter()


class _Collected(Writer):
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: Buffer) -> None:
        self.chunks.append(bytes(data))


class _CopyWriter(Writer):
    """Where psycopg's COPY formatting puts its buffers: straight onto the connection."""

    def __init__(self, wire: _Wire) -> None:
        self._wire = wire

    def write(self, data: Buffer) -> None:
        self._wire.put(data)

    def finish(self, exc: BaseException | None = None) -> None:
        self._wire.end_copy(None if exc is None else f"refused before sending: {exc}")


class _Wire:
    """Non-blocking libpq calls, waiting on the socket with the GIL released. A wait longer than
    `timeout_s` (the server's own statement timeout, and some) means the connection is dead."""

    def __init__(self, pgconn: PGconn, timeout_s: float) -> None:
        self._pgconn = pgconn
        self._timeout_ms = int(timeout_s * 1000)

    # Sending queues in libpq and hands the socket what it takes now; what it does not take
    # goes before the next wait for an answer (`result`), which needs it sent.

    def send(self, query: bytes) -> None:
        self._pgconn.send_query(query)
        self._pgconn.flush()

    def put(self, data: Buffer) -> None:
        while self._pgconn.put_copy_data(data) == 0:  # libpq could not queue it: make room
            self._wait(select.POLLOUT)
            self._pgconn.flush()
        self._pgconn.flush()

    def end_copy(self, error: str | None) -> None:
        while self._pgconn.put_copy_end(None if error is None else error.encode()) == 0:
            self._wait(select.POLLOUT)
            self._pgconn.flush()
        self._pgconn.flush()

    def result(self) -> PGresult | None:
        self._flush()
        while self._pgconn.is_busy():
            self._wait(select.POLLIN)
            self._pgconn.consume_input()
        return self._pgconn.get_result()

    def check(self) -> None:
        if self._pgconn.status == pq.ConnStatus.BAD:
            raise psycopg.OperationalError(
                "connection lost: " + self._pgconn.error_message.decode("utf-8", "replace")
            )

    def _flush(self) -> None:
        while self._pgconn.flush() == 1:
            if self._wait(select.POLLIN | select.POLLOUT) & select.POLLIN:
                self._pgconn.consume_input()  # the server may be talking (a notice, an error)

    def _wait(self, events: int) -> int:
        poller = select.poll()
        poller.register(self._pgconn.socket, events)
        ready = poller.poll(self._timeout_ms)
        if not ready:
            raise psycopg.OperationalError(
                f"no answer from PostgreSQL in {self._timeout_ms / 1000:.0f}s"
            )
        return ready[0][1]
