"""Debezium change events unwrapped as ExtractNewRecordState does, and any bytes read without an
error other than the documented one."""

from __future__ import annotations

import json
from decimal import Decimal

import msgspec
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from bridge.settings import RouteSettings
from consumers.decoding.change_events import debezium_unwrapper
from consumers.decoding.records import RecordError
from consumers.tables.targets import Target

unwrap = debezium_unwrapper(["op", "source.ts_ms", "source.table"])


def _event(op: str, after: object = None, before: object = None) -> bytes:
    source = {"ts_ms": 5, "table": "orders", "db": "shop"}
    return json.dumps(
        {"before": before, "after": after, "op": op, "ts_ms": 7, "source": source}
    ).encode()


def test_a_write_is_its_after_image_with_the_fields_asked_for() -> None:
    exact = msgspec.json.Decoder(float_hook=Decimal)
    for op in ("c", "r", "u"):
        event = _event(op, after={"id": 1, "amount": 0}).replace(
            b'"amount": 0', b'"amount": 12345678901234.567890123'
        )  # digits a float would not keep
        raw = unwrap(event)
        assert isinstance(raw, bytes)
        assert exact.decode(raw) == {
            "id": 1, "amount": Decimal("12345678901234.567890123"), "__op": op,
            "__source_ts_ms": 5, "__source_table": "orders",
        }  # fmt: skip


def test_a_delete_is_a_tombstone_and_other_events_say_why_they_are_no_row() -> None:
    assert unwrap(_event("d", before={"id": 1})) is None
    assert unwrap(None) is None  # Debezium's own tombstone after the delete
    truncate = unwrap(_event("t"))
    assert isinstance(truncate, RecordError) and "op 't'" in str(truncate)
    empty = unwrap(_event("c"))
    assert isinstance(empty, RecordError) and "no after image" in str(empty)


def test_a_value_that_is_no_change_event_is_read_as_it_is() -> None:
    for raw in (b'{"id": 1}', b"not json", b"[1, 2]", b'{"op": 1}'):
        assert unwrap(raw) == raw


@given(st.binary(max_size=300) | st.builds(lambda d: json.dumps(d).encode(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["op", "after", "before", "source", "ts_ms", "x"]), inner, max_size=5),
    max_leaves=20)))  # fmt: skip
def test_any_bytes_unwrap_to_a_value_a_delete_or_a_record_error(raw: bytes) -> None:
    found = unwrap(raw)
    assert found is None or isinstance(found, bytes | RecordError)


def test_a_route_that_unwraps_writes_rows_and_deletes_and_names_what_is_no_row() -> None:
    target = Target(
        route=RouteSettings(topic="t", table="public.t", mode="upsert", key_columns=("id",),
                            unwrap="debezium", unwrap_fields=("op",)),
        schema="public", name="t", columns=("id", "name", "__op"), required=frozenset(),
    )  # fmt: skip
    batch = [
        Message(topic="t", partition=0, offset=0, value=_event("c", after={"id": 1, "name": "a"})),
        Message(topic="t", partition=0, offset=1, value=_event("d", before={"id": 1})),
        Message(topic="t", partition=0, offset=2, value=_event("t")),
    ]
    values = target.values(batch)
    assert isinstance(values[0], bytes) and target.row(values[0]) == (1, "a", "c")
    assert values[1] is None and isinstance(values[2], RecordError)
    assert target.unwraps
