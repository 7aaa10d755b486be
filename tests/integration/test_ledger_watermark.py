"""The watermark of the settled epochs (migration 0006): where it moves, what it turns away, and
what it lets the ledger prune.

- it stops below the lowest open epoch of its query, whatever was settled above (an operator's
  discard out of order), and never moves back;
- a part, an epoch record or records of an epoch at or below it open nothing: they are a
  replay's, found by `replayed` and dropped by `skip_replayed`;
- settled epochs at or below it are pruned once their keep is over, a batch at a time, never an
  open one nor one holding staged records;
- the migration seeds it from the rows an older release kept."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from bridge.names import STATE_VERSION_TABLE
from consumers.database.ledger_tables import LedgerNames
from consumers.database.state import ensure_state
from consumers.epochs.ledger import (
    EpochPhase,
    Judged,
    advance_watermark,
    open_epochs,
    prune_settled,
    replayed,
    skip_replayed,
)
from tests.harness import Endpoints
from tests.integration.test_epoch_judge import (
    GROUP,
    MANIFEST,
    TOPIC,
    act,
    in_batch,
    ledger,  # noqa: F401 - the fixture, shared
    part,
    phase,
    record,
    stage,
)

pytestmark = pytest.mark.quick

Ledger = tuple[psycopg.Connection[Any], LedgerNames]


def watermark(conn: psycopg.Connection[Any], names: LedgerNames) -> int | None:
    row = conn.execute(
        sql.SQL("SELECT settled_through FROM {} WHERE group_id = %s AND query = 'q'").format(
            names.watermarks
        ),
        (GROUP,),
    ).fetchone()
    return None if row is None else int(row[0])


def count(conn: psycopg.Connection[Any], table: sql.Composable, epoch: int | None = None) -> int:
    where = sql.SQL("") if epoch is None else sql.SQL(" AND epoch = {}").format(epoch)
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE group_id = %s{}").format(table, where), (GROUP,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def manifest(conn: psycopg.Connection[Any], names: LedgerNames, epoch: int) -> Judged:
    """Epoch `epoch` of one part in the ledger's manifest, its records in the batch only."""
    stage(conn, names, MANIFEST, part(epoch, 0, {TOPIC: 2}), record(epoch, (0,)))
    return Judged((0,), (TOPIC,), {0: {TOPIC: 2}})


def published_through(conn: psycopg.Connection[Any], names: LedgerNames, last: int) -> None:
    for epoch in range(last + 1):
        assert in_batch(conn, names, ("q", epoch), manifest(conn, names, epoch))


def test_the_watermark_stops_below_the_lowest_open_epoch_and_never_moves_back(
    ledger: Ledger,  # noqa: F811
) -> None:
    conn, names = ledger
    judged = {epoch: manifest(conn, names, epoch) for epoch in (0, 1, 2)}
    # An operator discards epoch 1 while epoch 0 is open: nothing is settled through 0 yet.
    act(conn, names, ("q", 1), "discard")
    assert watermark(conn, names) is None
    assert in_batch(conn, names, ("q", 0), judged[0])
    assert watermark(conn, names) == 1, "0 published, 1 discarded: settled through 1"
    assert in_batch(conn, names, ("q", 2), judged[2])
    assert watermark(conn, names) == 2
    # A later settlement computed lower (here: from a ledger whose rows were pruned) keeps it.
    with conn.transaction():
        conn.execute(sql.SQL("DELETE FROM {} WHERE group_id = %s").format(names.epochs), (GROUP,))
        conn.execute(
            sql.SQL("INSERT INTO {} (group_id, query, epoch, outcome) VALUES (%s, 'q', 0, "
                    "'published')").format(names.epochs), (GROUP,),
        )  # fmt: skip
        conn.execute(advance_watermark(names, GROUP, "q"))
    assert watermark(conn, names) == 2


def test_a_replay_of_a_settled_epoch_opens_nothing_and_its_records_are_skipped(
    ledger: Ledger,  # noqa: F811
) -> None:
    conn, names = ledger
    published_through(conn, names, 1)
    parts_before = count(conn, names.parts)
    # Epoch 1 again, as a driver that replays it writes it: its part, its records, its record.
    stage(conn, names, MANIFEST, part(1, 0, {TOPIC: 2}))
    stage(conn, names, TOPIC, (1, 0, 2))
    stage(conn, names, MANIFEST, record(1, (0,)))
    assert count(conn, names.parts) == parts_before, "a replayed part was kept"
    assert replayed(conn, names, GROUP) == {("q", 1): 2}
    with conn.transaction():
        skip_replayed(conn, names, GROUP, ("q", 1))
    assert replayed(conn, names, GROUP) == {}
    assert count(conn, names.staged) == 0
    assert [s.key for s in open_epochs(conn, names, GROUP)] == []
    # The next epoch opens and publishes as if nothing had come again.
    assert in_batch(conn, names, ("q", 2), manifest(conn, names, 2))
    assert phase(conn, names, ("q", 2)) is EpochPhase.PUBLISHED


def test_settled_epochs_are_pruned_after_their_keep_never_an_open_or_overstaged_one(
    ledger: Ledger,  # noqa: F811
) -> None:
    conn, names = ledger
    published_through(conn, names, 3)
    stage(conn, names, MANIFEST, part(4, 0, {TOPIC: 2}))  # epoch 4 open
    stage(conn, names, TOPIC, (2, 0, 1))  # a record of settled epoch 2 staged again
    with conn.transaction():
        assert prune_settled(conn, names, GROUP) == 0, "fewer than the epochs kept"
    with conn.transaction():
        assert prune_settled(conn, names, GROUP, keep=2, limit=1) == 1, "a batch at a time"
    with conn.transaction():
        assert prune_settled(conn, names, GROUP, keep=2) == 1, "the two below 3 - 2 went"
    assert count(conn, names.epochs, 1) == 0
    with conn.transaction():
        assert prune_settled(conn, names, GROUP, keep=0) == 1, "3 went"
    assert count(conn, names.epochs, 2) == 1, "an epoch holding staged records stays"
    assert count(conn, names.epochs, 4) == 1, "the open epoch stays"
    assert count(conn, names.parts, 4) == 1
    assert watermark(conn, names) == 3
    with conn.transaction():
        skip_replayed(conn, names, GROUP, ("q", 2))
        assert prune_settled(conn, names, GROUP, keep=0) == 1
    assert count(conn, names.epochs) == 1
    assert [s.key for s in open_epochs(conn, names, GROUP)] == [("q", 4)]


def test_the_migration_seeds_the_watermark_from_the_rows_an_older_release_kept(
    stack: Endpoints,
    ledger: Ledger,  # noqa: F811
) -> None:
    conn, names = ledger
    published_through(conn, names, 2)
    stage(conn, names, MANIFEST, part(3, 0, {TOPIC: 2}))  # open
    # The schema as 0005 left it: no watermarks table, settled rows kept.
    with conn.transaction():
        conn.execute(sql.SQL("DROP TABLE {}").format(names.watermarks))
        conn.execute(
            sql.SQL("UPDATE {} SET version_num = '0005'").format(
                sql.Identifier(names.schema, STATE_VERSION_TABLE)
            )
        )
    ensure_state(stack.dsn, names.schema)
    assert watermark(conn, names) == 2
