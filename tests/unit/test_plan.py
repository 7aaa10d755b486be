"""A batch's statements and rows are the same whichever way its records are decoded: straight
into the columns they carry, or whole and then projected."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Message

from bridge.settings import RouteSettings
from consumers.tables.applier import Applier, Step
from consumers.tables.targets import Target


def _target(**route: Any) -> Target:
    return Target(
        route=RouteSettings(topic="orders", table="public.orders", **route),
        schema="public",
        name="orders",
        columns=("id", "amount", "meta", "note", "at"),
        required=frozenset({"id"}),
        defaulted=frozenset({"note", "at"}),
    )


def _records(values: list[bytes]) -> list[Message]:
    return [Message(topic="orders", partition=0, offset=i, value=v) for i, v in enumerate(values)]


def _the_long_way(target: Target) -> Target:
    """The same target, whose next batches skip the shortcut: one it failed makes them."""
    assert target.decoder.decode_carried([b'{"not a column": 1}']) is None
    return target


def _shown(steps: list[Step] | None) -> list[tuple[str, list[Any] | None]]:
    assert steps is not None
    return [(step.statement.as_string(), step.rows) for step in steps]


VALUES = [
    b'{"id": 1, "amount": 2.50, "meta": {"k": [1]}}',
    b'{"id": 2, "amount": null, "meta": null}',
    b'{"id": 1, "amount": 3, "meta": [1, 2]}',  # the same key again: upsert keeps the last
    b'{"id": 3, "amount": 1E+2, "meta": "x"}',
]


@pytest.mark.parametrize("route", [{}, {"mode": "upsert", "key_columns": ["id"]}])
def test_the_shortcut_plans_what_the_long_way_plans(route: dict[str, Any]) -> None:
    records = _records(VALUES)
    short = Applier.plan(_target(**route), records, set())
    long = Applier.plan(_the_long_way(_target(**route)), records, set())
    assert _shown(short) == _shown(long)
    copy = next(step for step in short or [] if step.rows is not None)
    assert '("id", "amount", "meta")' in copy.statement.as_string()  # the filled ones left out
    if route:  # the later record of id 1 wins, in its place
        assert [row[0] for row in copy.rows or []] == [2, 1, 3]


def test_a_nested_upsert_key_goes_the_long_way_and_wins_by_its_json_text() -> None:
    target = _target(mode="upsert", key_columns=["meta"])
    records = _records([b'{"id": 1, "meta": {"k": 1}, "amount": 1}',
                        b'{"id": 2, "meta": {"k": 1}, "amount": 2}'])  # fmt: skip
    (copy,) = [step for step in Applier.plan(target, records, set()) or [] if step.rows]
    assert copy.rows == [(2, 2, {"k": 1})]
