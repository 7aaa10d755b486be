"""Which records of a batch publish their epoch, wait in memory for the rest of it, or are staged
(`consumers.epochs.assembly`), on records made here: no broker, no database."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pytest
from confluent_kafka import Message

from bridge.epoch_manifest import Epoch, Part
from bridge.names import (
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
    PROVENANCE_WHOLE,
    WHOLE_EPOCHS,
)
from consumers.database.offsets import PartitionKey
from consumers.epochs.assembly import Assembled, EpochAssembly, LedgerLook, PendingEpochs
from consumers.epochs.ledger import Ahead, Judged

TOPIC, MANIFEST = "orders", "bridge-epochs"
QUERY = "q-1"


class Log:
    """A topic's partitions and the manifest's, written as the sink writes them."""

    def __init__(self) -> None:
        self.next: Counter[tuple[str, int]] = Counter()

    def _message(
        self,
        topic: str,
        partition: int,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]],
    ) -> Message:
        offset = self.next[topic, partition]
        self.next[topic, partition] += 2  # a commit marker after each: offsets have gaps
        return Message(topic, partition, offset, None, value, headers, None, (1, 0))

    def task(
        self, epoch: int, task: int, per_partition: dict[int, int], query: str = QUERY
    ) -> list[Message]:
        headers: list[tuple[str, str | bytes | None]] = [
            (PROVENANCE_QUERY, query.encode()),
            (PROVENANCE_PARTITION, str(task).encode()),
            (PROVENANCE_EPOCH, str(epoch).encode()),
            (PROVENANCE_WHOLE, WHOLE_EPOCHS),
        ]
        return [
            self._message(TOPIC, partition, b"{}", headers)
            for partition, n in per_partition.items()
            for _ in range(n)
        ]

    def part(self, epoch: int, task: int, records: int, query: str = QUERY) -> Message:
        part = Part(query=query, epoch=epoch, partition=task, records={TOPIC: records})
        return self._message(MANIFEST, 0, part.encode(), [])

    def epoch(self, epoch: int, tasks: Iterable[int], query: str = QUERY) -> Message:
        whole = Epoch(query=query, epoch=epoch, parts=tuple(tasks))
        return self._message(MANIFEST, 0, whole.encode(), [])


def by_partition(records: list[Message]) -> dict[PartitionKey, list[Message]]:
    found: dict[PartitionKey, list[Message]] = {}
    for record in records:
        found.setdefault((record.topic(), record.partition()), []).append(record)  # type: ignore[arg-type]
    return found


class Clock:
    """Monotonic seconds that move only when a test moves them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def assembly(
    *,
    in_full: bool = True,
    hold_records: int = 1000,
    hold_s: float = 60,
    clock: Clock | None = None,
) -> EpochAssembly:
    return EpochAssembly(
        group_id="g",
        manifest_topic=MANIFEST,
        whole_topic=lambda topic: topic == TOPIC,
        held_in_full=lambda topic: in_full,
        hold_records=hold_records,
        hold_s=hold_s,
        clock=clock or Clock(),
    )


def batch(found: EpochAssembly, records: list[Message]) -> Assembled:
    return found.assemble(by_partition(records), stored=lambda key: 0)


def offsets(assembled: Assembled, topic: str = TOPIC) -> dict[int, list[int]]:
    return {
        partition: [r.offset() for r in records]  # type: ignore[misc]
        for (t, partition), records in assembled.records.items()
        if t == topic
    }


def whole_epoch(log: Log, epoch: int, query: str = QUERY) -> list[Message]:
    """Two tasks of 3 records over partitions 0 and 1, their parts, the epoch's record."""
    records = [*log.task(epoch, 0, {0: 2, 1: 1}, query), *log.task(epoch, 1, {0: 1, 1: 2}, query)]
    return [*records, log.part(epoch, 0, 3, query), log.part(epoch, 1, 3, query),
            log.epoch(epoch, [0, 1], query)]  # fmt: skip


def test_an_epoch_whole_in_the_batch_is_published_by_it() -> None:
    log, found = Log(), assembly()
    done = batch(found, whole_epoch(log, 0))
    assert done.epochs == ((QUERY, 0),)
    assert done.judged == {
        (QUERY, 0): Judged(
            (0, 1), (TOPIC,), {0: {TOPIC: 3}, 1: {TOPIC: 3}}, {(TOPIC, 0): 0, (TOPIC, 1): 0}
        )
    }
    assert len(done.published[TOPIC]) == 6 and done.staged == {}
    assert offsets(done) == {0: [0, 2, 4], 1: [0, 2, 4]}
    assert found.holding() == 0


def test_an_epoch_in_two_polls_is_held_then_published_with_the_second() -> None:
    log, found = Log(), assembly()
    records = whole_epoch(log, 0)
    first = batch(found, records[:3])  # task 0's records; no part yet
    assert first.epochs == () and offsets(first) == {} and found.holding() == 3
    second = batch(found, records[3:])
    assert second.epochs == ((QUERY, 0),)
    assert offsets(second) == {0: [0, 2, 4], 1: [0, 2, 4]}  # the held ones first
    assert found.holding() == 0


def test_the_records_after_an_epoch_still_open_wait_and_those_before_commit() -> None:
    log, found = Log(), assembly()
    done_epoch = whole_epoch(log, 0)
    open_epoch = log.task(1, 0, {0: 2, 1: 2})
    done = batch(found, [*done_epoch, *open_epoch])
    assert done.epochs == ((QUERY, 0),)
    assert offsets(done) == {0: [0, 2, 4], 1: [0, 2, 4]}
    assert found.holding() == 4


def test_a_later_epoch_whole_waits_for_an_earlier_one_of_its_query() -> None:
    log, found = Log(), assembly()
    early = log.task(0, 0, {0: 1})  # epoch 0 in partition 0 only, never finished here
    late = whole_epoch(log, 1)
    done = batch(found, [*early, *late])
    assert done.epochs == ()
    assert found.holding() == 1 + 6  # epoch 1 waits behind epoch 0, in order


def test_records_are_staged_where_the_member_does_not_hold_every_partition() -> None:
    log, found = Log(), assembly(in_full=False)
    records = whole_epoch(log, 0)
    done = batch(found, records[:3])
    assert done.epochs == () and found.holding() == 0
    assert len(done.staged[TOPIC]) == 3 and offsets(done) == {0: [0, 2], 1: [0]}


def test_an_epoch_held_past_its_time_is_staged_and_later_ones_wait_for_its_publication() -> None:
    log, clock = Log(), Clock()
    found = assembly(hold_s=0.5, clock=clock)
    records = whole_epoch(log, 0)
    assert batch(found, records[:3]).epochs == () and found.holding() == 3
    clock.now += 0.25
    assert not found.due()
    clock.now += 0.25  # the bound itself (binary fractions: exact)
    assert found.due()
    staged = batch(found, [])
    assert len(staged.staged[TOPIC]) == 3 and found.holding() == 0
    # Its other records are staged too (part of it is in the ledger), and so is epoch 1 until
    # the publisher says epoch 0 is published.
    rest = batch(found, [*records[3:], *whole_epoch(log, 1)])
    assert rest.epochs == ()
    assert len(rest.staged.get(TOPIC, [])) + found.holding() == 3 + 6
    found.looked(LedgerLook())  # a look that found nothing: epoch 0 still holds them back
    assert batch(found, whole_epoch(log, 2)).epochs == ()
    found.looked(LedgerLook(published=((QUERY, 0),)))
    found.drop()  # as a rewind would: epochs 1 and 2 come again
    assert batch(found, whole_epoch(log, 3)).epochs == ((QUERY, 3),)


def test_more_records_than_the_bound_are_staged_not_held() -> None:
    log, found = Log(), assembly(hold_records=2)
    done = batch(found, log.task(0, 0, {0: 2, 1: 1}))
    assert found.holding() == 0 and len(done.staged[TOPIC]) == 3


def log_headers() -> list[tuple[str, str | bytes | None]]:
    return [(PROVENANCE_QUERY, b"q"), (PROVENANCE_PARTITION, b"0"), (PROVENANCE_EPOCH, b"0")]


def test_a_record_without_provenance_goes_to_its_table_now_and_a_broken_one_is_staged() -> None:
    found = assembly()
    other = Message(TOPIC, 0, 100, None, b"{}", [("trace", b"x")], None, (1, 0))
    whole = (PROVENANCE_WHOLE, WHOLE_EPOCHS)
    broken = Message(TOPIC, 1, 100, None, b"{}", [(PROVENANCE_QUERY, b"q"), whole], None, (1, 0))
    # A sink's record that says no epoch is whole (epochs=per-partition, an older release).
    per_partition = Message(TOPIC, 2, 100, None, b"{}", log_headers(), None, (1, 0))
    done = batch(found, [other, broken, per_partition])
    assert done.published[TOPIC] == [other, per_partition] and done.epochs == ()
    assert done.staged[TOPIC] == [broken]  # claims an epoch it does not name: a dead letter
    assert found.holding() == 0


def test_a_record_without_provenance_waits_behind_a_held_one_of_its_partition_only() -> None:
    log, found = Log(), assembly()
    held = log.task(0, 0, {0: 1})  # its epoch's manifest has not come: held
    after = Message(TOPIC, 0, 50, None, b"{}", None, None, (1, 0))
    beside = Message(TOPIC, 1, 50, None, b"{}", None, None, (1, 0))
    done = batch(found, [*held, after, beside])
    assert done.published[TOPIC] == [beside] and found.holding() == 2
    assert (TOPIC, 0) not in done.records


def test_a_record_without_provenance_behind_records_staged_in_its_batch_waits_for_them() -> None:
    """Nothing may be held, so the open epoch is staged; another producer's record after it in
    partition 0 would be overwritten by it at its publication: the partition is cut there and
    held (`behind`), not kept in memory; partition 1's goes now, and the guard names both."""
    log, found = Log(), assembly(hold_records=0)
    staged = log.task(0, 0, {0: 1})
    after = Message(TOPIC, 0, 50, None, b"{}", None, None, (1, 0))
    later = log.task(1, 0, {0: 1})
    beside = Message(TOPIC, 1, 50, None, b"{}", None, None, (1, 0))
    done = batch(found, [*staged, after, *later, beside])
    assert done.staged[TOPIC] == staged and done.published[TOPIC] == [beside]
    assert done.behind == {(TOPIC, 0): 50} and done.bare_firsts == {(TOPIC, 1): 50}
    assert offsets(done) == {0: [0], 1: [50]} and found.holding() == 0


def test_a_record_without_provenance_in_the_partition_of_an_epoch_staged_before_waits() -> None:
    log, found = Log(), assembly(hold_records=0)
    first = batch(found, log.task(0, 0, {0: 1}))
    found.settled(first.pending, published=True)  # committed: the epoch is staged
    after = Message(TOPIC, 0, 50, None, b"{}", None, None, (1, 0))
    assert batch(found, [after]).behind == {(TOPIC, 0): 50}
    found.looked(LedgerLook(published=((QUERY, 0),)))
    again = batch(found, [after])
    assert again.behind == {} and again.published[TOPIC] == [after]


def bare(log: Log, partition: int = 0) -> Message:
    """Another producer's record: no provenance headers."""
    return log._message(TOPIC, partition, b"{}", [])


def test_a_record_of_no_epoch_between_two_tasks_of_a_staged_epoch_goes_ahead_of_it() -> None:
    """What the soak met: epoch 0's task 0 staged in partition 0, then another producer's
    record, then task 1's. The epoch cannot be whole before the record is passed: it goes
    ahead of the epoch instead of holding its partition for ever."""
    log, found = Log(), assembly(hold_records=0)
    first = batch(found, log.task(0, 0, {0: 1}))
    found.settled(first.pending, published=False)
    between = bare(log)
    later = log.task(0, 1, {0: 1})
    done = batch(found, [between, *later])
    assert done.behind == {} and done.published[TOPIC] == [between]
    assert done.staged[TOPIC] == later
    assert done.ahead == {(TOPIC, 0): Ahead(2, 2, frozenset({(QUERY, 0)}), 1)}
    assert done.bare_firsts == {(TOPIC, 0): 2}


def test_a_record_of_no_epoch_goes_ahead_of_an_epoch_whose_part_names_records_after_it() -> None:
    """Task 1's records are not in hand (the partition held at the record of no epoch), but
    its part, read from the manifest, names them after it."""
    log, found = Log(), assembly(hold_records=0)
    first = batch(found, log.task(0, 0, {0: 1}))
    found.settled(first.pending, published=False)
    between = bare(log)
    assert batch(found, [between]).behind == {(TOPIC, 0): 2}
    part = Part(
        query=QUERY, epoch=0, partition=1, records={TOPIC: 1}, offsets={TOPIC: {0: ((4, 4),)}}
    )
    manifest = Message(MANIFEST, 0, 0, None, part.encode(), None, None, (1, 0))
    done = batch(found, [manifest, between])
    assert done.behind == {} and done.published[TOPIC] == [between]
    assert done.ahead[TOPIC, 0].epochs == {(QUERY, 0)}


def test_an_epoch_the_ledger_found_staged_before_no_longer_holds_its_later_records() -> None:
    """A member that never saw epoch 0 stage holds task 1's records for the epoch, and writes
    the record of no epoch before them; the ledger refuses that (`staged_before`). Told, it
    stages task 1's records and writes the record ahead of the epoch."""
    log, found = Log(), assembly()
    log.next[TOPIC, 0] = 2  # task 0's record, at 0, was staged by a member before this one
    between, later = bare(log), log.task(0, 1, {0: 1})
    first = batch(found, [between, *later])
    assert first.published[TOPIC] == [between] and first.ahead == {}  # refused, as it knew
    assert found.holding() == 1
    found.drop()  # the refused batch's partition goes back to its stored offset
    found.staged_before({(TOPIC, 0): [(QUERY, 0)]})
    done = batch(found, [between, *later])
    assert done.published[TOPIC] == [between] and done.staged[TOPIC] == later
    assert done.ahead[TOPIC, 0].epochs == {(QUERY, 0)} and found.holding() == 0


def test_a_record_of_no_epoch_before_a_staged_epochs_records_in_its_partition_goes_first() -> None:
    """Epoch 0 is staged from partition 1; in partition 0 all of its records come after the
    record of no epoch: nothing to wait for, nothing ahead of it."""
    log, found = Log(), assembly(hold_records=0)
    first = batch(found, log.task(0, 0, {1: 1}))
    found.settled(first.pending, published=False)
    before = bare(log)
    done = batch(found, [before, *log.task(0, 1, {0: 1})])
    assert done.published[TOPIC] == [before] and done.behind == {} and done.ahead == {}


def test_a_record_of_no_epoch_waits_for_a_staged_epoch_whose_records_are_all_before_it() -> None:
    """Epoch 0 is all before the record, epoch 1 on both sides of it: it waits for epoch 0."""
    log, found = Log(), assembly(hold_records=0)
    first = batch(found, [*log.task(0, 0, {0: 1}), *log.task(1, 0, {0: 1})])
    found.settled(first.pending, published=False)
    between = bare(log)
    done = batch(found, [between, *log.task(1, 1, {0: 1})])
    assert done.behind == {(TOPIC, 0): 4} and done.ahead == {}
    assert TOPIC not in done.published


def test_a_record_of_no_epoch_inside_an_epoch_in_one_batch_goes_ahead_once_it_is_staged() -> None:
    """Task 0, another producer's record and task 1 in one batch, the epoch's record not yet
    read and nothing held: the epoch is staged and the record goes ahead of it."""
    log, found = Log(), assembly(hold_records=0)
    task0, between, task1 = log.task(0, 0, {0: 1}), bare(log), log.task(0, 1, {0: 1})
    done = batch(found, [*task0, between, *task1])
    assert done.behind == {} and done.published[TOPIC] == [between]
    assert done.staged[TOPIC] == [*task0, *task1]
    assert done.ahead == {(TOPIC, 0): Ahead(2, 2, frozenset({(QUERY, 0)}), 1)}


def test_held_records_are_dropped_when_their_partition_is_fetched_again() -> None:
    log, found = Log(), assembly()
    records = whole_epoch(log, 0)
    batch(found, records[:3])
    assert found.holding() == 3
    again = batch(found, records)  # a rewind: the fetch starts at the held ones again
    assert again.epochs == ((QUERY, 0),)
    assert offsets(again) == {0: [0, 2, 4], 1: [0, 2, 4]}  # each record once


def test_held_records_of_a_partition_no_longer_ours_are_dropped() -> None:
    log, found = Log(), assembly()
    batch(found, log.task(0, 0, {0: 1, 1: 1}))
    done = found.assemble({}, stored=lambda key: None if key == (TOPIC, 1) else 0)
    assert offsets(done) == {} and found.holding() == 1


def test_a_batch_refused_and_written_again_staged_its_epochs() -> None:
    log, found = Log(), assembly()
    done = batch(found, whole_epoch(log, 0))
    found.settled(done.pending, published=False)
    assert batch(found, whole_epoch(log, 1)).epochs == ()
    found.published((QUERY, 0))
    assert batch(found, whole_epoch(log, 2)).epochs != ()


@pytest.mark.parametrize("queries", [["q-a", "q-b"]])
def test_queries_publish_independently(queries: list[str]) -> None:
    log, found = Log(), assembly()
    open_a = log.task(0, 0, {0: 1}, queries[0])
    whole_b = whole_epoch(log, 0, queries[1])
    done = batch(found, [*whole_b, *open_a])
    assert done.epochs == (("q-b", 0),)


def test_an_epoch_behind_another_querys_staged_records_in_its_partition_is_staged_too() -> None:
    """Query a's open epoch is staged (nothing may be held), and query b's whole epoch follows
    it in partition 0: published now, b's records would be applied before a's earlier ones."""
    log, found = Log(), assembly(hold_records=0)
    open_a = log.task(0, 0, {0: 1}, "q-a")
    whole_b = whole_epoch(log, 0, "q-b")
    done = batch(found, [*open_a, *whole_b])
    assert done.epochs == ()
    assert len(done.staged[TOPIC]) == 1 + 6 and found.holding() == 0


def test_an_epoch_in_the_partitions_of_another_querys_staged_epoch_waits_for_it() -> None:
    log, clock = Log(), Clock()
    found = assembly(hold_s=0.5, clock=clock)
    a_first = batch(found, log.task(0, 0, {0: 1}, "q-a"))  # held, then staged past its time
    assert a_first.epochs == ()
    clock.now += 0.5
    staged = batch(found, [])
    found.settled(staged.pending, published=True)
    assert len(staged.staged[TOPIC]) == 1
    b_behind = batch(found, whole_epoch(log, 0, "q-b"))  # partitions 0 and 1: behind a's
    assert b_behind.epochs == ()
    c_apart = log.task(0, 0, {2: 2}, "q-c")  # partition 2 only: nothing staged before it
    c_done = batch(found, [*c_apart, log.part(0, 0, 2, "q-c"), log.epoch(0, [0], "q-c")])
    assert c_done.epochs == (("q-c", 0),)
    found.looked(LedgerLook(published=(("q-a", 0),)))  # a published: b's next epochs go
    found.drop()
    assert batch(found, whole_epoch(log, 1, "q-d")).epochs == (("q-d", 1),)


def test_parts_committed_before_the_member_joined_are_read_from_the_ledger() -> None:
    """A member (re)joined after the manifest's parts were committed sees only the epoch's
    record: the ledger has the rest, asked between batches (through the publisher's look),
    once however many batches the epoch takes."""
    log = Log()
    found = assembly()
    records = whole_epoch(log, 0)
    assert batch(found, records[:3]).epochs == ()  # task 0's records; nothing of the manifest
    assert found.holding() == 3  # held meanwhile, as for a manifest still to come
    assert found.asking() == [(QUERY, 0)]
    assert not found.due()
    found.looked(LedgerLook(manifests={(QUERY, 0): (None, {0: {TOPIC: 3}, 1: {TOPIC: 3}})}))
    assert found.asking() == []
    assert found.due()  # the held records go in a batch even if nothing new comes
    done = batch(found, [*records[3:6], records[-1]])  # task 1's, and the epoch's record
    assert done.epochs == ((QUERY, 0),) and done.judged[QUERY, 0].parts == (0, 1)
    assert found.asking() == []  # the epoch record completed what the ledger told


def test_a_manifest_the_ledger_had_in_part_is_asked_about_again_without_a_batch() -> None:
    """Another member reads the manifest and stages it: the ledger's first answer may come
    before it has all of it. The held epoch is asked about again every half second, with no
    new record to start a batch, and once the answer is whole the held records publish."""
    log, clock = Log(), Clock()
    found = assembly(clock=clock)
    records = whole_epoch(log, 0)
    assert batch(found, records[:6]).epochs == ()  # both tasks' records; no manifest here
    assert found.asking() == [(QUERY, 0)]
    found.looked(LedgerLook(manifests={(QUERY, 0): (None, {0: {TOPIC: 3}})}))  # in part
    batch(found, [])  # the answer's batch: still not whole, held
    assert found.asking() == []
    clock.now += 0.5
    assert found.asking() == [(QUERY, 0)]  # again, with no batch in between
    found.looked(LedgerLook(manifests={(QUERY, 0): ((0, 1), {0: {TOPIC: 3}, 1: {TOPIC: 3}})}))
    assert found.due()
    assert batch(found, []).epochs == ((QUERY, 0),)


def test_an_unanswered_question_to_the_ledger_is_asked_again() -> None:
    log, found = Log(), assembly()
    records = whole_epoch(log, 0)
    batch(found, records[:3])
    found.looked(LedgerLook())  # the database could not say
    assert found.asking() == [(QUERY, 0)]


def test_an_epoch_staged_here_and_settled_elsewhere_stops_holding_later_ones_back() -> None:
    """Another member published it, or an operator discarded it: the ledger no longer holds it
    open, and later epochs of its query go in their batches again. One the ledger does not show
    yet (its batch not committed when the ledger was read) still holds them back."""
    log, clock = Log(), Clock()
    found = assembly(clock=clock)
    found.settled(PendingEpochs(publishing=((QUERY, 0),)), published=False)
    read_at = clock.now
    found.looked(LedgerLook(still_open=frozenset(), as_of=read_at))  # staged just now: kept
    assert batch(found, whole_epoch(log, 1)).epochs == ()
    found.drop()
    found.looked(LedgerLook(still_open=frozenset(), as_of=read_at + 2))
    assert batch(found, whole_epoch(log, 2)).epochs == ((QUERY, 2),)


def test_held_records_below_a_lease_moved_past_them_are_dropped() -> None:
    """An operator's `offsets reset` past records held for their epoch: they are not applied."""
    log, found = Log(), assembly()
    batch(found, log.task(0, 0, {0: 2}))  # offsets 0 and 2 of partition 0, held
    done = found.assemble({}, stored=lambda key: 4)
    assert offsets(done) == {} and found.holding() == 0


def test_what_a_batch_stages_is_pending_until_it_commits_and_gone_if_it_does_not() -> None:
    """Epoch 0 held past its time is staged by a batch: while that batch is not settled, epoch
    1 waits behind it as if it were staged; once it commits, it is; dropped with a rewind, it
    was never staged and epoch 1 goes in its batch."""
    log, clock = Log(), Clock()
    found = assembly(hold_s=0.5, clock=clock)
    records = whole_epoch(log, 0)
    batch(found, records[:3])
    clock.now += 0.5
    staging = batch(found, [])
    assert staging.pending == PendingEpochs(staging=frozenset({(QUERY, 0)}))
    assert batch(found, whole_epoch(log, 1)).epochs == ()  # waits behind the pending epoch 0
    found.drop()  # the staging batch never committed: a rewind brings everything again
    assert batch(found, whole_epoch(log, 2)).epochs == ((QUERY, 2),)

    found = assembly(hold_s=0.5, clock=clock)
    batch(found, records[:3])
    clock.now += 0.5
    staging = batch(found, [])
    found.settled(staging.pending, published=False)  # committed: epoch 0 is staged
    found.drop()
    assert batch(found, whole_epoch(log, 3)).epochs == ()  # still behind staged epoch 0
