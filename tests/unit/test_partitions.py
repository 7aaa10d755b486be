"""The partition state table: every move it allows, and the ones it refuses."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from consumers.database.offsets import Lease, StoredRow
from consumers.partitions import (
    IllegalTransition,
    PartitionEvent,
    PartitionState,
    PartitionTable,
)

KEY = ("orders", 0)


def lease(*, epoch: int = 3, next_offset: int = 100) -> Lease:
    return Lease(topic="orders", partition=0, epoch=epoch, next_offset=next_offset)


def claimed(state_after: PartitionState = PartitionState.CONSUMING) -> PartitionTable:
    table = PartitionTable()
    log_start = 0 if state_after is PartitionState.CONSUMING else 500
    assert table.claimed(lease(), log_start=log_start, log_end=1000) is state_after
    return table


def test_a_commit_moves_the_lease() -> None:
    table = claimed()
    table.committed({KEY: 150})
    assert table.lease(KEY) == lease(next_offset=150)
    assert table.counts()[PartitionState.CONSUMING] == 1


def test_a_lost_reply_is_resolved_by_the_stored_row_whichever_way_the_commit_went() -> None:
    for stored in (100, 150):  # rolled back, or committed with its reply lost
        table = claimed()
        table.lost([KEY], "server closed the connection")
        assert table.in_state(PartitionState.UNRESOLVED) == [KEY]
        assert table.not_progressing(stalled_after_s=60)[0].startswith("orders[0] unresolved")
        row = StoredRow(next_offset=stored, owner="me", owner_epoch=3)
        assert table.resolved(KEY, row) is PartitionState.CONSUMING
        assert table.lease(KEY) == lease(next_offset=stored)


def test_a_row_with_another_epoch_fences_and_a_fresh_claim_brings_it_back() -> None:
    table = claimed()
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


def test_a_partition_is_caught_up_once_what_kafka_delivered_is_applied() -> None:
    table = claimed()
    other = ("orders", 1)
    assert table.caught_up([KEY, other]) == {KEY}  # nothing delivered yet; `other` not held
    table.delivered(KEY, 180)
    assert table.caught_up([KEY]) == set()
    table.committed({KEY: 179})
    assert table.caught_up([KEY]) == set()
    table.committed({KEY: 180})
    assert table.caught_up([KEY]) == {KEY}


# The moves as the design in docs/architecture.md states them, written out here rather than read
# from the code's table: state -> {event: the state after, or GONE}; an event not named is refused.
GONE = "gone"
EXPECTED: dict[str, dict[str, str]] = {
    "consuming": {
        "claimed": "consuming",
        "claimed_out_of_range": "out_of_range",
        "committed": "consuming",
        "lost": "unresolved",
        "taken": "fenced",
        "fell_out_of_range": "out_of_range",
        "revoked": GONE,
    },
    "unresolved": {
        "claimed": "consuming",
        "claimed_out_of_range": "out_of_range",
        "resolved_ours": "consuming",
        "resolved_taken": "fenced",
        "taken": "fenced",
        "revoked": GONE,
    },
    "fenced": {
        "claimed": "consuming",
        "claimed_out_of_range": "out_of_range",
        "revoked": GONE,
    },
    "out_of_range": {
        "claimed": "consuming",
        "claimed_out_of_range": "out_of_range",
        "taken": "fenced",
        "revoked": GONE,
    },
}
EVENTS = [
    "claimed", "claimed_out_of_range", "committed", "lost",
    "resolved_ours", "resolved_taken", "taken", "fell_out_of_range", "revoked",
]  # fmt: skip


def in_state(state: str) -> PartitionTable:
    """A table holding KEY in `state`, reached through the table's own events."""
    if state == "out_of_range":
        return claimed(PartitionState.OUT_OF_RANGE)
    table = claimed()
    if state in ("unresolved", "fenced"):
        table.lost([KEY], "x")
    if state == "fenced":
        table.resolved(KEY, None)
    assert table.get(KEY) is not None and table.get(KEY).state == state  # type: ignore[union-attr]
    return table


def apply(table: PartitionTable, event: str) -> None:
    """`event` on KEY through the table's public method for it."""
    moves: dict[str, Callable[[], object]] = {
        "claimed": lambda: table.claimed(lease(epoch=9), log_start=0, log_end=1000),
        "claimed_out_of_range": lambda: table.claimed(lease(epoch=9), log_start=500, log_end=1000),
        "committed": lambda: table.committed({KEY: 120}),
        "lost": lambda: table.lost([KEY], "x"),
        "resolved_ours": lambda: table.resolved(
            KEY, StoredRow(next_offset=100, owner="me", owner_epoch=3)
        ),
        "resolved_taken": lambda: table.resolved(
            KEY, StoredRow(next_offset=100, owner="other", owner_epoch=4)
        ),
        "taken": lambda: table.taken(KEY, StoredRow(next_offset=100, owner="other", owner_epoch=4)),
        "fell_out_of_range": lambda: table.fell_out_of_range(KEY, "gone"),
        "revoked": lambda: table.forget([KEY]),
    }
    moves[event]()


def test_the_events_are_the_ones_expected() -> None:
    assert sorted(PartitionEvent) == sorted(EVENTS)
    assert sorted(PartitionState) == sorted(EXPECTED)


@pytest.mark.parametrize("state", list(EXPECTED))
@pytest.mark.parametrize("event", EVENTS)
def test_every_state_and_event_moves_as_the_design_says(state: str, event: str) -> None:
    table = in_state(state)
    expected = EXPECTED[state].get(event)
    if expected is None:
        with pytest.raises(IllegalTransition, match=f"'{event}' is not allowed in state {state}"):
            apply(table, event)
        assert table.get(KEY) is not None and table.get(KEY).state == state  # type: ignore[union-attr]
        return
    apply(table, event)
    after = table.get(KEY)
    assert (after.state if after is not None else GONE) == expected


def test_every_state_can_be_left_without_a_rebalance() -> None:
    for state in EXPECTED:
        leaving = [e for e, to in EXPECTED[state].items() if e != "revoked" and to != state]
        assert leaving, f"{state} is left only by a rebalance"
        table = in_state(state)
        apply(table, leaving[0])
        moved = table.get(KEY)
        assert moved is not None and moved.state != state
