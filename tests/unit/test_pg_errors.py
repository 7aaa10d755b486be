"""PostgreSQL's answers sorted as the consumer needs them, by SQLSTATE, in psycopg classes."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.errors import lookup

from consumers.database.pg_errors import RECORD_FAULTS, REFUSALS, in_sqlstate_classes

# (SQLSTATE, what it means) from PostgreSQL's errcodes table, not from the code's groups.
RECORD = [
    ("22P02", "invalid text representation"),
    ("22003", "numeric value out of range"),
    ("22001", "string data right truncation"),
    ("22021", "character not in repertoire"),
    ("23505", "unique violation"),
    ("23502", "not null violation"),
    ("23514", "check violation"),
    ("23503", "foreign key violation"),
    ("54000", "program limit exceeded: an index row too big"),
    ("21000", "cardinality violation: one key twice in one upsert"),
    ("428C9", "generated always"),
]
REFUSED = [
    ("25006", "read-only transaction"),
    ("40001", "serialization failure"),
    ("40P01", "deadlock detected"),
    ("53100", "disk full"),
    ("53300", "too many connections"),
    ("57014", "query canceled: statement timeout"),
]
NEITHER = [
    ("42P01", "undefined table: a bug or a dropped table"),
    ("42501", "insufficient privilege"),
    ("54011", "too many columns: a statement's fault"),
    ("57P01", "admin shutdown: the connection is lost"),
    ("08006", "connection failure"),
]


@pytest.mark.parametrize(("sqlstate", "meaning"), RECORD)
def test_a_record_at_fault_is_a_record_fault_and_not_a_refusal(sqlstate: str, meaning: str) -> None:
    error = lookup(sqlstate)("refused")
    assert isinstance(error, RECORD_FAULTS), meaning
    assert not isinstance(error, REFUSALS), meaning


@pytest.mark.parametrize(("sqlstate", "meaning"), REFUSED)
def test_a_server_refusing_writes_is_a_refusal_and_no_record_is_at_fault(
    sqlstate: str, meaning: str
) -> None:
    error = lookup(sqlstate)("refused")
    assert isinstance(error, REFUSALS), meaning
    assert not isinstance(error, RECORD_FAULTS), meaning


@pytest.mark.parametrize(("sqlstate", "meaning"), NEITHER)
def test_other_answers_are_neither(sqlstate: str, meaning: str) -> None:
    error = lookup(sqlstate)("x")
    assert not isinstance(error, RECORD_FAULTS), meaning
    assert not isinstance(error, REFUSALS), meaning


def test_a_value_psycopg_will_not_send_is_a_record_fault() -> None:
    # Text holding NUL: psycopg raises a DataError of its own, with no SQLSTATE.
    error = psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    assert error.sqlstate is None
    assert isinstance(error, RECORD_FAULTS)


def test_a_sqlstate_class_holds_every_code_of_it_and_no_other() -> None:
    integrity = in_sqlstate_classes("23")
    assert lookup("23505") in integrity and lookup("23000") in integrity
    assert all(error.sqlstate is not None and error.sqlstate[:2] == "23" for error in integrity)
