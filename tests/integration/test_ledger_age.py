"""The ledger grown old: a group that settled 100,000 epochs (28 hours of a query with a 1 s
trigger) stages an epoch, looks for its open epochs, and publishes, through the publisher and in
a batch, and prunes the epochs its watermark passed, without reading the epochs it settled long
ago. Counted by PostgreSQL itself
(`pg_stat_user_tables`), so that whatever plan the statements get, a read of the history fails."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.ledger_age import epochs_read
from consumers.database.ledger_tables import LedgerNames
from consumers.database.state import ensure_state
from consumers.epochs.ledger import EpochPhase, Judged, open_epochs, prune_settled
from tests.harness import Endpoints
from tests.integration.test_epoch_judge import (
    GROUP,
    MANIFEST,
    TOPIC,
    in_batch,
    part,
    phase,
    publish,
    record,
    stage,
)

pytestmark = pytest.mark.quick

HISTORY = 100_000
# What the statements may read of the epochs table for the whole walk below: a few rows per
# statement, through indexes. Reading the history is 100,000 rows a statement.
FEW = 200
PRUNED = 500


@pytest.fixture
def aged(stack: Endpoints) -> Iterator[tuple[psycopg.Connection[Any], LedgerNames]]:
    schema = f"aged_{uuid.uuid4().hex[:8]}"
    tables = ensure_state(stack.dsn, schema)
    names = tables.ledger
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (group_id, query, epoch, parts, manifest_at, outcome, settled_at) "
                "SELECT %s, 'q', n, '{{0}}', now(), 'published', now() "
                "FROM generate_series(0, %s) AS n"
            ).format(names.epochs),
            (GROUP, HISTORY - 1),
        )
        # What autovacuum does to a table that grew: the planner knows its size.
        conn.execute(sql.SQL("ANALYZE {}").format(names.epochs))
        yield conn, names
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_a_group_that_settled_100000_epochs_stages_looks_and_publishes_without_reading_them(
    aged: tuple[psycopg.Connection[Any], LedgerNames],
) -> None:
    conn, names = aged
    first, second = HISTORY, HISTORY + 1
    scans, rows = epochs_read(conn, names)
    # An epoch staged: its part, its records, its record.
    stage(conn, names, MANIFEST, part(first, 0, {TOPIC: 2}))
    stage(conn, names, TOPIC, (first, 0, 2))
    stage(conn, names, MANIFEST, record(first, (0,)))
    # The publisher's look, then its publication.
    looked = open_epochs(conn, names, GROUP)
    assert [s.key for s in looked] == [("q", first)]
    assert publish(conn, names, ("q", first))
    # The next epoch whole in a batch, published by the batch's own transaction.
    stage(conn, names, MANIFEST, part(second, 0, {TOPIC: 1}), record(second, (0,)))
    assert in_batch(conn, names, ("q", second), Judged((0,), (TOPIC,), {0: {TOPIC: 1}}))
    assert open_epochs(conn, names, GROUP) == []
    scans_after, rows_after = epochs_read(conn, names)
    assert scans_after == scans, "a statement scanned the whole epochs table"
    assert rows_after - rows <= FEW, f"read {rows_after - rows} rows of the epochs table"
    for key in (("q", first), ("q", second)):
        assert phase(conn, names, key) is EpochPhase.PUBLISHED
    # The publisher's prune reads what it deletes, from the watermark down, not the history.
    with conn.transaction():
        assert prune_settled(conn, names, GROUP, limit=PRUNED) == PRUNED
    scans_pruned, rows_pruned = epochs_read(conn, names)
    assert scans_pruned == scans, "the prune scanned the whole epochs table"
    assert rows_pruned - rows_after <= PRUNED + FEW, f"read {rows_pruned - rows_after} rows"
