"""A record never becomes a row it does not fill: fields its table lacks are left out and
counted (`unknown_fields: ignore`, the default) or refused (`refuse`), wherever the record stands
in its batch; a record that fills none of the table's columns beyond the key is refused either way,
in every mode and key source, a Debezium or Connect envelope named."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest

from bridge.settings import RouteSettings, SchemaRegistrySettings, UnknownFields
from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import SchemaCache
from consumers.decoding.rows import UNSET
from consumers.tables.record_fields import FieldRules
from consumers.tables.targets import Target

ENVELOPE = b'{"before": null, "after": {"id": 1, "name": "a"}, "source": {}, "op": "c"}'


def _target(columns: tuple[str, ...] = ("id", "name", "amount"), **route: Any) -> Target:
    return Target(
        route=RouteSettings(topic="t", table="public.t", **route),
        schema="public",
        name="t",
        columns=columns,
        required=frozenset(),
    )


def test_a_field_the_table_lacks_refuses_the_record_naming_it_when_the_route_says_so() -> None:
    target = _target(unknown_fields="refuse")
    good = b'{"id": 1, "name": "a", "amount": 2}'
    extra = b'{"id": 2, "name": "b", "amount": 3, "coupon": "X", "channel": "web"}'
    with pytest.raises(
        RecordError, match=r"field\(s\) channel, coupon are not columns of public\.t"
    ):
        target.row(extra)
    # In the middle of a batch too: the batch is not written in C, and `row` tells which.
    assert target.rows([good, extra, good]) is None
    assert target.rows([good, good]) == [(1, "a", 2), (1, "a", 2)]


@pytest.mark.parametrize(
    "route",
    [
        {},
        {"mode": "upsert", "key_columns": ["id"]},
        {"mode": "update", "key_columns": ["id"]},
        {"mode": "upsert", "key_columns": ["id"], "key_source": "record_key"},
        {"mode": "insert_if_absent", "key_columns": ["id"], "unknown_fields": "ignore"},
    ],
)
def test_a_debezium_envelope_is_no_row_in_any_mode_and_is_named(route: dict[str, Any]) -> None:
    target = _target(**route)
    with pytest.raises(RecordError, match=r"fills none of public\.t's columns beyond its key") as e:
        target.row(ENVELOPE)
    assert "after, before, op, source" in str(e.value)
    assert "Debezium change event" in str(e.value) and "ExtractNewRecordState" in str(e.value)
    assert target.rows([ENVELOPE]) is None
    assert target.carried_rows([ENVELOPE]) is None


@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_a_record_of_only_the_key_or_nothing_is_no_row_but_one_with_nulls_is(mode: str) -> None:
    target = _target(mode=mode, key_columns=["id"])
    for empty in (b'{"id": 1}', b"{}"):
        with pytest.raises(RecordError, match="fills none"):
            target.row(empty)
        assert target.rows([b'{"id": 2, "name": "x"}', empty]) is None
    # Carried, though null: the record says these columns are null.
    assert target.row(b'{"id": 1, "name": null}')[:2] == (1, None)
    connect = b'{"schema": {"type": "struct"}, "payload": {"id": 1}}'
    with pytest.raises(RecordError, match="Kafka Connect JSON envelope"):
        target.row(connect)


def test_a_table_of_only_its_key_takes_a_record_of_only_the_key() -> None:
    target = _target(("id",), mode="upsert", key_columns=["id"])
    assert target.row(b'{"id": 1}') == (1,)
    assert target.rows([b'{"id": 1}', b'{"id": 2}']) == [(1,), (2,)]


def test_ignored_fields_are_left_out_and_counted_record_by_record_wherever_they_stand() -> None:
    target = _target()  # unknown_fields: ignore, the default
    good = b'{"id": 1, "name": "a", "amount": 2}'
    extra = b'{"id": 2, "name": "b", "amount": 3, "coupon": "X"}'
    both = b'{"id": 3, "name": "c", "amount": 4, "coupon": "Y", "channel": "web"}'
    # A batch at a time, in C loops: every record counted, wherever it stands.
    assert target.rows([good, extra, good, both]) == [
        (1, "a", 2), (2, "b", 3), (1, "a", 2), (3, "c", 4)
    ]  # fmt: skip
    records, fields = target.left_out.take()
    assert records == 2 and fields == {"coupon": 2, "channel": 1}
    assert target.left_out.take()[0] == 0  # taken once
    # A record at a time, the same.
    assert [target.row(raw) for raw in (good, extra)][1] == (2, "b", 3)
    assert target.left_out.take() == (1, {"coupon": 1})
    # A batch with a record that is no row goes record by record, counting nothing twice.
    assert target.rows([extra, b'{"coupon": "X"}']) is None
    assert target.left_out.take()[0] == 0
    # A record of nothing but unknown fields is still no row.
    with pytest.raises(RecordError, match="fills none"):
        target.row(b'{"coupon": "X"}')


def test_fields_a_route_leaves_out_on_purpose_are_never_unknown() -> None:
    excluded = _target(fields={"exclude": ["secret"], "rename": {"label": "name"}},
                       unknown_fields="refuse")  # fmt: skip
    assert excluded.row(b'{"id": 1, "label": "a", "secret": "s"}') == (1, "a", None)
    assert excluded.rows([b'{"id": 1, "label": "a", "secret": "s"}']) == [(1, "a", None)]
    with pytest.raises(RecordError, match=r"field\(s\) name are not columns"):
        excluded.row(b'{"id": 1, "name": "a"}')  # renamed away: its column takes `label`
    included = _target(fields={"include": ["id", "name"]})
    assert included.rows([b'{"id": 1, "name": "a", "anything": 1}']) == [(1, "a")]
    keyed = _target(mode="upsert", key_columns=["id"], key_source="record_key")
    # The value's `id` is known (the key column takes the name): the key is what is missing.
    with pytest.raises(RecordError, match="has no key"):
        keyed.row(b'{"id": 9, "name": "a"}', _Record())  # type: ignore[arg-type]


class _Record:
    """A record without a key."""

    def key(self) -> None:
        return None


def test_a_verdict_names_a_bounded_number_of_fields() -> None:
    rules = FieldRules(table="t", landing=["a"], beyond_key=["a"], known=["a"],
                       unknown_fields="refuse")  # fmt: skip
    problem = rules.judge([f"f{i:04}" + "x" * 100 for i in range(5000)]).problem
    assert problem is not None and len(problem) < 1500 and "and 4988 more" in problem


SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]}]}  # fmt: skip
COUPON = {"name": "coupon", "type": ["null", "string"], "default": None}
WIDER = {"type": "record", "name": "R", "fields": [*SCHEMA["fields"], COUPON]}
ENVELOPE_SCHEMA = {"type": "record", "name": "E", "fields": [
    {"name": "before", "type": ["null", "string"]}, {"name": "after", "type": ["null", "string"]},
    {"name": "op", "type": "string"}]}  # fmt: skip


@pytest.fixture
def cache() -> Iterator[SchemaCache]:
    """Ids 1 (SCHEMA), 2 (WIDER) and 3 (an envelope), held: no registry is asked."""
    schemas = SchemaCache(SchemaRegistrySettings(url="http://127.0.0.1:9/apis/ccompat/v7"))
    for writer, schema in ((1, SCHEMA), (2, WIDER), (3, ENVELOPE_SCHEMA)):
        schemas.schemas[writer] = fastavro.parse_schema(schema)
        schemas.types[writer] = "AVRO"
    yield schemas
    schemas.close()


def _avro(writer: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + writer.to_bytes(4, "big") + body.getvalue()


@pytest.mark.parametrize("policy", ["refuse", "ignore"])
def test_an_avro_writer_schema_with_a_field_the_table_lacks_follows_the_route(
    cache: SchemaCache, policy: UnknownFields
) -> None:
    target = Target(
        route=RouteSettings(topic="t", table="public.t", value_format="avro",
                            unknown_fields=policy),
        schema="public", name="t", columns=("id", "name"), required=frozenset(), schemas=cache,
    )  # fmt: skip
    plain = _avro(1, SCHEMA, {"id": 1, "name": "a"})
    wider = _avro(2, WIDER, {"id": 2, "name": "b", "coupon": "X"})
    assert target.rows([plain, plain]) == [(1, "a"), (1, "a")]
    if policy == "refuse":
        assert target.rows([plain, wider]) is None
        with pytest.raises(RecordError, match=r"field\(s\) coupon are not columns"):
            target.row(wider)
    else:  # counted by writer schema, the batch read in C
        assert target.rows([plain, wider, wider]) == [(1, "a"), (2, "b"), (2, "b")]
        assert target.left_out.take() == (2, {"coupon": 2})
        assert target.row(wider) == (2, "b")
        assert target.left_out.take() == (1, {"coupon": 1})
    envelope = _avro(3, ENVELOPE_SCHEMA, {"before": None, "after": "x", "op": "c"})
    with pytest.raises(RecordError, match="Debezium change event"):
        target.row(envelope)


def test_an_upsert_row_keeps_absent_apart_from_null_beyond_the_key() -> None:
    target = _target(mode="upsert", key_columns=["id"])
    assert target.rows([b'{"id": 1, "name": null}']) == [(1, None, UNSET)]
