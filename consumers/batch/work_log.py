"""What the consumer says of its work in its log, at bounded rates.

- **Progress while catching up**: every `PROGRESS_EVERY_S` while the lag is more than a batch,
  one line with the records applied since the last line, their rate, the lag and the partitions
  held; and one line when it has caught up. A member that keeps up says nothing.
- **Each dead letter**, once its batch committed: its coordinates and why, up to
  `DEAD_LETTER_LINES` lines in each `DEAD_LETTER_WINDOW_S`; past that, one line at the end of
  the window counts the rest (they are all in the dead-letter table and its metric).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from consumers.tables.applier import DeadLetterNote

log = logging.getLogger("bridge.consumer")

PROGRESS_EVERY_S = 10.0
DEAD_LETTER_LINES = 20
DEAD_LETTER_WINDOW_S = 60.0


class WorkLog:
    def __init__(
        self,
        *,
        dead_letters_table: str,
        behind_at: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`behind_at`: a lag above this many records is catching up (a full batch)."""
        self._table = dead_letters_table
        self._behind_at = behind_at
        self._clock = clock
        now = clock()
        self._catching_up = False
        self._since, self._applied = now, 0  # the records applied since the last line
        self._window, self._logged, self._unlogged = now, 0, 0

    def committed(
        self, applied: int, dead_letters: Sequence[DeadLetterNote], *, lag: int, partitions: int
    ) -> None:
        """A batch committed: `applied` records written, `dead_letters` among its records."""
        now = self._clock()
        self._applied += applied
        self._dead_letters(dead_letters, now)
        self.tick(lag=lag, partitions=partitions, now=now)

    def tick(self, *, lag: int, partitions: int, now: float | None = None) -> None:
        """Whatever is due now: a progress line, the end of a dead-letter window."""
        now = self._clock() if now is None else now
        self._end_window(now)
        behind = lag > self._behind_at
        if behind and not self._catching_up:
            self._catching_up, self._since, self._applied = True, now, 0
        elif behind and now - self._since >= PROGRESS_EVERY_S:
            self._progress("catching up", lag, partitions, now)
        elif not behind and self._catching_up:
            self._catching_up = False
            self._progress("caught up", lag, partitions, now)

    def _progress(self, state: str, lag: int, partitions: int, now: float) -> None:
        seconds = max(now - self._since, 1e-9)
        rate = self._applied / seconds
        log.info(
            "%s: %d records applied in %.0fs (%.0f/s), lag %d over %d partitions",
            state, self._applied, seconds, rate, lag, partitions,
            extra={"applied": self._applied, "per_second": round(rate), "lag": lag,
                   "partitions": partitions},
        )  # fmt: skip
        self._since, self._applied = now, 0

    def _dead_letters(self, notes: Sequence[DeadLetterNote], now: float) -> None:
        self._end_window(now)
        for note in notes:
            if self._logged >= DEAD_LETTER_LINES:
                self._unlogged += 1
                continue
            self._logged += 1
            log.warning(
                "dead letter: %s[%d] offset %d: %s",
                note.topic, note.partition, note.offset, note.error,
                extra={"topic": note.topic, "partition": note.partition, "offset": note.offset,
                       "error": note.error},
            )  # fmt: skip

    def _end_window(self, now: float) -> None:
        if now - self._window < DEAD_LETTER_WINDOW_S:
            return
        if self._unlogged:
            log.warning(
                "%d more dead letters in the last %.0fs, not logged one by one; all are in %s",
                self._unlogged, now - self._window, self._table,
                extra={"dead_letters": self._unlogged},
            )  # fmt: skip
        self._window, self._logged, self._unlogged = now, 0, 0
