"""The batch pipeline's stages: every (stage, event) pair against the design's own table."""

from __future__ import annotations

import pytest

from consumers.batch.lifecycle import STAGES, IllegalStage, Stage, StageEvent

# Written from the design (consumers/batch/lifecycle.py's docstring), not read from STAGES:
# stage -> {event: stage after}; an event not named is refused.
EXPECTED: dict[str, dict[str, str]] = {
    "idle": {"polling": "idle", "sent": "in_flight", "rewound": "rewound"},
    "in_flight": {"polling": "in_flight", "settled": "idle"},
    "rewound": {"polling": "idle", "rewound": "rewound"},
}
EVENTS = ["polling", "sent", "settled", "rewound"]


def test_the_stages_and_events_are_the_designed_ones() -> None:
    assert sorted(Stage) == sorted(EXPECTED)
    assert sorted(StageEvent) == sorted(EVENTS)


@pytest.mark.parametrize("stage", list(EXPECTED))
@pytest.mark.parametrize("event", EVENTS)
def test_every_stage_and_event_moves_as_designed(stage: str, event: str) -> None:
    expected = EXPECTED[stage].get(event)
    moved = STAGES.get((Stage(stage), StageEvent(event)))
    assert moved == (Stage(expected) if expected else None)


def test_a_move_the_table_refuses_raises_naming_it() -> None:
    # The guard itself, through a pipeline object that holds nothing else.
    from consumers.batch.lifecycle import BatchLifecycle

    pipeline = BatchLifecycle.__new__(BatchLifecycle)
    pipeline.stage = Stage.IN_FLIGHT
    with pytest.raises(IllegalStage, match="'sent' is not allowed in stage in_flight"):
        pipeline._move(StageEvent.SENT)
    assert pipeline.stage is Stage.IN_FLIGHT
