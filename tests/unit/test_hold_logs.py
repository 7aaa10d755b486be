"""A hold is logged when it starts, when its reason changes, and then at a growing interval:
never a line each try (a held epoch's partitions are tried every few seconds for as long as
the epoch stays open)."""

from __future__ import annotations

import logging
import time

import pytest

from consumers.backoff import HoldBackoff
from consumers.epochs.ledger import EpochState


def test_a_hold_logs_when_it_starts_then_at_a_growing_interval(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    hold = HoldBackoff(what="records wait", consequence="their partition holds",
                       level=logging.INFO)  # fmt: skip
    caplog.set_level(logging.INFO, logger="bridge.consumer")
    logged_at = []
    for second in range(0, 3600, 5):  # a try every 5 s for an hour
        clock[0] = 1000.0 + second
        before = len(caplog.records)
        hold.failed("epoch 7 of query q is not whole")
        if len(caplog.records) > before:
            logged_at.append(second)
    assert logged_at == [0, 60, 180, 420, 900, 1860], logged_at  # 60 s, then twice as long
    assert "held 1860s, try 373" in caplog.records[-1].getMessage()
    clock[0] += 5
    hold.failed("another reason")  # a new reason: said at once
    assert "another reason" in caplog.records[-1].getMessage()
    hold.cleared()
    clock[0] += 5
    before = len(caplog.records)
    hold.failed("epoch 7 of query q is not whole")  # a new hold: said at once
    assert len(caplog.records) == before + 1


def test_an_epoch_held_too_long_names_what_it_lacks_and_the_commands_that_settle_it() -> None:
    state = EpochState(group="orders", query="q-1", epoch=812)
    said = state.held_too_long(lambda topic: True, 301.4)
    assert said.startswith("epoch incomplete for 301s: query q-1 epoch 812 (0 staged): ")
    assert "no epoch record in the manifest" in said
    for verb in ("discard", "publish"):
        assert f"bridge epochs {verb} --group orders --query q-1 --epoch 812 --execute" in said
