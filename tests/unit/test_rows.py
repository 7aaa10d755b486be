"""The consumer's per-record decoding: fast, and never loses a digit or a poison record."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from bridge.settings import RouteSettings
from consumers.decoding.records import RecordError
from consumers.decoding.rows import UNSET, RowDecoder, Run, as_cell, decode_key, projector, runs
from consumers.tables.targets import Target


@pytest.mark.parametrize(
    ("raw", "exact"),
    [
        (b'{"a": 123456789012345678901234567890}', 123456789012345678901234567890),
        (b'{"a": 18446744073709551616}', 18446744073709551616),  # 2**64
        (b'{"a": 12345678901234.567}', Decimal("12345678901234.567")),
        (b'{"a": 0.12345678901234567890}', Decimal("0.12345678901234567890")),
        (b'{"a": 1e400, "note": "overflows a double"}', Decimal("1e400")),
        (b'{"a": 1e-400}', Decimal("1e-400")),
        (b'{"a": 19.99, "b": "EUR"}', Decimal("19.99")),
        (b'{"a": -42}', -42),
        (b'{"a": 2.5e-320}', Decimal("2.5e-320")),  # a subnormal double would keep 2 digits
        (b'{"a": 1.50}', Decimal("1.50")),  # the written scale is kept, as numeric keeps it
    ],
)
def test_numbers_are_decoded_without_losing_digits(raw: bytes, exact: Any) -> None:
    (value,) = RowDecoder(["a"]).decode(raw)
    assert value == exact
    assert type(value) is type(exact)
    assert str(value) == str(exact)


def test_nested_values_keep_their_digits_as_json_text() -> None:
    (value,) = RowDecoder(["n"]).decode(
        b'{"n": {"big": 123456789012345678901234567890.5, "l": [1, "x", null, true]}}'
    )
    assert as_cell(value) == '{"big":123456789012345678901234567890.5,"l":[1,"x",null,true]}'
    (value,) = RowDecoder(["n"]).decode(b'{"n": [0.1, {"b": 1e-400}]}')
    assert as_cell(value) == '[0.1,{"b":1E-400}]'


def test_rows_follow_the_columns_whatever_the_keys() -> None:
    decoder = RowDecoder(["id", "order id", "class", "c0"], tracked={"class", "c0"})
    # Keys in any order, a key that is no column, an escaped key, a duplicate (the last wins).
    row = decoder.decode(b'{"class": 1, "extra": 2, "order\\u0020id": "x", "id": 7, "id": 8}')
    assert row == (8, "x", 1, UNSET)
    # Where it is tracked, absent stays apart from null: a default may fill the one, never the
    # other. Elsewhere both are NULL.
    assert decoder.decode(b'{"id": null, "class": null}') == (None, None, None, UNSET)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"not json", "value is not JSON: JSON is malformed"),
        (b"\xff\xfe", "value is not JSON"),
        (b'{"a": NaN}', "value is not JSON"),
        (b'{"a": 1} trailing', "value is not JSON"),
        (b"[1, 2]", "value is not a JSON object: Expected `object`, got `array`"),
        (b'"text"', "value is not a JSON object: Expected `object`, got `str`"),
        (b"12345678901234567890", "value is not a JSON object: Expected `object`, got `int`"),
    ],
)
def test_values_that_are_not_json_objects_are_refused_by_name(raw: bytes, error: str) -> None:
    with pytest.raises(RecordError, match=f"^{error}"):
        RowDecoder(["a"]).decode(raw)


def test_keys_decode_from_objects_scalars_and_text() -> None:
    assert decode_key(b'{"id": 7, "region": "eu"}', ("region", "id")) == ("eu", 7)
    assert decode_key(b"12345678901234567890123", ("id",)) == (12345678901234567890123,)
    assert decode_key(b"2.50", ("id",)) == (Decimal("2.50"),)
    assert decode_key(b"order-7", ("id",)) == ("order-7",)
    with pytest.raises(RecordError, match="key lacks key column"):
        decode_key(b'{"id": 7}', ("region", "id"))
    with pytest.raises(RecordError, match="tombstone without a key"):
        decode_key(None, ("id",))


def _target(**route: Any) -> Target:
    return Target(
        route=RouteSettings(topic="orders", table="public.orders", **route),
        schema="public",
        name="orders",
        columns=("id", "amount", "meta", "note"),
        required=frozenset({"id", "amount"}),
        defaulted=frozenset({"note"}),
    )


def test_a_record_without_a_required_column_is_refused_with_every_missing_name() -> None:
    target = _target()
    assert target.row(b'{"id": 1, "amount": 2}') == (1, 2, None, UNSET)
    with pytest.raises(RecordError, match="missing required column"):
        target.row(b'{"id": 1, "amount": null}')
    with pytest.raises(RecordError, match=r"column\(s\) amount, id$"):
        target.row(b'{"note": "x"}')


def test_an_upsert_record_must_carry_its_key() -> None:
    target = _target(mode="upsert", key_columns=["note"])
    assert target.key(target.row(b'{"id": 1, "amount": 2, "note": "n"}')) == ("n",)
    with pytest.raises(RecordError, match=r"value lacks key column\(s\) note$"):
        target.row(b'{"id": 1, "amount": 2, "note": null}')


def test_a_record_that_sets_a_generated_column_is_refused_by_name() -> None:
    target = Target(
        route=RouteSettings(topic="orders", table="public.orders"),
        schema="public",
        name="orders",
        columns=("id", "amount", "twice"),
        required=frozenset({"id"}),
        generated=frozenset({"twice"}),
    )
    assert target.tracked == (2,)  # absent stays apart from null there
    assert target.row(b'{"id": 1, "amount": 2}') == (1, 2, UNSET)
    for value in (b"4", b"null"):
        with pytest.raises(RecordError, match="column twice is generated by the table"):
            target.row(b'{"id": 1, "amount": 2, "twice": ' + value + b"}")


def test_a_batch_decodes_whole_or_not_at_all_and_then_record_by_record() -> None:
    target = _target()
    good = [b'{"id": 1, "amount": 2}', b'{"id": 2, "amount": 3.50, "note": null}']
    assert target.rows(good) == [target.row(value) for value in good]
    # Any record that is not a row sends the batch to `row`, which tells which and why.
    for bad in (b"not json", b"[1]", b'{"id": 3}', b'{"id": 3, "amount": null}'):
        assert target.rows([*good, bad]) is None
    generated = Target(
        route=RouteSettings(topic="orders", table="public.orders"),
        schema="public",
        name="orders",
        columns=("id", "twice"),
        required=frozenset(),
        generated=frozenset({"twice"}),
    )
    assert generated.rows([b'{"id": 1}']) == [(1, UNSET)]
    assert generated.rows([b'{"id": 1}', b'{"id": 2, "twice": null}']) is None


def test_a_batch_is_written_in_runs_that_carry_the_same_defaulted_columns() -> None:
    target = _target()
    assert target.tracked == (3,)  # only "note" has a default
    a, b, c = (target.row(b'{"id": 1, "amount": 2, "note": "a"}'),
               target.row(b'{"id": 2, "amount": 3, "meta": {"k": [1]}}'),
               target.row(b'{"id": 3, "amount": 4, "note": null}'))  # fmt: skip
    # Untracked columns are always named (absent is NULL there); a tracked one when carried.
    assert runs([a, c], target.tracked, 4) == [Run([0, 1, 2, 3], [a, c])]
    assert runs([b, b], target.tracked, 4) == [Run([0, 1, 2], [b, b])]
    # A mixed batch keeps its order, in runs: b's note takes the default, c's is NULL.
    assert runs([a, b, b, c], target.tracked, 4) == [
        Run([0, 1, 2, 3], [a]),
        Run([0, 1, 2], [b, b]),
        Run([0, 1, 2, 3], [c]),
    ]
    # In upsert mode every column is tracked: a column a record lacks is left as it is.
    upsert = _target(mode="upsert", key_columns=["id"])
    d = upsert.row(b'{"id": 4, "amount": 1, "note": "x"}')
    assert runs([d], upsert.tracked, 4) == [Run([0, 1, 3], [d])]


def test_a_row_is_projected_only_when_the_statement_names_fewer_columns() -> None:
    row = (1, 2, {"k": [1]}, "a")
    assert projector([0, 1, 2, 3], 4) is None
    project = projector([0, 1, 3], 4)
    assert project is not None and project(row) == (1, 2, "a")
    only = projector([2], 4)
    assert only is not None and only(row) == ({"k": [1]},)


def test_a_batch_that_carries_no_defaulted_column_decodes_straight_into_the_carried_ones() -> None:
    target = _target()
    plain = [b'{"id": 1, "amount": 2}', b'{"id": 2, "amount": 3.50, "meta": {"k": [1]}}']
    # The rows `rows` gives without their never-carried column: one COPY names the others.
    carried = target.carried_rows(plain)
    assert carried == (["id", "amount", "meta"], [row[:3] for row in target.rows(plain) or []])
    # A required column missing, or null: `rows` and then `row` tell which record and why.
    assert target.carried_rows([*plain, b'{"id": 3, "amount": null}']) is None


def test_a_record_carrying_more_than_the_carried_columns_sends_the_batch_the_whole_way() -> None:
    for more in (b'{"id": 3, "amount": 1, "note": "n"}',  # a defaulted column, even null
                 b'{"id": 3, "amount": 1, "note": null}',
                 b'{"id": 3, "amount": 1, "extra": 1}'):  # a key that is no column  # fmt: skip
        target = _target()
        assert target.carried_rows([b'{"id": 1, "amount": 2}', more]) is None
        # Tried again only after a while: a topic like this would pay the failed try each time.
        for _ in range(100):
            assert target.carried_rows([b'{"id": 1, "amount": 2}']) is None
        assert target.carried_rows([b'{"id": 1, "amount": 2}']) == (
            ["id", "amount", "meta"],
            [(1, 2, None)],
        )


def test_an_upsert_batch_takes_the_shortcut_only_when_it_carries_every_other_column() -> None:
    upsert = _target(mode="upsert", key_columns=["id"])
    whole = b'{"id": 1, "amount": 2, "meta": null}'
    assert upsert.carried_rows([whole]) == (["id", "amount", "meta"], [(1, 2, None)])
    assert upsert.carried_key is not None and upsert.carried_key((1, 2, None)) == 1
    # Absent is not null in upsert: a record lacking meta leaves it as it is, the long way.
    assert upsert.carried_rows([whole, b'{"id": 2, "amount": 3}']) is None
    fresh = _target(mode="upsert", key_columns=["id"])
    assert fresh.carried_rows([whole, b'{"id": null, "amount": 3, "meta": 1}']) is None


def test_a_table_without_defaults_in_insert_mode_has_no_carried_shortcut() -> None:
    plain = Target(
        route=RouteSettings(topic="orders", table="public.orders"),
        schema="public",
        name="orders",
        columns=("id", "amount"),
        required=frozenset({"id"}),
    )
    assert plain.carried_rows([b'{"id": 1, "amount": 2}']) is None  # `rows` needs no projection
