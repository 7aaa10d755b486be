"""The one judge of whole epochs, in PostgreSQL (`epoch_lacks`, migration 0004), and the ledger's
calls that move an epoch from phase to phase:

- the judge and its rule in memory (`EpochState.lacks`, which the assembly forecasts with) agree
  on generated ledgers;
- each phase is reached through the calls the consumer and the operator make, against an
  expectation written here;
- each branch of the in-batch guard (`publish_in_batch`) refuses its batch, and the guard
  passes only a batch that holds the epoch whole."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from bridge.epoch_manifest import Epoch, Part
from bridge.errors import BridgeError
from bridge.names import DEAD_LETTERS_TABLE
from consumers.database.ledger_tables import LedgerNames
from consumers.database.state import ensure_state, state_tables
from consumers.epochs.ledger import (
    EpochKey,
    EpochPhase,
    EpochState,
    IllegalEpochMove,
    Judged,
    comes_first,
    discard,
    force,
    hold,
    judge,
    open_epochs,
    publish_in_batch,
    published,
    take,
)
from consumers.epochs.staging import EpochStager
from consumers.tables.applier import Applier
from tests.harness import Endpoints

pytestmark = pytest.mark.quick

MANIFEST, TOPIC, OTHER = "bridge-epochs", "orders", "audit"  # OTHER is routed per partition
GROUP = "g"


_OFFSETS = itertools.count()  # every record staged here at an offset of its own


def whole(topic: str) -> bool:
    return topic != OTHER


def part(epoch: int, partition: int, records: dict[str, int]) -> Part:
    return Part(query="q", epoch=epoch, partition=partition, records=records)


def record(epoch: int, parts: tuple[int, ...]) -> Epoch:
    return Epoch(query="q", epoch=epoch, parts=parts)


@pytest.fixture
def ledger(stack: Endpoints) -> Iterator[tuple[psycopg.Connection[Any], LedgerNames]]:
    schema = f"judge_{uuid.uuid4().hex[:8]}"
    tables = ensure_state(stack.dsn, schema)
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        yield conn, tables.ledger
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def stager(names: LedgerNames) -> EpochStager:
    applier = Applier(tables=state_tables(names.schema), group_id=GROUP)
    return EpochStager(ledger=names, group_id=GROUP, manifest_topic=MANIFEST, whole_topic=whole,
                       applier=applier)  # fmt: skip


def stage(conn: psycopg.Connection[Any], names: LedgerNames, topic: str, *values: Any) -> None:
    """Through the stager, in a transaction: manifest documents, or (epoch, part, n) runs."""
    with conn.transaction():
        if topic == MANIFEST:
            records = [Message(topic=MANIFEST, partition=0, offset=i, value=v.encode())
                       for i, v in enumerate(values)]  # fmt: skip
        else:
            records = [
                Message(topic=topic, partition=part % 2, offset=next(_OFFSETS), value=b"{}",
                        headers=[("bridge.query", b"q"), ("bridge.epoch", str(epoch).encode()),
                                 ("bridge.partition", str(part).encode()),
                                 ("bridge.epochs", b"whole")])
                for epoch, part, n in values for _ in range(n)
            ]  # fmt: skip
        stager(names).apply(conn, topic, records)


def state_of(conn: psycopg.Connection[Any], names: LedgerNames, key: EpochKey) -> EpochState:
    found = [s for s in open_epochs(conn, names, GROUP) if s.key == key]
    if found:
        return found[0]
    row = conn.execute(
        sql.SQL("SELECT outcome FROM {} WHERE group_id = %s AND query = %s AND epoch = %s").format(
            names.epochs
        ),
        (GROUP, *key),
    ).fetchone()
    assert row is not None, key
    return EpochState(GROUP, *key, outcome=row[0])


def phase(conn: psycopg.Connection[Any], names: LedgerNames, key: EpochKey) -> EpochPhase:
    found = state_of(conn, names, key)
    with conn.transaction():
        return found.phase(judge(conn, names, GROUP, key, whole))


# -- the judge and its rule in memory --------------------------------------------------------

_parts = st.lists(st.integers(0, 3), max_size=4, unique=True)
_written = st.dictionaries(
    st.integers(0, 4), st.dictionaries(st.sampled_from([TOPIC, OTHER, "x"]), st.integers(0, 3)),
    max_size=4,
)  # fmt: skip
_staged = st.dictionaries(
    st.tuples(st.integers(0, 5), st.sampled_from([TOPIC, OTHER, "x"])), st.integers(1, 4),
    max_size=5,
)  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.none() | _parts, written=_written, staged=_staged, counted=st.booleans())
def test_the_judge_and_its_rule_in_memory_agree(
    ledger: tuple[psycopg.Connection[Any], LedgerNames],
    parts: list[int] | None,
    written: dict[int, dict[str, int]],
    staged: dict[tuple[int, str], int],
    counted: bool,
) -> None:
    conn, names = ledger
    key = ("q", int(uuid.uuid4().int % 10**12))
    conn.execute(
        sql.SQL("INSERT INTO {} (group_id, query, epoch, parts) VALUES (%s, %s, %s, %s)").format(
            names.epochs
        ),
        (GROUP, *key, parts),
    )
    for part, records in written.items():
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (group_id, query, epoch, spark_partition, records) "
                "VALUES (%s, %s, %s, %s, %s)"
            ).format(names.parts),
            (GROUP, *key, part, json.dumps(records)),
        )
    in_batch: dict[int, dict[str, int]] | None = None
    if counted:  # the batch's own counts, as the in-batch path judges
        in_batch = {}
        for (part, topic), n in staged.items():
            in_batch.setdefault(part, {})[topic] = n
    else:
        for (part, topic), n in staged.items():
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (group_id, query, epoch, spark_partition, topic, partition, "
                    "records) VALUES (%s, %s, %s, %s, %s, 0, %s)"
                ).format(names.staged),
                (GROUP, *key, part, topic, n),
            )
    in_memory = EpochState(GROUP, *key, parts=None if parts is None else tuple(sorted(parts)),
                           written=written, staged=staged)  # fmt: skip
    assert judge(conn, names, GROUP, key, whole, in_batch) == in_memory.lacks(whole)


# -- the phases, through the ledger's calls --------------------------------------------------


def test_each_phase_is_reached_through_the_calls_that_move_it(
    ledger: tuple[psycopg.Connection[Any], LedgerNames],
) -> None:
    conn, names = ledger
    dead_letters = sql.Identifier(names.schema, DEAD_LETTERS_TABLE)
    one, two, three, four = ("q", 1), ("q", 2), ("q", 3), ("q", 4)
    # The expectation, written apart from the table it checks: each call and the phase after.
    walk: list[tuple[str, Callable[[], object], EpochKey, EpochPhase]] = [
        ("epoch 1's first part", lambda: stage(conn, names, MANIFEST, part(1, 0, {TOPIC: 2, OTHER: 5})), one, EpochPhase.OPEN),  # noqa: E501
        ("its records, one short", lambda: stage(conn, names, TOPIC, (1, 0, 1)), one, EpochPhase.OPEN),  # noqa: E501
        ("the last of them", lambda: stage(conn, names, TOPIC, (1, 0, 1)), one, EpochPhase.OPEN),
        ("the epoch record", lambda: stage(conn, names, MANIFEST, record(1, (0,))), one, EpochPhase.WHOLE),  # noqa: E501
        ("published by a member", lambda: publish(conn, names, one), one, EpochPhase.PUBLISHED),
        ("the record again (a replayed hook)", lambda: stage(conn, names, MANIFEST, record(1, (0,))), one, EpochPhase.PUBLISHED),  # noqa: E501
        ("its records again (a reset below them)", lambda: stage(conn, names, TOPIC, (1, 0, 2)), one, EpochPhase.OVERSTAGED),  # noqa: E501
        ("discarded by an operator", lambda: act(conn, names, one, "discard"), one, EpochPhase.DISCARDED),  # noqa: E501
        ("epoch 2, its records before its part", lambda: stage(conn, names, TOPIC, (2, 1, 3)), two, EpochPhase.OPEN),  # noqa: E501
        ("forced by an operator", lambda: act(conn, names, two, "force"), two, EpochPhase.FORCED),
        ("published as it is", lambda: publish(conn, names, two), two, EpochPhase.PUBLISHED),
        ("epoch 3, its manifest", lambda: stage(conn, names, MANIFEST, part(3, 0, {TOPIC: 1}), record(3, (0,))), three, EpochPhase.OPEN),  # noqa: E501
        ("its one record staged twice", lambda: stage(conn, names, TOPIC, (3, 0, 2)), three, EpochPhase.OVERSTAGED),  # noqa: E501
        ("epoch 4, held whole by a batch", lambda: stage(conn, names, MANIFEST, part(4, 1, {TOPIC: 2}), record(4, (1,))), four, EpochPhase.OPEN),  # noqa: E501
    ]  # fmt: skip
    for what, call, key, expected in walk:
        call()
        assert phase(conn, names, key) is expected, what
    # Moves the table refuses, each with the epoch left as it was.
    with pytest.raises(IllegalEpochMove, match="publishing it would write them twice"):
        act(conn, names, three, "force")
    assert phase(conn, names, three) is EpochPhase.OVERSTAGED
    assert publish(conn, names, three) is False
    with pytest.raises(BridgeError, match="is not open"):
        act(conn, names, two, "discard")
    # Epoch 3 holds epoch 4 back (epochs publish in order) until it is discarded; then the
    # batch holding epoch 4 whole publishes it.
    assert not in_batch(conn, names, four, Judged((1,), (TOPIC,), {1: {TOPIC: 2}}))
    assert act(conn, names, three, "discard") == 2
    assert phase(conn, names, three) is EpochPhase.DISCARDED
    assert in_batch(conn, names, four, Judged((1,), (TOPIC,), {1: {TOPIC: 2}}))
    assert phase(conn, names, four) is EpochPhase.PUBLISHED
    letters = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(dead_letters)).fetchone()
    assert letters == (4,)  # epoch 1's two records staged again, and epoch 3's two


def publish(conn: psycopg.Connection[Any], names: LedgerNames, key: EpochKey) -> bool:
    """What the publisher does around writing the records: take, then settle."""
    with conn.transaction():
        if take(conn, names, GROUP, key, whole) is None:
            return False
        published(conn, names, GROUP, key)
    return True


def act(conn: psycopg.Connection[Any], names: LedgerNames, key: EpochKey, action: str) -> int:
    """What `bridge epochs publish|discard --execute` does."""
    dead_letters = sql.Identifier(names.schema, DEAD_LETTERS_TABLE)
    with conn.transaction():
        held = hold(conn, names, GROUP, key, whole)
        if action == "force":
            force(conn, names, held, requested_by="test")
            return 0
        return discard(conn, names, dead_letters, held, requested_by="test")


def in_batch(
    conn: psycopg.Connection[Any],
    names: LedgerNames,
    key: EpochKey,
    judged: Judged,
    *,
    rollback: bool = False,
) -> bool:
    """The in-batch guard's statements in a transaction of their own: whether they pass;
    with `rollback`, what they did is rolled back either way."""
    try:
        with conn.transaction() as transaction:
            for statement in publish_in_batch(names, GROUP, key, judged):
                conn.execute(statement)
            if rollback:
                raise psycopg.Rollback(transaction)
    except psycopg.errors.InvalidTextRepresentation as exc:
        assert "cannot be published by its batch" in str(exc)
        return False
    return True


# -- the in-batch guard, branch by branch ----------------------------------------------------


def _whole_epoch(conn: psycopg.Connection[Any], names: LedgerNames, epoch: int) -> Judged:
    """Epoch `epoch` of two parts in the ledger's manifest, its records in the batch only."""
    stage(conn, names, MANIFEST, part(epoch, 0, {TOPIC: 2, OTHER: 1}),
          part(epoch, 1, {TOPIC: 1}), record(epoch, (0, 1)))  # fmt: skip
    return Judged((0, 1), (TOPIC,), {0: {TOPIC: 2}, 1: {TOPIC: 1}})


def test_the_guard_passes_a_batch_holding_the_epoch_whole(
    ledger: tuple[psycopg.Connection[Any], LedgerNames],
) -> None:
    conn, names = ledger
    assert in_batch(conn, names, ("q", 1), _whole_epoch(conn, names, 1))
    assert phase(conn, names, ("q", 1)) is EpochPhase.PUBLISHED


@pytest.mark.parametrize(
    "branch",
    [
        "no epoch record",
        "a part the batch did not count",
        "a record short",
        "a record too many",
        "a part the manifest does not know",
        "its records staged",
        "an earlier epoch open",
        "an earlier epoch's records staged",
        "another query's records staged before its own in a partition",
        "already settled",
    ],
)
def test_the_guard_refuses_a_batch_on_each_branch(
    ledger: tuple[psycopg.Connection[Any], LedgerNames], branch: str
) -> None:
    conn, names = ledger
    key = ("q", 2)
    judged = _whole_epoch(conn, names, 2)
    if branch == "no epoch record":
        assert in_batch(conn, names, key, judged)  # no earlier epoch open, then
        stage(conn, names, MANIFEST, part(3, 0, {TOPIC: 1}))
        key, judged = ("q", 3), Judged((0,), (TOPIC,), {0: {TOPIC: 1}})
    elif branch == "a part the batch did not count":
        # Of an earlier attempt, the epoch record does not name it: the topics held back that
        # the batch counted may not be all of the epoch's.
        stage(conn, names, MANIFEST, part(2, 5, {"x": 1}))
    elif branch == "a record short":
        judged = Judged((0, 1), (TOPIC,), {0: {TOPIC: 2}, 1: {TOPIC: 0}})
    elif branch == "a record too many":
        judged = Judged((0, 1), (TOPIC,), {0: {TOPIC: 3}, 1: {TOPIC: 1}})
    elif branch == "a part the manifest does not know":
        judged = Judged((0, 1, 7), (TOPIC,), {0: {TOPIC: 2}, 1: {TOPIC: 1}, 7: {TOPIC: 1}})
    elif branch == "its records staged":
        stage(conn, names, TOPIC, (2, 0, 1))
    elif branch == "an earlier epoch open":
        stage(conn, names, MANIFEST, part(1, 0, {TOPIC: 1}))
    elif branch == "an earlier epoch's records staged":
        stage(conn, names, TOPIC, (1, 0, 1))
    elif branch == "another query's records staged before its own in a partition":
        staged_rows(conn, names, ("other", 0, TOPIC, 0, 5))
        judged = replace(judged, firsts={(TOPIC, 0): 6, (TOPIC, 1): 0})
        assert in_batch(conn, names, key, replace(judged, firsts={(TOPIC, 0): 4}), rollback=True)
    elif branch == "already settled":
        assert in_batch(conn, names, key, judged)
    assert not in_batch(conn, names, key, judged)
    if branch != "already settled":
        assert phase(conn, names, key) is not EpochPhase.PUBLISHED


def staged_rows(
    conn: psycopg.Connection[Any], names: LedgerNames, *rows: tuple[str, int, str, int, int | None]
) -> None:
    """Staged counts as (query, epoch, topic, Kafka partition, first offset), a record each."""
    for query, epoch, topic, partition, first in rows:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (group_id, query, epoch, spark_partition, topic, partition, "
                "records, first_offset) VALUES (%s, %s, %s, 0, %s, %s, 1, %s)"
            ).format(names.staged),
            (GROUP, query, epoch, topic, partition, first),
        )


def test_an_epoch_waits_only_for_another_querys_records_wholly_before_its_own(
    ledger: tuple[psycopg.Connection[Any], LedgerNames],
) -> None:
    conn, names = ledger
    staged_rows(
        conn, names,
        ("backfill", 0, TOPIC, 0, 10), ("backfill", 0, TOPIC, 1, 10),
        ("update", 0, TOPIC, 0, 20), ("update", 0, TOPIC, 2, 3),  # partition 2: its own
        # Written at once: each before the other in one partition.
        ("left", 0, "x", 0, 5), ("left", 0, "x", 1, 9),
        ("right", 0, "x", 0, 7), ("right", 0, "x", 1, 2),
        ("old", 0, "y", 0, None), ("new", 0, "y", 0, 1),  # staged before migration 0005
    )  # fmt: skip
    assert comes_first(conn, names, GROUP, ("update", 0)) == (("backfill", 0), "orders[0]")
    assert comes_first(conn, names, GROUP, ("backfill", 0)) is None
    assert comes_first(conn, names, GROUP, ("left", 0)) is None
    assert comes_first(conn, names, GROUP, ("right", 0)) is None
    assert comes_first(conn, names, GROUP, ("new", 0)) is None
