"""The pure logic of a batch's parts: where a batch moves its partitions, what a result means,
how the leases compare with the offsets table, how the database's refusals are told apart."""

from __future__ import annotations

import psycopg
from confluent_kafka import Message

from consumers.batch.committer import Batch, CommitResult
from consumers.batch.planner import Planned, by_topic
from consumers.database.db_session import Refusal, is_lost, refusal_of
from consumers.database.offsets import Lease, StoredRow
from consumers.membership.leases import compare_with_rows
from consumers.partitions import PartitionTable


class _Record:
    """A consumed record's coordinates, as confluent-kafka's Message answers them."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._at = (topic, partition, offset)

    def topic(self) -> str:
        return self._at[0]

    def partition(self) -> int:
        return self._at[1]

    def offset(self) -> int:
        return self._at[2]


def records(topic: str, partition: int, *offsets: int) -> list[Message]:
    return [_Record(topic, partition, offset) for offset in offsets]  # type: ignore[misc]


PLANNED = Planned(targets={}, plans={"a": []}, changes=[], followed=False)


def lease(topic: str, partition: int, *, epoch: int = 1, next_offset: int = 0) -> Lease:
    return Lease(topic=topic, partition=partition, epoch=epoch, next_offset=next_offset)


def test_a_batch_moves_each_partition_past_its_last_record_not_by_a_count() -> None:
    # Offsets skip the transaction markers: 10, 11, 13 is three records, next offset 14.
    batch = Batch(
        {("a", 0): records("a", 0, 10, 11, 13), ("a", 1): records("a", 1, 4)},
        {("a", 0): lease("a", 0, next_offset=10), ("a", 1): lease("a", 1, next_offset=4)},
        PLANNED,
    )
    assert batch.next_offsets() == {("a", 0): 14, ("a", 1): 5}
    rest = batch.without([("a", 0)])
    assert list(rest.records) == [("a", 1)] and list(rest.leases) == [("a", 1)]
    assert rest.plans is None  # the plan covered the partition taken out: made again


def test_records_are_grouped_by_topic_across_partitions() -> None:
    grouped = by_topic(
        {("a", 0): records("a", 0, 1), ("b", 0): records("b", 0, 7), ("a", 1): records("a", 1, 2)}
    )
    assert {topic: [r.offset() for r in of_topic] for topic, of_topic in grouped.items()} == {
        "a": [1, 2],
        "b": [7],
    }


def test_a_result_is_whole_only_when_no_partition_was_refused_lost_or_declined() -> None:
    batch = Batch({}, {}, PLANNED)
    assert CommitResult(batch=batch, committed={("a", 0): 3}).whole
    assert not CommitResult(batch=batch, refused=[("a", 0)]).whole
    assert not CommitResult(batch=batch, unknown=[("a", 0)], lost="gone").whole
    refusal = Refusal("25006", "read-only")
    assert not CommitResult(batch=batch, declined=[("a", 0)], refusal=refusal).whole


def _held(*leases: Lease) -> PartitionTable:
    table = PartitionTable()
    for held in leases:
        table.claimed(held, log_start=0, log_end=100)
    return table


def test_reconcile_sees_a_lease_taken_by_another_epoch_and_a_row_released() -> None:
    table = _held(lease("a", 0, epoch=3), lease("a", 1, epoch=3), lease("a", 2, epoch=3))
    rows = {
        ("a", 0): StoredRow(next_offset=5, owner="me", owner_epoch=3),  # still ours
        ("a", 1): StoredRow(next_offset=5, owner="other", owner_epoch=4),  # taken
        ("a", 2): StoredRow(next_offset=5, owner=None, owner_epoch=4),  # reset: claim again
    }
    released, taken = compare_with_rows(table, rows)
    assert released == [("a", 2)]
    assert taken == [(("a", 1), rows[("a", 1)])]


def test_reconcile_claims_a_fenced_partition_again_once_its_owner_lets_go() -> None:
    table = _held(lease("a", 0, epoch=3))
    table.taken(("a", 0), StoredRow(next_offset=5, owner="other", owner_epoch=4))
    still_held = {("a", 0): StoredRow(next_offset=9, owner="other", owner_epoch=4)}
    assert compare_with_rows(table, still_held) == ([], [])  # fenced already: nothing new
    let_go = {("a", 0): StoredRow(next_offset=9, owner=None, owner_epoch=4)}
    assert compare_with_rows(table, let_go) == ([("a", 0)], [])
    assert compare_with_rows(table, {}) == ([("a", 0)], [])  # its row is gone: claim anew


def test_a_refusal_at_connection_start_is_read_from_the_servers_text() -> None:
    error = psycopg.OperationalError(
        'connection failed: FATAL:  too many connections for role "bridge"'
    )
    refusal = refusal_of(error)
    assert refusal is not None and refusal.sqlstate == "53300"
    assert refusal.message == 'too many connections for role "bridge"'
    assert not is_lost(error)


def test_a_dropped_connection_is_lost_not_refused() -> None:
    error = psycopg.OperationalError("server closed the connection unexpectedly")
    assert refusal_of(error) is None
    assert is_lost(error)
    assert not is_lost(psycopg.errors.UndefinedTable("no such table"))  # a bug: neither
    assert refusal_of(ValueError("not a database error")) is None


def test_reconcile_claims_again_a_partition_whose_claim_the_database_lost() -> None:
    """After a failover to a standby that lacked the claim: the row's owner epoch is below the
    lease's. Waiting for an owner to let go would wait forever; claiming again fences all."""
    table = _held(lease("a", 0, epoch=7))
    behind = {("a", 0): StoredRow(next_offset=3, owner="me", owner_epoch=6)}
    assert compare_with_rows(table, behind) == ([("a", 0)], [])
    table.taken(("a", 0), behind[("a", 0)])  # as a refused advance, read back, leaves it
    assert compare_with_rows(table, behind) == ([("a", 0)], [])
