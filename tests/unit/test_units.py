"""How a group's queries spread over its members (`consumers.epochs.units`): the units
of queries that share a topic, and their assignment to the live members."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from consumers.epochs.units import Owned, Unit, assign, units_of


def test_queries_that_write_a_common_topic_are_one_unit_named_by_its_first_topic() -> None:
    units = units_of([("q1", "orders"), ("q2", "payments"), ("q3", "payments"),
                      ("q3", "refunds"), ("q4", "audit")])  # fmt: skip
    assert units == [
        Unit(name="audit", topics=frozenset({"audit"}), queries=frozenset({"q4"})),
        Unit(name="orders", topics=frozenset({"orders"}), queries=frozenset({"q1"})),
        Unit(name="payments", topics=frozenset({"payments", "refunds"}),
             queries=frozenset({"q2", "q3"})),
    ]  # fmt: skip


def test_a_query_joining_two_units_makes_them_one() -> None:
    units = units_of([("q1", "a"), ("q2", "b"), ("q3", "a"), ("q3", "b")])
    assert [(u.name, sorted(u.queries)) for u in units] == [("a", ["q1", "q2", "q3"])]


def test_two_queries_on_two_members_one_each_and_one_member_takes_both_when_alone() -> None:
    units = units_of([("q1", "a"), ("q2", "b")])
    assert {slot: [u.name for u in of] for slot, of in assign(units, [0, 1]).items()} == {
        0: ["a"], 1: ["b"]
    }  # fmt: skip
    assert {slot: [u.name for u in of] for slot, of in assign(units, [1]).items()} == {
        1: ["a", "b"]
    }  # fmt: skip
    assert assign(units, []) == {}


@given(
    st.lists(st.tuples(st.sampled_from("pqrstuvw"), st.sampled_from("abcdefgh")), max_size=30),
    st.sets(st.integers(0, 20), min_size=1, max_size=6),
)
def test_every_unit_has_one_owner_and_none_has_more_than_its_share(
    named: list[tuple[str, str]], slots: set[int]
) -> None:
    units = units_of(named)
    given_to = assign(units, slots)
    assert sorted(u.name for of in given_to.values() for u in of) == [u.name for u in units]
    share = math.ceil(len(units) / len(slots))
    assert all(len(of) <= share for of in given_to.values())
    if len(units) >= len(slots):
        assert all(of for of in given_to.values())  # none idle while another owns two
    topics = [t for u in units for t in u.topics]
    assert len(topics) == len(set(topics)) == len({t for _, t in named})  # a topic, one unit


def test_a_member_reads_the_topics_it_owns_and_those_no_unit_names() -> None:
    owned = Owned(topics=frozenset({"a"}), named=frozenset({"a", "b"}))
    assert owned.reads("a") and not owned.reads("b") and owned.reads("connect-orders")
