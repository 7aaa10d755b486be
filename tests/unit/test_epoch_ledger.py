"""The judge's rule in memory (`EpochState.lacks`): whole, or what an epoch lacks; its phase and
the moves the phases allow; and which epochs may publish. The same rule in PostgreSQL, and the
moves through the ledger's calls, are tests/integration/test_epoch_judge.py's."""

from __future__ import annotations

import pytest

from consumers.epochs.ledger import (
    TRANSITIONS,
    EpochEvent,
    EpochPhase,
    EpochState,
    IllegalEpochMove,
    move,
    publishable,
)


def whole(topic: str) -> bool:
    return topic != "audit"  # "audit" is routed per partition: never waited for


def state(epoch: int = 1, **fields: object) -> EpochState:
    found = EpochState("g", "q", epoch)
    for name, value in fields.items():
        setattr(found, name, value)
    return found


def test_an_epoch_is_whole_when_every_named_part_came_with_its_records_staged() -> None:
    found = state(
        parts=(0, 1),
        written={0: {"a": 3, "audit": 9}, 1: {"a": 1, "b": 2}},
        staged={(0, "a"): 3, (1, "a"): 1, (1, "b"): 2},
    )
    assert found.missing(whole) == []


def test_what_an_epoch_lacks_is_named_part_by_part() -> None:
    assert state().missing(whole) == [
        "no epoch record in the manifest: the driver has not committed the epoch"
    ]
    found = state(parts=(0, 1, 2), written={0: {"a": 3}, 1: {"b": 2}}, staged={(0, "a"): 1})
    assert found.missing(whole) == [
        "Spark partition 0, topic a: 1 of 3 records staged",
        "Spark partition 1, topic b: 0 of 2 records staged",
        "Spark partition 2: its part is not in the manifest",
    ]
    stray = state(parts=(0,), written={0: {}}, staged={(5, "a"): 1})
    assert stray.missing(whole) == [
        "records staged from Spark partition 5, which has no part in the manifest"
    ]


def test_parts_of_an_earlier_attempt_the_epoch_record_does_not_name_are_waited_for() -> None:
    """A replay with fewer tasks names only its own parts; the first attempt's committed parts
    are the epoch's too (seen in the cluster soak: a worker lost, the replay ran 2 tasks)."""
    found = state(
        parts=(0, 1),
        written={0: {"a": 3}, 1: {"a": 3}, 2: {"a": 3}, 3: {"a": 3}},
        staged={(0, "a"): 3, (1, "a"): 3, (2, "a"): 3, (3, "a"): 1},
    )
    assert found.missing(whole) == ["Spark partition 3, topic a: 1 of 3 records staged"]
    found.staged[(3, "a")] = 3
    assert found.missing(whole) == []


def test_an_empty_epoch_is_whole() -> None:
    assert state(parts=()).missing(whole) == []


def test_a_query_publishes_in_epoch_order_and_queries_do_not_wait_for_each_other() -> None:
    incomplete = state(1, parts=(0,), written={})
    complete = state(2, parts=(0,), written={0: {"a": 1}}, staged={(0, "a"): 1})
    other = EpochState("g", "r", 7, parts=())
    assert publishable([incomplete, complete, other], whole) == [other]
    assert publishable([complete, other], whole) == [complete, other]


def test_a_forced_epoch_publishes_as_it_is() -> None:
    assert publishable([state(1, forced=True)], whole) == [state(1, forced=True)]


def test_records_staged_after_an_epoch_was_settled_keep_it_open() -> None:
    settled = state(1, outcome="published", parts=(0,), written={}, staged={(0, "a"): 2})
    later = state(2, parts=())
    assert publishable([settled, later], whole) == []


def test_records_staged_twice_are_named_and_hold_the_epoch() -> None:
    twice = state(parts=(0,), written={0: {"a": 2}}, staged={(0, "a"): 4})
    assert twice.missing(whole) == [
        "more records staged than written: Spark partition 0, topic a: 4 staged, its part wrote 2"
    ]
    assert publishable([twice], whole) == []


def test_a_forced_epoch_with_records_staged_twice_does_not_publish() -> None:
    twice = state(parts=(0,), written={0: {"a": 2}}, staged={(0, "a"): 4}, forced=True)
    assert twice.phase(twice.lacks(whole)) is EpochPhase.OVERSTAGED
    assert publishable([twice], whole) == []


@pytest.mark.parametrize(
    ("found", "phase"),
    [
        (state(), EpochPhase.OPEN),
        (state(parts=(0,), written={0: {"a": 1}}), EpochPhase.OPEN),
        (state(parts=(0,), written={0: {"a": 1}}, staged={(0, "a"): 1}), EpochPhase.WHOLE),
        (state(parts=(0,), written={0: {"audit": 9}}), EpochPhase.WHOLE),  # not held back
        (state(forced=True), EpochPhase.FORCED),
        (state(parts=(0,), written={0: {"a": 1}}, staged={(0, "a"): 2}), EpochPhase.OVERSTAGED),
        (state(outcome="published"), EpochPhase.PUBLISHED),
        (state(outcome="discarded"), EpochPhase.DISCARDED),
        (state(outcome="published", staged={(0, "a"): 1}), EpochPhase.OVERSTAGED),
        (state(outcome="discarded", staged={(0, "a"): 1}), EpochPhase.OVERSTAGED),
    ],
)
def test_an_epochs_phase_is_read_from_its_row_and_what_it_lacks(
    found: EpochState, phase: EpochPhase
) -> None:
    assert found.phase(found.lacks(whole)) is phase


def test_an_overstaged_or_settled_epoch_cannot_be_forced_nor_a_settled_one_discarded() -> None:
    for phase in (EpochPhase.OVERSTAGED, EpochPhase.PUBLISHED, EpochPhase.DISCARDED):
        with pytest.raises(IllegalEpochMove, match=f"query q epoch 1 is {phase}"):
            move("query q epoch 1", phase, EpochEvent.FORCED)
    with pytest.raises(IllegalEpochMove, match="publishing it would write them twice"):
        move("query q epoch 1", EpochPhase.OVERSTAGED, EpochEvent.FORCED)
    assert move("e", EpochPhase.OVERSTAGED, EpochEvent.DISCARDED) is EpochPhase.DISCARDED
    for phase in (EpochPhase.PUBLISHED, EpochPhase.DISCARDED):
        with pytest.raises(IllegalEpochMove):
            move("e", phase, EpochEvent.DISCARDED)


def test_every_phase_can_be_reached_and_every_unsettled_one_left_for_a_settled_one() -> None:
    reached = {EpochPhase.OPEN} | set(TRANSITIONS.values())
    assert reached == set(EpochPhase)
    settled = {EpochPhase.PUBLISHED, EpochPhase.DISCARDED}
    for phase in set(EpochPhase) - settled:
        assert {TRANSITIONS.get((phase, e)) for e in EpochEvent} & settled, phase
