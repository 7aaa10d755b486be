"""Staging for whole epochs: which epoch a record belongs to, read from hostile headers, and
what a batch with a record that cannot be staged becomes."""

from __future__ import annotations

from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from bridge.epoch_manifest import Epoch, Part
from consumers.database.ledger_tables import LedgerNames
from consumers.database.state import state_tables
from consumers.epochs.staging import EpochStager, Provenance, provenance_of
from consumers.tables.applier import Applier

Headers = list[tuple[str, str | bytes | None]]
SPARK: Headers = [("bridge.query", b"q-1"), ("bridge.partition", b"3"), ("bridge.epoch", b"17"),
                  ("bridge.epochs", b"whole")]  # fmt: skip


def provenance(message: Message) -> Provenance | str | None:
    return provenance_of(message.headers() or [])  # type: ignore[arg-type]


def record(headers: Headers | None, value: bytes = b"{}") -> Message:
    return Message(topic="a", partition=0, offset=5, value=value, headers=headers)


def stager() -> EpochStager:
    tables = state_tables("s")
    return EpochStager(
        ledger=LedgerNames("s"),
        group_id="g",
        manifest_topic="bridge-epochs",
        whole_topic=lambda topic: topic == "a",
        applier=Applier(tables=tables, group_id="g"),
    )


def test_the_sinks_headers_name_the_epoch() -> None:
    assert provenance(record([("other", b"x"), *SPARK])) == Provenance("q-1", 17, 3)


def test_a_record_without_them_is_of_no_epoch_and_one_with_some_is_told_why() -> None:
    assert provenance(record(None)) is None
    assert provenance(record([("other", b"x")])) is None
    why = provenance(record([SPARK[0], SPARK[3]]))
    assert isinstance(why, str)
    assert "no bridge.epoch, bridge.partition header" in why
    assert provenance(record([*SPARK[:2], ("bridge.epoch", b"-1"), SPARK[3]])) == (
        "the sink's provenance headers are out of range"
    )
    assert provenance(record([*SPARK[:2], ("bridge.epoch", None), SPARK[3]])) == (
        "the sink's provenance headers are not a query id and two integers"
    )


def test_a_sinks_record_without_the_whole_marker_is_applied_per_partition_not_waited_for() -> None:
    """A sink with `epochs=per-partition`, or of a release before whole epochs, writes the
    provenance and no manifest: its records are of no epoch to wait for."""
    assert provenance(record(SPARK[:3])) is None
    assert provenance(record([*SPARK[:3], ("bridge.epochs", b"per-partition")])) is None
    assert provenance(record([SPARK[0]])) is None  # a part of it, and no marker: not ours


NAMES = ["bridge.query", "bridge.epoch", "bridge.partition", "bridge.epochs", "x"]


@given(st.lists(st.tuples(st.sampled_from(NAMES), st.none() | st.binary(max_size=30)),
                max_size=8))  # fmt: skip
def test_any_headers_give_an_epoch_or_a_reason_and_nothing_else(
    headers: Headers,
) -> None:
    found = provenance(record(headers))
    assert found is None or isinstance(found, Provenance | str)


def test_a_batch_with_a_record_that_cannot_be_staged_goes_statement_by_statement() -> None:
    staging = stager()
    assert staging.stages("a") and staging.stages("bridge-epochs") and not staging.stages("b")
    good = staging.plan("a", [record(SPARK), record(SPARK)])
    assert good is not None and good[0].rows is not None and len(good[0].rows) == 1  # a chunk
    assert staging.plan("a", [record(SPARK), record(None)]) is None
    assert staging.plan("a", [record(SPARK), record([SPARK[0]])]) is None


def test_manifest_records_become_ledger_statements_and_a_bad_one_a_dead_letter() -> None:
    staging = stager()
    part = Part(query="q", epoch=1, partition=0, records={"a": 2}).encode()
    epoch = Epoch(query="q", epoch=1, parts=(0,)).encode()
    other = Part(query="r", epoch=1, partition=0, records={"b": 5}).encode()
    steps = staging.plan("bridge-epochs", [record(None, part), record(None, epoch)])
    # The part, the epoch's row, the query's topic; the epoch record, and the clearing of
    # parts of epochs not kept.
    assert steps is not None and len(steps) == 5
    assert "epoch_topics" in steps[2].statement.as_string(None) and '"a"' in str(steps[2])
    ignored = staging.plan("bridge-epochs", [record(None, other)])
    assert ignored is not None and len(ignored) == 1  # its part only: no topic of this group
    assert staging.plan("bridge-epochs", [record(None, b"not json")]) is None
