"""The consumer's own account of its work: progress while catching up, dead letters, each at a
bounded rate, on a clock the test moves."""

from __future__ import annotations

import logging

import pytest

from consumers.batch.work_log import (
    DEAD_LETTER_LINES,
    DEAD_LETTER_WINDOW_S,
    PROGRESS_EVERY_S,
    WorkLog,
)
from consumers.tables.applier import DeadLetterNote


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def started(caplog: pytest.LogCaptureFixture) -> tuple[Clock, WorkLog]:
    caplog.set_level(logging.INFO)
    clock = Clock()
    return clock, WorkLog(dead_letters_table="bridge.dead_letters", behind_at=500, clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bridge.consumer"]


def test_progress_is_logged_while_catching_up_and_once_when_caught_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, work = started(caplog)
    work.committed(100, [], lag=100, partitions=4)  # keeping up: nothing to say
    assert lines(caplog) == []
    for lag in range(300_000, 0, -25_000):  # a catch-up: a batch of 5,000 a second
        clock.now += 1
        work.committed(5_000, [], lag=lag, partitions=4)
    said = lines(caplog)
    assert len(said) == 1 and said[0].startswith("catching up: 50000 records applied in 10s")
    assert "(5000/s), lag 50000 over 4 partitions" in said[0]
    clock.now += 1
    work.committed(5_000, [], lag=0, partitions=4)
    assert lines(caplog)[-1].startswith("caught up: 10000 records applied in 2s (5000/s), lag 0")
    clock.now += PROGRESS_EVERY_S * 3
    work.tick(lag=0, partitions=4)
    assert len(lines(caplog)) == 2  # caught up: silent again


def test_dead_letters_are_logged_each_up_to_a_bound_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, work = started(caplog)
    notes = [DeadLetterNote("orders", 1, offset, "not JSON") for offset in range(50)]
    work.committed(0, notes, lag=0, partitions=1)
    said = lines(caplog)
    assert len(said) == DEAD_LETTER_LINES
    assert said[0] == "dead letter: orders[1] offset 0: not JSON"
    clock.now += DEAD_LETTER_WINDOW_S
    work.tick(lag=0, partitions=1)
    assert lines(caplog)[-1].startswith("30 more dead letters in the last 60s")
    assert lines(caplog)[-1].endswith("bridge.dead_letters")
    work.committed(0, notes[:1], lag=0, partitions=1)  # a new window: logged again
    assert lines(caplog)[-1] == "dead letter: orders[1] offset 0: not JSON"
