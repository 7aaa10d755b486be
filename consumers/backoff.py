"""One growing, bounded hold for batches held back by something outside their records.

The database refusing writes, the schema registry out of reach, a table that does not fit its
schema, a record that stopped its partition, a topic without a table yet: each holds the member's
batches for a wait that grows with each failure, up to a bound, and says why on `/readyz`
meanwhile. The poll loop keeps turning (Kafka's group needs it), so no tenacity `Retrying` call
can own the wait; the hold only says when the next try may be, by tenacity's own wait functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from tenacity import RetryCallState, Retrying, wait_exponential
from tenacity.wait import wait_base

log = logging.getLogger("bridge.consumer")

_GROWING = wait_exponential(multiplier=1, max=30)  # 1, 2, 4 ... 30 s
# A hold that goes on for the same reason is logged when it starts, then again after these
# many seconds, each time twice as long up to the last: an hour-long hold of an epoch whose
# query is gone writes a dozen lines, not one every few seconds. Each try is at DEBUG.
_FIRST_REPEAT_S, _LAST_REPEAT_S = 60.0, 3600.0


@dataclass
class HoldBackoff:
    """While batches are held back: when to try again, and what `/readyz` says meanwhile."""

    what: str  # heads the `/readyz` reason: "schema registry unavailable"
    consequence: str  # says in the log what waits: "the batch waits for its schemas"
    wait: wait_base = _GROWING
    recovered: str | None = None  # logged when it clears after a failure: "... again"
    level: int = logging.ERROR  # of each failure's log line
    # `/readyz` says it once it has held this long: a hold that is part of the normal flow
    # (records waiting for an epoch's publication) is a reason only when it lasts.
    reason_after_s: float = 0.0
    current: str | None = None  # why it holds now; None while it does not
    retry_at: float = 0.0  # monotonic: no batch before this
    # Where the records it holds start, per (topic, partition); empty when it holds no record
    # of its own (the database refusing writes). Their owner clears the hold once every one of
    # them has moved past (an offsets reset, a skip) or left the member: on an idle topic no
    # batch comes to clear it.
    at: dict[tuple[str, int], int] = field(default_factory=dict)
    _since: float = 0.0
    _logged_at: float = 0.0  # monotonic: when the hold's reason was last logged at `level`
    _repeat_s: float = _FIRST_REPEAT_S
    _attempt: RetryCallState = field(
        default_factory=lambda: RetryCallState(Retrying(), None, (), {}), repr=False
    )

    def failed(self, why: str, at: Mapping[tuple[str, int], int] | None = None) -> None:
        now = time.monotonic()
        if self.current is None:
            self._since = now
            self._attempt.attempt_number = 0
        level = self.level
        if why != self.current:  # a hold that starts, or a new reason: said at once
            self._logged_at, self._repeat_s = now, _FIRST_REPEAT_S
        elif now - self._logged_at >= self._repeat_s:
            self._logged_at, self._repeat_s = now, min(self._repeat_s * 2, _LAST_REPEAT_S)
        else:
            level = logging.DEBUG
        self.current, self.at = why, dict(at or {})
        self._attempt.attempt_number += 1
        delay = self.wait(self._attempt)
        self.retry_at = now + delay
        held = f"held {now - self._since:.0f}s, try {self._attempt.attempt_number}; "
        log.log(level, "%s (%s); %s; %sretrying in %.1fs", self.what, why, self.consequence,
                held if self._attempt.attempt_number > 1 else "", delay)  # fmt: skip

    def cleared(self) -> None:
        if self.current is not None and self.recovered is not None:
            log.info("%s after %.0fs", self.recovered, time.monotonic() - self._since)
        self.current, self.retry_at, self.at = None, 0.0, {}

    def reasons(self) -> list[str]:
        held_s = time.monotonic() - self._since
        if self.current is None or held_s < self.reason_after_s:
            return []
        return [f"{self.what} for {held_s:.0f}s ({self.current})"]

    def wake(self) -> None:
        """What it waits for may be over: the next try is now."""
        self.retry_at = 0.0
