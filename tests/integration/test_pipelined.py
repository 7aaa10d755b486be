"""A batch's transaction sent as one message, against real PostgreSQL: it commits whole, or
PostgreSQL refuses it whole and nothing of it is written."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from psycopg import sql

from consumers.batch.pipelined import PipelinedTransaction, formatted, formatted_by_copy
from consumers.database.offsets import Lease, OffsetStore
from consumers.database.state import StateTables
from consumers.decoding.rows import UNSET, row_cursor
from consumers.tables.applier import Step
from tests.harness import Endpoints


@pytest.fixture
def setup(
    stack: Endpoints, names: dict[str, str], state: StateTables
) -> Iterator[tuple[psycopg.Connection, OffsetStore, Lease]]:
    store = OffsetStore(schema=state.schema, group_id=names["group"], owner="a")
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint NOT NULL, note text)").format(
                sql.Identifier(names["table"])
            )
        )
        (lease,) = store.claim(conn, {(names["topic"], 0): 10}, lock_wait_ms=1000)
        yield conn, store, lease


def copy(table: str, rows: list[tuple[object, ...]]) -> Step:
    return Step(sql.SQL("COPY {} (id, note) FROM STDIN").format(sql.Identifier(table)), list(rows))


def ahead(conn: psycopg.Connection, steps: list[Step]) -> list[Step]:
    """The steps with their COPY text formatted ahead, as the committer sends them."""
    return [s if s.rows is None else s._replace(data=formatted(conn, s.rows)) for s in steps]


def fly(
    conn: psycopg.Connection, store: OffsetStore, lease: Lease, steps: list[Step]
) -> str | None:
    advance = store.advance_statement([(lease, 13)], strict=True)
    return PipelinedTransaction(conn, steps, advance=advance, timeout_s=30).finish()


def written(
    conn: psycopg.Connection, store: OffsetStore, lease: Lease, table: str
) -> tuple[int, int]:
    (count,) = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
    ).fetchone() or (0,)
    return count, store.stored(conn, [lease.key])[lease.key]


@pytest.mark.parametrize("formatted_ahead", [False, True])
def test_a_batch_commits_its_rows_and_its_offset_together(
    setup: tuple[psycopg.Connection, OffsetStore, Lease],
    names: dict[str, str],
    formatted_ahead: bool,
) -> None:
    conn, store, lease = setup
    table = names["table"]
    steps = [copy(table, [(10, "a"), (11, "tab\there")]), copy(table, [(12, None)])]
    if formatted_ahead:
        steps = ahead(conn, steps)
    assert fly(conn, store, lease, steps) is None
    assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert written(conn, store, lease, table) == (3, 13)
    assert conn.execute(
        sql.SQL("SELECT note FROM {} WHERE id = 11").format(sql.Identifier(table))
    ).fetchone() == ("tab\there",)


@pytest.mark.parametrize(
    "case",
    [
        "lease taken over",
        "row refused by the table",
        "row refused by the table, formatted ahead",
        "text psycopg will not send",
    ],
)
def test_a_refused_batch_writes_nothing_and_says_why(
    setup: tuple[psycopg.Connection, OffsetStore, Lease],
    names: dict[str, str],
    state: StateTables,
    case: str,
) -> None:
    conn, store, lease = setup
    table = names["table"]
    good = copy(table, [(10, "a"), (11, "b")])
    if case == "lease taken over":
        OffsetStore(schema=state.schema, group_id=names["group"], owner="b").claim(
            conn, {lease.key: 0}, lock_wait_ms=1000
        )
        steps, expected = [good], "no longer held"
    elif case == "row refused by the table":
        steps, expected = [good, copy(table, [(12, "c"), (None, "d")])], "not-null"
    elif case == "row refused by the table, formatted ahead":
        steps = ahead(conn, [good, copy(table, [(12, "c"), (None, "d")])])
        expected = "not-null"
    else:
        steps, expected = [good, copy(table, [(12, "nul\x00")])], "refused before sending"
    refusal = fly(conn, store, lease, steps)
    assert refusal is not None and expected in refusal
    assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.INERROR
    conn.execute("ROLLBACK")
    assert written(conn, store, lease, table) == (0, 10)


def test_a_batch_larger_than_the_socket_takes_is_sent_whole(
    setup: tuple[psycopg.Connection, OffsetStore, Lease], names: dict[str, str]
) -> None:
    """Sending returns before PostgreSQL has read the COPY text; what the socket did not take
    goes before the outcome is read."""
    conn, store, lease = setup
    table = names["table"]
    rows: list[tuple[object, ...]] = [(i, "x" * 1000) for i in range(20_000)]  # ~20 MB
    assert fly(conn, store, lease, ahead(conn, [copy(table, rows)])) is None
    assert written(conn, store, lease, table) == (20_000, 13)


def test_text_psycopg_will_not_send_is_found_when_formatting_ahead(
    setup: tuple[psycopg.Connection, OffsetStore, Lease], names: dict[str, str]
) -> None:
    conn, _, _ = setup
    with pytest.raises(psycopg.DataError, match="NUL"):
        ahead(conn, [copy(names["table"], [(1, "nul\x00")])])


def test_copy_text_formatted_ahead_is_what_psycopg_copy_writes(
    setup: tuple[psycopg.Connection, OffsetStore, Lease],
) -> None:
    """`formatted` calls psycopg's row formatter straight; its text must be what `Copy` makes
    of the same rows, byte for byte, whatever the values."""
    conn, _, _ = setup
    rows: list[tuple[object, ...]] = [
        (1, "plain", Decimal("12.50"), None, UNSET),
        (2**70, "tab\there\nnewline\\backslash\r", Decimal("-1E+3"), True, {"k": [1, "x"]}),
        (-3, "naïve ✓", Decimal("0.000001"), False, [1, {"a": None}]),
        (0, "", Decimal("1e-7"), 1.5, "\\N"),
    ]
    assert formatted(conn, rows) == formatted_by_copy(row_cursor(conn), rows)
    with pytest.raises(psycopg.DataError, match="NUL"):
        formatted(conn, [(1, "nul\x00")])
