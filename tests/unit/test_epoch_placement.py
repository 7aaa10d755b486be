"""Each record's epoch from the offsets a part names (`consumers.epochs.placement`), and the
offsets a task's delivery reports name (`bridge.delivered_offsets`), on records made here."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

from bridge.delivered_offsets import MAX_RANGES, DeliveredOffsets
from bridge.epoch_manifest import Part, parse
from bridge.names import (
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
    PROVENANCE_WHOLE,
    WHOLE_EPOCHS,
)
from consumers.epochs.placement import Placed, Placement

TOPIC, QUERY = "orders", "q-1"
KEY = (TOPIC, 0)


def provenance(epoch: int, task: int) -> list[tuple[str, str | bytes | None]]:
    return [
        (PROVENANCE_QUERY, QUERY.encode()),
        (PROVENANCE_PARTITION, str(task).encode()),
        (PROVENANCE_EPOCH, str(epoch).encode()),
        (PROVENANCE_WHOLE, WHOLE_EPOCHS),
    ]


def record(offset: int, headers: list[tuple[str, str | bytes | None]] | None) -> Message:
    return Message(TOPIC, 0, offset, None, b"{}", headers, None, (1, 0))


def part(epoch: int, task: int, *ranges: tuple[int, int]) -> Part:
    count = sum(last - first + 1 for first, last in ranges)
    return Part(query=QUERY, epoch=epoch, partition=task, records={TOPIC: count},
                offsets={TOPIC: {0: ranges}})  # fmt: skip


def placed(runs: list[Placed]) -> list[tuple[tuple[str, int] | None, int, list[int]]]:
    return [(r.epoch, r.spark_partition, [m.offset() for m in r.records]) for r in runs]  # type: ignore[misc]


def test_records_inside_a_parts_ranges_are_its_tasks_with_only_the_ends_headers_read() -> None:
    # Two tasks' batches interleaved in the partition, a commit marker at 6 and 10. The middle
    # records carry no headers: were they read, they would be dead letters.
    ends = {0, 2, 3, 5, 7, 9}
    records = [
        record(o, (provenance(4, 0) if o < 3 or o > 6 else provenance(4, 1)) if o in ends else None)
        for o in (0, 1, 2, 3, 4, 5, 7, 8, 9)
    ]
    placement = Placement(lambda topic: topic == TOPIC)
    placement.learn(part(4, 0, (0, 2), (7, 9)))
    placement.learn(part(4, 1, (3, 5)))
    assert placed(list(placement.runs(KEY, records))) == [
        ((QUERY, 4), 0, [0, 1, 2]),
        ((QUERY, 4), 1, [3, 4, 5]),
        ((QUERY, 4), 0, [7, 8, 9]),
    ]


def test_records_outside_every_range_are_placed_by_their_headers() -> None:
    # A part of an older sink (no offsets) between two that name theirs, and a record of
    # another producer: by headers, of no epoch.
    records = [
        *(record(o, provenance(1, 0)) for o in (0, 1)),
        record(2, provenance(1, 1)),
        record(3, None),
        record(4, provenance(1, 2)),
    ]
    placement = Placement(lambda topic: topic == TOPIC)
    placement.learn(part(1, 0, (0, 1)))
    placement.learn(part(1, 2, (4, 4)))
    assert placed(list(placement.runs(KEY, records))) == [
        ((QUERY, 1), 0, [0, 1]),
        ((QUERY, 1), 1, [2]),
        (None, -1, [3]),
        ((QUERY, 1), 2, [4]),
    ]
    assert [r.bare for r in placement.runs(KEY, records)] == [False, False, True, False]


def test_ranges_that_do_not_speak_of_these_records_are_forgotten_and_headers_read() -> None:
    # The topic made again: an old part's ranges name offsets that other records hold now.
    records = [record(o, provenance(9, 3)) for o in range(4)]
    placement = Placement(lambda topic: topic == TOPIC)
    placement.learn(part(1, 0, (0, 3)))
    assert placed(list(placement.runs(KEY, records))) == [((QUERY, 9), 3, [0, 1, 2, 3])]
    placement.learn(part(9, 3, (4, 5)))
    later = [record(4, provenance(9, 3)), record(5, provenance(9, 3))]
    assert placed(list(placement.runs(KEY, later))) == [((QUERY, 9), 3, [4, 5])]


def test_ranges_behind_the_records_are_forgotten_and_a_rewind_reads_headers() -> None:
    placement = Placement(lambda topic: topic == TOPIC)
    placement.learn(part(1, 0, (0, 1)))
    placement.learn(part(2, 0, (2, 4)))
    later = [record(2, provenance(2, 0)), record(3, None), record(4, provenance(2, 0))]
    assert placed(list(placement.runs(KEY, later))) == [((QUERY, 2), 0, [2, 3, 4])]
    again = [record(0, provenance(1, 0)), record(1, None)]  # fetched again: range 0-1 forgotten
    assert placed(list(placement.runs(KEY, again))) == [((QUERY, 1), 0, [0]), (None, -1, [1])]


def test_a_batch_ending_inside_a_range_is_placed_up_to_its_end() -> None:
    placement = Placement(lambda topic: topic == TOPIC)
    placement.learn(part(1, 0, (0, 9)))
    first = [record(o, provenance(1, 0)) for o in range(4)]
    assert placed(list(placement.runs(KEY, first))) == [((QUERY, 1), 0, [0, 1, 2, 3])]
    rest = [record(o, provenance(1, 0)) for o in range(4, 10)]
    assert placed(list(placement.runs(KEY, rest))) == [((QUERY, 1), 0, [4, 5, 6, 7, 8, 9])]


def delivered(topic: str, partition: int, offset: int) -> Message:
    return Message(topic, partition, offset, None, b"v", None, None, (1, 0))


def test_delivery_reports_become_ranges_per_topic_partition_that_a_part_carries() -> None:
    reports = DeliveredOffsets()
    for partition, offset in [(0, 5), (1, 0), (0, 6), (0, 7), (1, 1), (0, 9), (1, 2)]:
        reports(None, delivered(TOPIC, partition, offset))
    reports(None, delivered("lines", 0, 3))
    ranges = reports.ranges({TOPIC: 7, "lines": 1, "empty": 0})
    assert ranges == {TOPIC: {0: ((5, 7), (9, 9)), 1: ((0, 2),)}, "lines": {0: ((3, 3),)}}
    written = Part(query=QUERY, epoch=1, partition=0, records={TOPIC: 7, "lines": 1},
                   offsets=ranges)  # fmt: skip
    assert parse(written.encode()) == written
    assert reports.ranges({TOPIC: 8, "lines": 1}) is None  # a record not reported


def test_no_ranges_when_a_record_failed_came_out_of_order_or_they_are_too_many() -> None:
    failed = DeliveredOffsets()
    failed(None, delivered(TOPIC, 0, 0))
    failed(KafkaError(KafkaError._MSG_TIMED_OUT), delivered(TOPIC, 0, -1))
    assert failed.ranges({TOPIC: 1}) is None
    unordered = DeliveredOffsets()
    unordered(None, delivered(TOPIC, 0, 4))
    unordered(None, delivered(TOPIC, 0, 2))
    assert unordered.ranges({TOPIC: 2}) is None
    scattered = DeliveredOffsets()
    for offset in range(0, 2 * (MAX_RANGES + 1), 2):
        scattered(None, delivered(TOPIC, 0, offset))
    assert scattered.ranges({TOPIC: MAX_RANGES + 1}) is None


def test_only_whole_topics_ranges_are_kept_and_at_most_ten_thousand_a_partition() -> None:
    placement = Placement(lambda topic: topic == TOPIC)
    other = Part(query=QUERY, epoch=1, partition=0, records={"lines": 2},
                 offsets={"lines": {0: ((0, 1),)}})  # fmt: skip
    placement.learn(other)  # a topic of no whole route: its ranges are not kept
    lines = [Message("lines", 0, o, None, b"{}", None, None, (1, 0)) for o in (0, 1)]
    assert placed(list(placement.runs(("lines", 0), lines))) == [(None, -1, [0, 1])]
    # A range of three, then 10,000 of one: the first is forgotten, so its middle record
    # (no headers: placed by its range it would be the task's) is read by its headers.
    placement.learn(part(1, 0, (0, 2), *((2 * o, 2 * o) for o in range(2, 10_002))))
    oldest = [record(0, provenance(1, 0)), record(1, None), record(2, provenance(1, 0))]
    assert placed(list(placement.runs(KEY, oldest))) == [
        ((QUERY, 1), 0, [0]),
        (None, -1, [1]),
        ((QUERY, 1), 0, [2]),
    ]
    kept = [record(4, provenance(1, 0))]
    assert placed(list(placement.runs(KEY, kept))) == [((QUERY, 1), 0, [4])]
