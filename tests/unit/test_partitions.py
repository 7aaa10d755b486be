"""The partition state table: every move it allows, and the ones it refuses."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from consumers.offsets import Lease, StoredRow
from consumers.partitions import MOVES, IllegalTransition, PartitionState, PartitionTable

KEY = ("orders", 0)


def lease(*, epoch: int = 3, next_offset: int = 100) -> Lease:
    return Lease(topic="orders", partition=0, epoch=epoch, next_offset=next_offset)


def claimed(state_after: PartitionState = PartitionState.CONSUMING) -> PartitionTable:
    table = PartitionTable()
    log_start = 0 if state_after is PartitionState.CONSUMING else 500
    assert table.claimed(lease(), log_start=log_start, log_end=1000) is state_after
    return table


def test_a_batch_moves_a_partition_to_in_flight_and_its_commit_moves_the_lease() -> None:
    table = claimed()
    table.sent([KEY])
    assert table.lease(KEY) is None  # in flight: no second batch over it
    table.committed({KEY: 150})
    assert table.lease(KEY) == lease(next_offset=150)
    assert table.counts()[PartitionState.CONSUMING] == 1


def test_a_lost_reply_is_resolved_by_the_stored_row_whichever_way_the_commit_went() -> None:
    for stored in (100, 150):  # rolled back, or committed with its reply lost
        table = claimed()
        table.sent([KEY])
        table.lost([KEY], "server closed the connection")
        assert table.in_state(PartitionState.UNRESOLVED) == [KEY]
        assert table.not_progressing(stalled_after_s=60)[0].startswith("orders[0] unresolved")
        row = StoredRow(next_offset=stored, owner="me", owner_epoch=3)
        assert table.resolved(KEY, row) is PartitionState.CONSUMING
        assert table.lease(KEY) == lease(next_offset=stored)


def test_a_row_with_another_epoch_fences_and_a_fresh_claim_brings_it_back() -> None:
    table = claimed()
    table.sent([KEY])
    table.lost([KEY], "offset lease refused")
    row = StoredRow(next_offset=120, owner="other", owner_epoch=4)
    assert table.resolved(KEY, row) is PartitionState.FENCED
    assert table.leases() == []
    (reason,) = table.not_progressing(stalled_after_s=60)
    assert "fenced" in reason and "owner epoch 4 now belongs to other" in reason
    table.claimed(lease(epoch=5, next_offset=120), log_start=0, log_end=1000)
    assert table.lease(KEY) == lease(epoch=5, next_offset=120)
    assert table.not_progressing(stalled_after_s=60) == []


def test_an_offset_below_the_log_start_is_out_of_range_until_claimed_again() -> None:
    table = claimed(PartitionState.OUT_OF_RANGE)
    assert table.lease(KEY) is None
    assert "see `bridge offsets reset`" in table.not_progressing(stalled_after_s=60)[0]
    table.claimed(lease(epoch=4, next_offset=500), log_start=500, log_end=1000)
    assert table.in_state(PartitionState.CONSUMING) == [KEY]


def test_an_offset_beyond_the_log_end_is_out_of_range_and_so_is_one_kafka_refuses() -> None:
    table = PartitionTable()
    assert table.claimed(lease(), log_start=0, log_end=10) is PartitionState.OUT_OF_RANGE
    assert "beyond the log end 10" in table.not_progressing(stalled_after_s=60)[0]
    table = claimed()
    table.fell_out_of_range(KEY, "the topic was recreated")
    assert table.in_state(PartitionState.OUT_OF_RANGE) == [KEY]
    with pytest.raises(IllegalTransition):
        table.fell_out_of_range(KEY, "again")


def test_a_consuming_partition_with_records_waiting_and_no_commit_is_stalled() -> None:
    table = claimed()
    table.delivered(KEY, 180)
    assert table.not_progressing(stalled_after_s=60) == []
    reasons = table.not_progressing(stalled_after_s=-1)
    assert reasons and "stalled" in reasons[0]


@pytest.mark.parametrize(
    ("setup", "event"),
    [
        ("consuming", "committed"),
        ("consuming", "lost"),
        ("consuming", "resolved"),
        ("in_flight", "sent"),
        ("in_flight", "claimed"),
        ("fenced", "sent"),
        ("fenced", "taken"),
        ("out_of_range", "sent"),
    ],
)
def test_a_move_the_table_does_not_allow_raises(setup: str, event: str) -> None:
    table = claimed()
    if setup == "in_flight":
        table.sent([KEY])
    elif setup == "fenced":
        table.sent([KEY])
        table.lost([KEY], "x")
        table.resolved(KEY, None)
    elif setup == "out_of_range":
        table = claimed(PartitionState.OUT_OF_RANGE)
    assert PartitionState(setup) not in MOVES[event]
    moves: dict[str, Callable[[], object]] = {
        "committed": lambda: table.committed({KEY: 1}),
        "lost": lambda: table.lost([KEY], "x"),
        "resolved": lambda: table.resolved(KEY, None),
        "sent": lambda: table.sent([KEY]),
        "claimed": lambda: table.claimed(lease(), log_start=0, log_end=1000),
        "taken": lambda: table.taken(KEY, None),
    }
    with pytest.raises(IllegalTransition, match=f"'{event}' is not allowed in state {setup}"):
        moves[event]()


def test_every_state_can_be_left_without_a_rebalance() -> None:
    reachable = {state for allowed in MOVES.values() for state in allowed}
    assert reachable == set(PartitionState)
