"""The epoch manifest's records: what the sink writes reads back, and what else comes from Kafka
is refused with `ManifestError` alone, naming the field (fuzzed)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.epoch_manifest import (
    MAX_MANIFEST_BYTES,
    MAX_PARTS,
    Epoch,
    ManifestError,
    Part,
    parse,
)
from spark_jobs.epoch_transaction import EpochOutcome, TaskCoordinates
from spark_jobs.manifest_writer import epoch_record

EXAMPLES = int(os.environ.get("BRIDGE_FUZZ_EXAMPLES", "1000"))
QUERY = "0f9c1b1e-6a55-4a8a-9c55-2d4a3f5e7b10"


def test_a_part_and_an_epoch_read_back_as_written() -> None:
    part = Part(query=QUERY, epoch=7, partition=3, records={"orders": 120, "lines": 0})
    assert parse(part.encode()) == part
    epoch = Epoch(query=QUERY, epoch=7, parts=(0, 3, 5))
    assert parse(epoch.encode()) == epoch
    empty = Epoch(query=QUERY, epoch=8, parts=())  # an epoch without a part
    assert parse(empty.encode()) == empty
    placed = Part(
        query=QUERY, epoch=7, partition=3, records={"orders": 6, "lines": 0},
        offsets={"orders": {0: ((0, 2), (5, 5)), 3: ((10, 11),)}},
    )  # fmt: skip
    assert parse(placed.encode()) == placed


def _part(**offsets: Any) -> bytes:
    return _document(kind="part", parts=..., partition=0, records={"t": 3}, **offsets)


def _document(**changes: Any) -> bytes:
    base: dict[str, Any] = {"v": 1, "kind": "epoch", "query": QUERY, "epoch": 1, "parts": [0]}
    base.update(changes)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (None, "no value"),
        (b"x" * (MAX_MANIFEST_BYTES + 1), "more than"),
        (b"{", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # deeper than json's recursion
        (b"1" * 5000, "not JSON"),  # an integer of more digits than Python converts
        (b"[]", "not a JSON object"),
        (_document(v=2), "v:"),
        (_document(kind="epochs"), "kind:"),
        (_document(query=""), "query:"),
        (_document(query=7), "query:"),
        (_document(epoch=-1), "epoch:"),
        (_document(epoch=True), "epoch:"),
        (_document(epoch=1.5), "epoch:"),
        (_document(epoch=1 << 63), "epoch:"),
        (_document(parts=[0, 0]), "named twice"),
        (_document(parts=[MAX_PARTS]), "parts[0]:"),
        (_document(parts=list(range(MAX_PARTS + 1))), "parts:"),
        (_document(parts={"0": 1}), "parts:"),
        (_document(kind="part", parts=..., partition=0, records={"bad topic": 1}), "records:"),
        (_document(kind="part", parts=..., partition=0, records={"t": -1}), "records.t:"),
        (_document(kind="part", parts=..., partition=-1, records={}), "partition:"),
        (_document(kind="part", parts=..., partition=0, records=[]), "records:"),
        (_part(offsets=[]), "offsets:"),
        (_part(offsets={"u": {"0": [[0, 2]]}}), "offsets.u:"),
        (_part(offsets={"t": []}), "offsets.t:"),
        (_part(offsets={"t": {"-1": [[0, 2]]}}), "offsets.t: '-1'"),
        (_part(offsets={"t": {"01": [[0, 2]]}}), "offsets.t: '01'"),
        (_part(offsets={"t": {"2147483648": [[0, 2]]}}), "offsets.t: '2147483648'"),
        (_part(offsets={"t": {"0": []}}), "offsets.t.0:"),
        (_part(offsets={"t": {"0": [[0]]}}), "offsets.t.0[0]:"),
        (_part(offsets={"t": {"0": [[2, 0]]}}), "offsets.t.0[0]:"),
        (_part(offsets={"t": {"0": [[-1, 1]]}}), "offsets.t.0[0]:"),
        (_part(offsets={"t": {"0": [[0, 1], [1, 1]]}}), "offsets.t.0[1]:"),
        (_part(offsets={"t": {"0": [[4, 5], [0, 0]]}}), "offsets.t.0[1]:"),
        (_part(offsets={"t": {"0": [[0, 1]]}}), "2 offsets in its ranges, 3 records"),
        (_part(offsets={"t": {"0": [[0, 0]] * 20_001}}), "more than 20000 ranges"),
    ],
)
def test_what_is_not_a_manifest_record_is_refused_naming_why(
    value: bytes | None, names: str
) -> None:
    with pytest.raises(ManifestError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse(value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "v": st.sampled_from([1, 1, 2, "1"]),
        "kind": st.sampled_from(["part", "epoch", "other"]),
        "query": st.text(max_size=300),
        "epoch": st.integers(min_value=-2, max_value=1 << 64) | _JSON,
        "partition": st.integers(min_value=-2, max_value=1 << 20) | _JSON,
        "records": st.dictionaries(st.text(max_size=12), st.integers() | _JSON) | _JSON,
        "parts": st.lists(st.integers(min_value=-1, max_value=1 << 17), max_size=8) | _JSON,
        "offsets": st.dictionaries(
            st.sampled_from(["t", "u"]),
            st.dictionaries(
                st.sampled_from(["0", "1", "01", "-1"]),
                st.lists(st.lists(st.integers(min_value=-1, max_value=9), max_size=3), max_size=3)
                | _JSON,
            )
            | _JSON,
        )
        | _JSON,
    },
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200) | _FIELDS.map(lambda d: json.dumps(d).encode()))
def test_any_value_from_kafka_parses_or_is_refused_with_the_documented_error(value: bytes) -> None:
    try:
        record = parse(value)
    except ManifestError:
        return
    assert parse(record.encode()) == record  # what is accepted reads back the same


def _outcome(partition: int, *, rows: int = 0, skipped: bool = False, empty: bool = False) -> Any:
    where = TaskCoordinates(query_id=QUERY, prefix="p", partition=partition, epoch=4, attempt=0)
    if empty:
        return EpochOutcome.of_empty_input(where)
    return EpochOutcome(
        query_id=QUERY, partition=partition, epoch=4, attempt=0, transactional_id="t",
        rows=rows, skipped=skipped, init_seconds=0, marker_seconds=0, produce_seconds=0,
        commit_seconds=0,
    )  # fmt: skip


def test_the_epoch_record_names_the_tasks_that_wrote_a_part_now_or_before_a_replay() -> None:
    outcomes = [_outcome(0, rows=5), _outcome(1, empty=True), _outcome(2, skipped=True)]
    assert epoch_record(4, outcomes) == Epoch(query=QUERY, epoch=4, parts=(0, 2))
    # Every task without input: the epoch is whole with no part at all.
    assert epoch_record(4, [_outcome(0, empty=True)]) == Epoch(query=QUERY, epoch=4, parts=())
    assert epoch_record(4, []) is None
