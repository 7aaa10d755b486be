"""The driver's view of each epoch: one log line, and counters kept in a small JSON file.

Spark calls the sink's commit and abort hooks in a fresh Python worker each time, so nothing
survives in memory between epochs; the counters live in the file named by the sink option
`progress.path` (the producer job puts it in its checkpoint directory), where `bridge` and a
metrics exporter can read them.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spark_jobs.epoch_transaction import EpochOutcome

log = logging.getLogger("bridge.sink")

# The steps of a write task that opened a transaction, in order (EpochOutcome's *_seconds).
STEPS = ("first_batch", "setup", "init", "marker", "produce", "commit")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


@dataclass(frozen=True, kw_only=True)
class EpochSummary:
    epoch: int
    rows: int
    partitions_written: tuple[int, ...]
    bytes: int = 0
    partitions_skipped: tuple[int, ...]
    partitions_empty: int = 0
    partitions_missing: int = 0  # tasks that sent no outcome (only in an abort)
    # Per task that opened a transaction: setup + init + marker read + commit, the cost of
    # exactly-once; and each step of the task's time (see STEPS) for the benchmark's breakdown.
    transaction_overhead_ms: tuple[float, ...] = ()
    steps_ms: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # Wall clock: the first task's start, the last task's end, and this record (the driver's
    # commit hook), so that the time Spark takes around the tasks can be told apart.
    tasks_started_at: float | None = None
    tasks_finished_at: float | None = None
    recorded_at: float | None = None

    @classmethod
    def of(cls, epoch: int, outcomes: Sequence[EpochOutcome | None]) -> EpochSummary:
        done = [o for o in outcomes if o is not None]
        written = [o for o in done if not o.empty]
        timed = [o for o in done if o.started_at > 0]
        return cls(
            epoch=epoch,
            rows=sum(o.rows for o in done),
            bytes=sum(o.bytes for o in done),
            partitions_written=tuple(
                sorted(o.partition for o in done if not (o.skipped or o.empty))
            ),
            partitions_skipped=tuple(sorted(o.partition for o in done if o.skipped)),
            partitions_empty=sum(1 for o in done if o.empty),
            transaction_overhead_ms=tuple(
                _ms(o.setup_seconds + o.init_seconds + o.marker_seconds + o.commit_seconds)
                for o in written
            ),
            steps_ms={
                step: tuple(_ms(getattr(o, f"{step}_seconds")) for o in written) for step in STEPS
            },
            tasks_started_at=min((o.started_at for o in timed), default=None),
            tasks_finished_at=max((o.finished_at for o in timed), default=None),
            recorded_at=time.time(),
            partitions_missing=len(outcomes) - len(done),
        )

    def line(self, verdict: str) -> str:
        return (
            f"epoch {self.epoch} {verdict}: {self.rows} rows, "
            f"{len(self.partitions_written)} partitions written, "
            f"{len(self.partitions_skipped)} skipped as already committed"
            + (f", {self.partitions_empty} empty" if self.partitions_empty else "")
            + (f", {self.partitions_missing} failed" if self.partitions_missing else "")
        )


@dataclass(kw_only=True)
class SinkCounters:
    epochs_committed: int = 0
    epochs_aborted: int = 0
    rows_written: int = 0
    partitions_written: int = 0
    partitions_skipped: int = 0
    last_committed_epoch: int | None = None
    recent: list[dict[str, object]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> SinkCounters:
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            return cls()

    def save(self, path: Path) -> None:
        # Write then rename, so a reader never sees half a file and a crash keeps the old one.
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(prefix=path.name, dir=path.parent)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out, indent=1)
        Path(scratch).replace(path)

    def add(self, summary: EpochSummary, *, committed: bool) -> None:
        self.rows_written += summary.rows
        self.partitions_written += len(summary.partitions_written)
        self.partitions_skipped += len(summary.partitions_skipped)
        if committed:
            # A replayed epoch is committed again: count it once.
            if self.last_committed_epoch is None or summary.epoch > self.last_committed_epoch:
                self.epochs_committed += 1
                self.last_committed_epoch = summary.epoch
        else:
            self.epochs_aborted += 1
        self.recent = [*self.recent, {"committed": committed, **asdict(summary)}][-50:]


def record_epoch(
    epoch: int, outcomes: Sequence[EpochOutcome | None], *, committed: bool, path: str | None
) -> EpochSummary:
    summary = EpochSummary.of(epoch, outcomes)
    if committed:
        log.info(summary.line("committed"))
    else:
        # Partitions that committed in Kafka stay committed; the replay will skip them.
        log.warning(summary.line("aborted by Spark"))
    if path is not None:
        counters = SinkCounters.load(Path(path))
        counters.add(summary, committed=committed)
        counters.save(Path(path))
    return summary
