"""What the soak checks, independently of the service's own counters: progress and stalls from
the offsets table as PostgreSQL has it, and at the end every record Kafka committed against
every row and dead letter PostgreSQL holds."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.soak_faults import Fault
from bridge.kafka_admin import KafkaAdmin
from tests.kafka_helpers import read_messages


@dataclass
class Progress:
    """Samples, once a second, each partition's stored offset for the group. Any move backwards
    is logged (nothing in a soak resets offsets); every forward move is progress."""

    dsn: str
    schema: str
    group: str
    moves: list[float] = field(default_factory=list)  # monotonic times at which offsets advanced
    backwards: list[dict[str, Any]] = field(default_factory=list)
    last: dict[tuple[str, int], int] = field(default_factory=dict)
    # (monotonic time, the sum of the stored offsets): records into PostgreSQL over time
    timeline: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def sample(self) -> dict[tuple[str, int], int] | None:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                conn.execute("SET statement_timeout = 3000")
                rows = conn.execute(
                    f'SELECT topic, partition, next_offset FROM "{self.schema}".offsets '
                    "WHERE group_id = %s",
                    (self.group,),
                ).fetchall()
        except psycopg.Error:
            return None  # PostgreSQL is down or paused: no observation
        return {(topic, partition): offset for topic, partition, offset in rows}

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            now = self.sample()
            if now is None:
                continue
            moved = False
            for key, offset in now.items():
                before = self.last.get(key)
                if before is not None and offset < before:
                    self.backwards.append(
                        {"partition": key[1], "from": before, "to": offset, "at": time.time()}
                    )
                moved = moved or before is None or offset > before
                self.last[key] = offset
            if moved:
                self.moves.append(time.monotonic())
            self.timeline.append((time.monotonic(), sum(now.values())))


@dataclass
class KafkaTimeline:
    """Samples, every two seconds, the sum of the topic's last stable offsets: records committed
    into Kafka over time (transaction markers included, one per partition and transaction). A
    sample the cluster cannot answer in 3 s is skipped, as during a fault it may not."""

    bootstrap: str
    topic: str
    partitions: int
    timeline: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kafka-timeline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _loop(self) -> None:
        admin = KafkaAdmin({"bootstrap.servers": self.bootstrap}, timeout=3)
        while not self._stop.wait(2.0):
            try:
                ranges = admin.log_ranges((self.topic, p) for p in range(self.partitions))
            except Exception:  # noqa: BLE001 - a broker down or cut off: no observation
                # A fresh client for the next try: in the 41-minute soak at 27b436c one that
                # had failed kept failing for minutes after the fault had healed.
                admin = KafkaAdmin({"bootstrap.servers": self.bootstrap}, timeout=3)
                continue
            self.timeline.append((time.monotonic(), sum(r.last_stable for r in ranges.values())))


def rates(timeline: list[tuple[float, int]], origin: float) -> list[list[float]]:
    """[seconds since `origin`, records per second since the sample before] for each sample."""
    return [
        [round(b[0] - origin, 1), round((b[1] - a[1]) / (b[0] - a[0]), 1)]
        for a, b in itertools.pairwise(timeline)
        if b[0] > a[0]
    ]


def longest_stall(moves: list[float], faults: Iterable[Fault], start: float, end: float) -> float:
    """The longest time without progress that no fault explains: each gap between two moves,
    less the part of it that a fault was active for."""
    windows = [(f.started, f.healed) for f in faults]
    points = [start, *(m for m in moves if start <= m <= end), end]
    longest = 0.0
    for a, b in itertools.pairwise(points):
        covered = _covered(windows, a, b)
        longest = max(longest, (b - a) - covered)
    return longest


def _covered(windows: list[tuple[float, float]], a: float, b: float) -> float:
    clipped = sorted((max(a, s), min(b, e)) for s, e in windows if s < b and e > a)
    total, reach = 0.0, a
    for s, e in clipped:
        s = max(s, reach)
        if e > s:
            total += e - s
            reach = e
    return total


def rate_rows_committed(checkpoint: Path, rows_per_second: int) -> int:
    """How many rows the epochs Spark committed hold: every id below it must be in Kafka.

    The rate source numbers its rows 0, 1, 2, ... at `rows_per_second` from its start, and its
    offset (the last line of `offsets/<epoch>`) is the seconds it has covered. Rows above it
    belong to an epoch the query was stopped in: a restart would replay it, so part of it in
    Kafka is no loss (a doubled id would still be caught)."""
    commits = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    if not commits:
        return 0
    seconds = (checkpoint / "offsets" / str(max(commits))).read_text().split()[-1]
    return int(seconds) * rows_per_second


def epoch_in_flight(checkpoint: Path) -> bool:
    """Whether the query's last planned epoch (`offsets/<n>`) has no commit (`commits/<n>`):
    it stopped mid-epoch, and its next run replays that epoch."""

    def numbered(directory: str) -> list[int]:
        found = checkpoint / directory
        return [int(p.name) for p in found.iterdir() if p.name.isdigit()] if found.exists() else []

    planned, committed = numbered("offsets"), numbered("commits")
    return bool(planned) and max(planned) > max(committed, default=-1)


@dataclass(frozen=True)
class Verdict:
    produced: int  # distinct ids committed in Kafka
    epochs_complete_below: int  # every id below this must be there
    lost: int
    doubled: int
    kafka_doubled: int
    kafka_gaps: int
    aborted_in_table: int
    dead_letters_expected: int
    dead_letters_found: int
    dead_letters_wrong: int

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.doubled == 0
            and self.kafka_doubled == 0
            and self.kafka_gaps == 0
            and self.aborted_in_table == 0
            and self.dead_letters_wrong == 0
        )


def committed_in_kafka(
    bootstrap: str, topic: str, partitions: int
) -> tuple[Counter[int], set[tuple[int, int]]]:
    """Every id a read_committed reader sees, with how often, and the coordinates of every
    record that is not an id (the poison records)."""
    ids: Counter[int] = Counter()
    others: set[tuple[int, int]] = set()
    for message in read_messages(bootstrap, topic, partitions=partitions, timeout=300):
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None
        try:
            value = json.loads(message.value() or b"")
            ids[int(value["value"])] += 1
        except (ValueError, TypeError, KeyError):
            others.add((partition, offset))
    return ids, others


def verdict(
    *,
    dsn: str,
    table: str,
    schema: str,
    group: str,
    topic: str,
    kafka_ids: Counter[int],
    kafka_others: set[tuple[int, int]],
    poison: set[tuple[int, int]],
    aborted: set[int],
    complete_below: int,
) -> Verdict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        in_table: Counter[int] = Counter(
            dict(conn.execute(f"SELECT value, count(*) FROM {table} GROUP BY value").fetchall())
        )
        dead = {
            (partition, offset)
            for partition, offset in conn.execute(
                f'SELECT partition, "offset" FROM "{schema}".dead_letters '
                "WHERE group_id = %s AND topic = %s",
                (group, topic),
            ).fetchall()
        }
    rate_ids = {i for i in kafka_ids if i >= 0}
    return Verdict(
        produced=len(rate_ids),
        epochs_complete_below=complete_below,
        lost=sum(1 for i in rate_ids if in_table[i] == 0),
        doubled=sum(n - 1 for i, n in in_table.items() if n > 1),
        kafka_doubled=sum(n - 1 for n in kafka_ids.values() if n > 1),
        # A hole below the committed epochs' end is a row the sink lost.
        kafka_gaps=sum(1 for i in range(complete_below) if i not in rate_ids),
        aborted_in_table=sum(1 for i in in_table if i in aborted or i < 0),
        dead_letters_expected=len(poison),
        dead_letters_found=len(dead),
        dead_letters_wrong=len(dead ^ poison) + len(kafka_others ^ poison),
    )
