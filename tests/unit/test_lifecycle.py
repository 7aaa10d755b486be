"""The batch pipeline driven through `BatchLifecycle`'s public methods, from every stage.

The lifecycle's parts that do I/O (the planner, the committer, the database session, the Kafka
client) are replaced by small scripted ones here; the real ones run in the integration tests.
What is checked is the owner's bookkeeping: the stage after each call, what is in flight, where
the positions go, and the leases an outcome moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from confluent_kafka import Message, TopicPartition

from consumers.batch.committer import Batch, CommitResult, Committer, InFlight
from consumers.batch.lifecycle import STAGES, BatchLifecycle, IllegalStage, Stage, StageEvent
from consumers.batch.planner import Planned, Planner
from consumers.batch.work_log import WorkLog
from consumers.database.db_session import DatabaseSession, Refusal
from consumers.database.offsets import Lease, OffsetStore, PartitionKey
from consumers.decoding.registry_schemas import RegistryUnavailable
from consumers.epochs.assembly import EpochAssembly
from consumers.metrics import ConsumerMetrics
from consumers.partitions import PartitionTable
from consumers.tables.applier import Step
from tests.unit.test_epoch_assembly import MANIFEST, Clock, Log, assembly, whole_epoch

KEYS: list[PartitionKey] = [("orders", 0), ("orders", 1)]

# Written from the design (consumers/batch/lifecycle.py's docstring), not read from STAGES:
# the stage a pipeline is in -> {a call of the loop (and how its parts answer): the stage after}.
#   poll:            `polling()`, before each poll
#   submit_one:      `submit` of records that are all rows: sent as one message
#   submit_written:  `submit` of records written statement by statement, committed whole
#   submit_no_schema: `submit` while the registry cannot give a writer schema
#   settle:          `settle()`, the batch in flight (if any) committed whole
#   settle_refused:  `settle()`, the batch in flight (if any) refused by the database
EXPECTED: dict[str, dict[str, str]] = {
    "idle": {
        "poll": "idle",
        "submit_one": "in_flight",
        "submit_written": "idle",
        "submit_no_schema": "rewound",
        "settle": "idle",
        "settle_refused": "idle",
    },
    "in_flight": {
        "poll": "in_flight",
        "submit_one": "in_flight",  # the batch before settles first, then this one goes
        "submit_written": "idle",
        "submit_no_schema": "rewound",  # the batch before settles: nothing moves under it
        "settle": "idle",
        "settle_refused": "rewound",
    },
    "rewound": {  # what a poll begun before the rewind returned is stale: dropped, sought again
        "poll": "idle",
        "submit_one": "rewound",
        "submit_written": "rewound",
        "submit_no_schema": "rewound",
        "settle": "rewound",
        "settle_refused": "rewound",
    },
}
CALLS = list(EXPECTED["idle"])


class _Planner:
    """Plans every record as a row (one message), or statement by statement, or finds the
    registry down."""

    def __init__(self) -> None:
        self.mode = "one"
        self.made_changes: list[Any] = []

    def plan(
        self,
        records: dict[PartitionKey, list[Message]],
        conn: Any,
        *,
        in_flight: Any,
        assembled: Any = None,
    ) -> Planned:
        if self.mode == "no_schema":
            raise RegistryUnavailable("registry at http://registry:8080 refused the connection")
        plans: dict[str, list[Step]] | None = None if self.mode == "written" else {"orders": []}
        return Planned(targets={}, plans=plans, changes=[], followed=False)

    def made(self, changes: list[Any]) -> None:
        self.made_changes.append(changes)

    def report_left_out(self) -> None:
        pass  # no route here leaves fields out

    def drifted(self) -> None:
        raise AssertionError("no table is followed here")


class _Committer:
    """Sends as the plan says; the database answers as `answer` says."""

    def __init__(self) -> None:
        self.answer = "whole"
        self.sent: list[Batch] = []

    def send(self, conn: Any, batch: Batch) -> InFlight | CommitResult:
        self.sent.append(batch)
        if batch.plans is None:
            return self._answer(batch)
        return InFlight(batch, transaction=cast(Any, None), conn=conn, started=0.0)

    def outcome(self, in_flight: InFlight) -> CommitResult:
        return self._answer(in_flight.batch)

    def _answer(self, batch: Batch) -> CommitResult:
        if self.answer == "behind":  # the ledger: records of an epoch staged before these
            key = min(batch.records)
            first = cast(int, batch.records[key][0].offset())
            return CommitResult(batch=batch, behind={key: first})
        if self.answer == "refused":
            refusal = Refusal("53300", "too many clients already")
            return CommitResult(batch=batch, declined=list(batch.records), refusal=refusal)
        return CommitResult(
            batch=batch, committed=batch.next_offsets(), applied={"orders": (1, 0, 0)}
        )


class _Database:
    def open_connection(self) -> None:
        return None  # the COPY text is formatted when sent

    def connection(self) -> object:
        return object()

    def run(self, work: Callable[[Any], Any]) -> Any:
        return work(None)


class _Kafka:
    def __init__(self) -> None:
        self.sought: list[tuple[str, int, int]] = []
        self.paused: list[PartitionKey] = []

    def seek(self, partition: TopicPartition) -> None:
        self.sought.append((partition.topic, partition.partition, partition.offset))

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused += [(partition.topic, partition.partition) for partition in partitions]


class Pipeline:
    """A lifecycle over two claimed partitions, with the records it is given numbered on."""

    def __init__(self, *, assembly: EpochAssembly | None = None) -> None:
        self.table = PartitionTable()
        for topic, number in [*KEYS, *([(MANIFEST, 0)] if assembly else [])]:
            lease = Lease(topic=topic, partition=number, epoch=1, next_offset=0)
            self.table.claimed(lease, log_start=0, log_end=1_000_000)
        self.planner, self.committer, self.kafka = _Planner(), _Committer(), _Kafka()
        self.metrics = ConsumerMetrics("g")
        self.batches = BatchLifecycle(
            planner=cast(Planner, self.planner),
            committer=cast(Committer, self.committer),
            table=self.table,
            store=cast(OffsetStore, None),
            db=cast(DatabaseSession, _Database()),
            consumer=cast(Any, self.kafka),
            metrics=self.metrics,
            work_log=WorkLog(dead_letters_table="bridge.dead_letters", behind_at=100),
            mirror_offsets=False,
            assembly=assembly,
        )
        self.next_offset = 0
        self.refusals, self.registry = self.batches.refusals, self.batches.registry

    def records(self, count: int = 3) -> list[Message]:
        first, self.next_offset = self.next_offset, self.next_offset + count
        return [
            Message(topic=topic, partition=number, offset=offset, value=b"{}")
            for topic, number in KEYS
            for offset in range(first, first + count)
        ]

    def call(self, call: str) -> None:
        self.planner.mode = {"submit_written": "written", "submit_no_schema": "no_schema"}.get(
            call, "one"
        )
        self.committer.answer = "refused" if call == "settle_refused" else "whole"
        if call == "poll":
            self.batches.polling()
        elif call.startswith("submit"):
            self.batches.submit(self.records())
        else:
            self.batches.settle()
        self.committer.answer = "whole"


def in_stage(stage: str) -> Pipeline:
    """A pipeline in `stage`, reached through the public calls only."""
    pipeline = Pipeline()
    if stage == "in_flight":
        pipeline.call("submit_one")
    elif stage == "rewound":
        pipeline.call("submit_no_schema")
    assert pipeline.batches.stage == stage
    return pipeline


def held(pipeline: Pipeline) -> dict[PartitionKey, int]:
    return {lease.key: lease.next_offset for lease in pipeline.table.leases()}


def test_the_stages_and_events_are_the_designed_ones() -> None:
    assert sorted(Stage) == sorted(EXPECTED)
    assert sorted(StageEvent) == ["polling", "rewound", "sent", "settled"]


@pytest.mark.parametrize("stage", list(EXPECTED))
@pytest.mark.parametrize("call", CALLS)
def test_every_stage_and_call_moves_as_designed(stage: str, call: str) -> None:
    pipeline = in_stage(stage)
    pipeline.call(call)
    after = pipeline.batches.stage
    assert after == EXPECTED[stage][call]
    # What is in flight is exactly what the stage says, and its partitions are counted so.
    states = pipeline.batches.partition_states()
    assert states["in_flight"] == (len(KEYS) if after is Stage.IN_FLIGHT else 0)
    assert states["consuming"] + states["in_flight"] == len(KEYS)


def test_a_batch_in_flight_moves_its_leases_only_once_its_outcome_is_read() -> None:
    pipeline = in_stage("idle")
    pipeline.call("submit_one")
    assert held(pipeline) == dict.fromkeys(KEYS, 0)  # sent, not settled
    pipeline.call("poll")
    assert held(pipeline) == dict.fromkeys(KEYS, 0)
    pipeline.call("submit_one")  # settles the first batch, then sends the second over it
    assert held(pipeline) == dict.fromkeys(KEYS, 3)
    _, second = pipeline.committer.sent
    assert [lease.next_offset for lease in second.leases.values()] == [3, 3]
    pipeline.call("settle")
    assert held(pipeline) == dict.fromkeys(KEYS, 6)
    assert pipeline.batches.applied_total == 2
    assert read(pipeline) == 12  # 3 records of each partition in each batch
    assert pipeline.kafka.sought == []


def test_a_refused_batch_moves_nothing_and_fetches_again_from_the_leases() -> None:
    pipeline = in_stage("in_flight")
    pipeline.call("settle_refused")
    assert held(pipeline) == dict.fromkeys(KEYS, 0)
    assert sorted(pipeline.kafka.sought) == [("orders", 0, 0), ("orders", 1, 0)]
    assert pipeline.refusals.reasons()  # /readyz says why it waits
    assert pipeline.batches.applied_total == 0 and read(pipeline) == 0


def test_records_polled_before_a_rewind_are_dropped_and_fetched_again() -> None:
    pipeline = in_stage("in_flight")
    pipeline.call("settle_refused")
    sent = len(pipeline.committer.sent)
    pipeline.call("submit_one")  # polled across the rewind
    assert len(pipeline.committer.sent) == sent
    assert pipeline.kafka.sought[-2:] == [("orders", 0, 0), ("orders", 1, 0)]
    pipeline.call("poll")
    pipeline.next_offset = 0  # fetched again from the stored offsets
    pipeline.call("submit_one")
    assert pipeline.batches.stage is Stage.IN_FLIGHT


def test_records_below_the_stored_offset_are_not_applied_again() -> None:
    pipeline = in_stage("idle")
    pipeline.call("submit_written")
    assert held(pipeline) == dict.fromkeys(KEYS, 3)
    pipeline.next_offset = 1  # Kafka hands over 1..3 again: only 3 is new
    pipeline.call("submit_one")
    (_, batch) = pipeline.committer.sent
    assert {key: [m.offset() for m in records] for key, records in batch.records.items()} == {
        key: [3] for key in KEYS
    }


def test_a_registry_outage_sends_nothing_and_says_why() -> None:
    pipeline = in_stage("idle")
    pipeline.call("submit_no_schema")
    assert pipeline.committer.sent == []
    assert "registry" in pipeline.registry.reasons()[0]
    pipeline.call("poll")
    pipeline.next_offset = 0
    pipeline.call("submit_one")
    assert pipeline.registry.reasons() == []


def test_the_table_the_pipeline_follows_is_the_designed_one() -> None:
    """STAGES, the table `_move` looks moves up in, against the design's own pairs."""
    designed = {
        ("idle", "polling"): "idle",
        ("idle", "sent"): "in_flight",
        ("idle", "rewound"): "rewound",
        ("in_flight", "polling"): "in_flight",
        ("in_flight", "settled"): "idle",
        ("rewound", "polling"): "idle",
        ("rewound", "rewound"): "rewound",
    }
    assert {(str(s), str(e)): str(to) for (s, e), to in STAGES.items()} == designed


def test_a_move_the_table_refuses_raises_naming_it() -> None:
    pipeline = in_stage("in_flight")
    with pytest.raises(IllegalStage, match="'sent' is not allowed in stage in_flight"):
        pipeline.batches._move(StageEvent.SENT)
    assert pipeline.batches.stage is Stage.IN_FLIGHT


def _held_metric(pipeline: Pipeline) -> float | None:
    return pipeline.metrics.registry.get_sample_value("bridge_consumer_epoch_records_held")


def read(pipeline: Pipeline) -> float:
    """Records the member read, committed: `bridge_consumer_records_read_total`."""
    value = pipeline.metrics.registry.get_sample_value(
        "bridge_consumer_records_read_total", {"topic": "orders"}
    )
    return value or 0.0


def test_records_held_for_their_epoch_send_nothing_and_a_rewind_drops_them() -> None:
    """The lifecycle's epoch branches: what the assembly holds is not sent and is counted;
    a rewind (the registry down) drops it with everything polled, to be fetched again."""
    pipeline = Pipeline(assembly=assembly())
    records = whole_epoch(Log(), 0)
    pipeline.batches.submit(records[:3])  # task 0's records, nothing of the manifest yet
    assert _held_metric(pipeline) == 3
    assert all(not batch.records for batch in pipeline.committer.sent)
    assert held(pipeline) == {("orders", 0): 0, ("orders", 1): 0, (MANIFEST, 0): 0}

    pipeline.planner.mode = "no_schema"
    pipeline.batches.submit(records[3:6])  # held too; the registry fails the batch: rewound
    assert pipeline.batches.stage == "rewound"
    assert _held_metric(pipeline) == 0
    assert sorted(pipeline.kafka.sought) == [(MANIFEST, 0, 0), ("orders", 0, 0), ("orders", 1, 0)]


def test_records_held_past_their_time_are_due_for_a_batch_without_new_records() -> None:
    clock = Clock()
    pipeline = Pipeline(assembly=assembly(hold_s=2, clock=clock))
    pipeline.batches.submit(whole_epoch(Log(), 0)[:3])
    assert _held_metric(pipeline) == 3 and not pipeline.batches.holding_due()
    clock.now += 2
    assert pipeline.batches.holding_due()


def test_records_behind_an_epoch_another_member_staged_show_the_group_has_epochs() -> None:
    """A member that never read a record of an epoch learns from the ledger that records of an
    epoch are staged before its own in a partition (another member staged them before the
    partition came here): its partition holds there, and the group has epochs, so that this
    member's publisher looks at the ledger (`epochs_seen`) and publishes them if no one else
    does."""
    pipeline = Pipeline(assembly=assembly())
    pipeline.planner.mode = "written"
    pipeline.batches.submit(pipeline.records())
    assert not pipeline.batches.epochs_seen()  # records of no epoch, applied

    pipeline.committer.answer = "behind"
    pipeline.batches.submit(pipeline.records())
    assert pipeline.batches.epochs_seen()
    holds = pipeline.batches.partition_holds
    assert holds.held(("orders", 0)) and not holds.held(("orders", 1))
    assert pipeline.kafka.paused == [("orders", 0)]
