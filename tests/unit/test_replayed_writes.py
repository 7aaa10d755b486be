"""The replay filter of routes applied per partition (`consumers.batch.replays`): which records
of a Kafka partition are a second committed write of a task's epoch, from the runs it carried."""

from __future__ import annotations

import itertools

from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from consumers.batch.replays import MAX_RUNS, ReplayFilter, Split, attempt_of
from consumers.database.offsets import Lease, PartitionKey, Run
from consumers.decoding.records import offset_of

TOPIC, WHOLE_TOPIC = "orders", "ledger"
KEY: PartitionKey = (TOPIC, 0)
_OFFSETS = itertools.count()


def written(
    epoch: int, attempt: str, n: int = 2, *, part: int = 0, query: str = "q", whole: bool = False,
    topic: str = TOPIC,
) -> list[Message]:  # fmt: skip
    """`n` records of one task attempt, as the sink writes them, at the partition's next
    offsets."""
    headers: list[tuple[str, str | bytes | None]] = [
        ("bridge.query", query.encode()),
        ("bridge.partition", str(part).encode()),
        ("bridge.epoch", str(epoch).encode()),
        ("bridge.attempt", attempt.encode()),
    ]
    if whole:
        headers.append(("bridge.epochs", b"whole"))
    return [
        Message(topic=topic, partition=0, offset=next(_OFFSETS), value=b"{}", headers=headers)
        for _ in range(n)
    ]


def of_another_producer(n: int = 1) -> list[Message]:
    return [Message(topic=TOPIC, partition=0, offset=next(_OFFSETS), value=b"{}")
            for _ in range(n)]  # fmt: skip


class Leases:
    def __init__(self, *, epoch: int = 1, runs: tuple[Run, ...] = ()) -> None:
        self.epoch, self.runs = epoch, runs

    def __call__(self, key: PartitionKey) -> Lease:
        return Lease(topic=key[0], partition=key[1], epoch=self.epoch, next_offset=0,
                     runs=self.runs)  # fmt: skip


def split(
    replays: ReplayFilter, leases: Leases, *runs: list[Message], key: PartitionKey = KEY
) -> Split:
    return replays.split({key: list(itertools.chain(*runs))}, leases)


def offsets(records: list[Message]) -> list[int]:
    return [offset_of(r) for r in records]


def whole_ledger(topic: str) -> bool:
    return topic == WHOLE_TOPIC


def test_a_second_write_of_an_epoch_and_an_earlier_epoch_are_left_out() -> None:
    replays, leases = ReplayFilter(applies_whole=whole_ledger), Leases()
    first, more, again, earlier, after = (written(5, "a"), written(5, "a"), written(5, "b"),
                                          written(4, "c"), written(6, "d"))  # fmt: skip
    one = split(replays, leases, first)
    assert offsets(one.kept[KEY]) == offsets(first) and not one.skipped
    assert one.runs == {KEY: (Run("q", 0, 5, "a"),)}
    # The same attempt in the next batch: kept, the runs unchanged, nothing to store.
    two = split(replays, leases, more, again, earlier, after)
    assert offsets(two.kept[KEY]) == offsets(more) + offsets(after)
    assert two.skipped == {(TOPIC, 0, o) for o in offsets(again) + offsets(earlier)}
    assert [(r.epoch, r.records, r.first_offset) for r in two.replayed] == [
        (5, 2, offset_of(again[0])), (4, 2, offset_of(earlier[0]))
    ]  # fmt: skip
    assert two.runs == {KEY: (Run("q", 0, 6, "d"),)}
    assert not split(replays, leases, written(6, "d")).runs


def test_tasks_interleaved_in_a_partition_are_told_apart_by_query_and_spark_partition() -> None:
    replays, leases = ReplayFilter(applies_whole=whole_ledger), Leases()
    p0, p1, other = written(3, "x", part=0), written(3, "y", part=1), written(3, "z", query="r")
    found = split(replays, leases, p0[:1], p1[:1], other, p0[1:], p1[1:])
    assert not found.skipped
    assert set(found.runs[KEY]) == {Run("q", 0, 3, "x"), Run("q", 1, 3, "y"), Run("r", 0, 3, "z")}
    assert split(replays, leases, written(3, "w", part=1)).skipped  # partition 1 again


def test_records_without_an_attempt_and_whole_epochs_records_are_never_left_out() -> None:
    replays, leases = ReplayFilter(applies_whole=whole_ledger), Leases()
    split(replays, leases, written(5, "a"), written(5, "a", topic=WHOLE_TOPIC, whole=True))
    plain = of_another_producer(3)
    # Records of the sink before attempts were stamped: three provenance headers only.
    old = [Message(topic=TOPIC, partition=0, offset=next(_OFFSETS), value=b"{}",
                   headers=[("bridge.query", b"q"), ("bridge.partition", b"0"),
                            ("bridge.epoch", b"1")])]  # fmt: skip
    found = split(replays, leases, plain, old)
    assert offsets(found.kept[KEY]) == offsets(plain) + offsets(old) and not found.skipped
    # A whole route's records are the ledger's to tell (its watermark), even written twice...
    ledger_key = (WHOLE_TOPIC, 0)
    whole = written(5, "b", topic=WHOLE_TOPIC, whole=True)
    assert not split(replays, leases, whole, key=ledger_key).skipped
    # ... but not those of a sink with `epochs=per-partition` on it, applied per partition.
    per_partition = written(5, "b", topic=WHOLE_TOPIC)
    assert split(replays, leases, written(5, "a", topic=WHOLE_TOPIC), key=ledger_key).runs
    assert split(replays, leases, per_partition, key=ledger_key).skipped
    # And on a route applied per partition, the sink's whole marker changes nothing.
    assert split(replays, leases, written(5, "b", whole=True)).skipped


def test_the_runs_start_from_the_lease_and_go_back_to_it() -> None:
    leases = Leases(runs=(Run("q", 0, 7, "a"),))
    replays = ReplayFilter(applies_whole=whole_ledger)
    assert split(replays, leases, written(7, "b")).skipped, "the row says 7 was written by a"
    planned = split(replays, leases, written(8, "c"))  # a batch planned, then rewound
    assert planned.runs == {KEY: (Run("q", 0, 8, "c"),)}
    replays.rewound()
    assert not split(replays, leases, written(8, "d")).skipped, "8 by c never committed"
    # Claimed again (a new owner epoch): the row, not this member's memory, says.
    claimed = Leases(epoch=2, runs=(Run("q", 0, 9, "e"),))
    assert split(replays, claimed, written(8, "d")).skipped


def test_a_partition_keeps_its_most_recent_runs_only() -> None:
    replays, leases = ReplayFilter(applies_whole=whole_ledger), Leases()
    batches = [written(1, f"a{n}", n=1, part=n) for n in range(MAX_RUNS + 3)]
    found = split(replays, leases, *batches)
    runs = found.runs[KEY]
    assert len(runs) == MAX_RUNS
    assert [r.spark_partition for r in runs] == list(range(3, MAX_RUNS + 3))


def test_a_partition_not_held_is_passed_through() -> None:
    replays = ReplayFilter(applies_whole=whole_ledger)
    records = written(1, "a")
    found = replays.split({KEY: records}, lambda key: None)
    assert found.kept == {KEY: records} and not found.runs


def _headers() -> st.SearchStrategy[list[tuple[str, bytes | None]] | None]:
    names = st.sampled_from(["bridge.query", "bridge.partition", "bridge.epoch", "bridge.attempt",
                             "bridge.epochs", "x"])  # fmt: skip
    values = st.one_of(
        st.none(), st.binary(max_size=300), st.integers().map(lambda i: str(i).encode())
    )
    return st.one_of(st.none(), st.lists(st.tuples(names, values), max_size=8))


@given(_headers())
def test_any_headers_read_as_an_attempt_or_as_none_never_an_error(
    headers: list[tuple[str, bytes | None]] | None,
) -> None:
    found = attempt_of(headers)
    if found is not None:
        (query, _), (_, attempt) = found
        assert 0 < len(query.encode()) <= 200 and 0 < len(attempt.encode()) <= 64


def test_a_batch_committed_up_to_an_offset_stores_the_runs_its_records_there_leave() -> None:
    replays, leases = ReplayFilter(applies_whole=whole_ledger), Leases()
    fifth, sixth = written(5, "a"), written(6, "b")
    found = split(replays, leases, fifth, sixth)
    assert found.runs == {KEY: (Run("q", 0, 6, "b"),)}
    assert found.up_to(KEY, offset_of(sixth[0])).runs == {KEY: (Run("q", 0, 5, "a"),)}
    assert found.up_to(KEY, offset_of(sixth[1])).runs == found.runs
    assert found.up_to(KEY, offset_of(fifth[0])).runs == {}, "nothing of it committed"
    assert found.without([KEY]).runs == {}
