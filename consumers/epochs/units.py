"""A group's Spark queries as units of ownership (`epochs_members: one`), and their share per
member: pure, so that the thread that takes their locks (`consumers.membership.unit_owners`)
and the policy that subscribes by them (`consumers.epochs.whole_routes`) are tested without a
database.

A **unit** is the queries that write a common topic, and their topics (its partitions can have
one reader only): the connected parts of the graph of `epoch_topics` (the topics of the group's
whole routes each query's manifest names), named by their first topic. A topic no manifest
names is in no unit: every member reads it, as a per-partition route's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Unit:
    """Queries that write a common topic, and every topic they write."""

    name: str  # its first topic
    topics: frozenset[str]
    queries: frozenset[str]


def units_of(named: Iterable[tuple[str, str]]) -> list[Unit]:
    """The units of (query, topic) pairs, in the order of their names."""
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]  # halve the path as it is walked
            node = parent[node]
        return node

    pairs = list(named)
    for query, topic in pairs:
        a, b = root(f"q:{query}"), root(f"t:{topic}")
        if a != b:
            parent[max(a, b)] = min(a, b)
    topics: dict[str, set[str]] = {}
    queries: dict[str, set[str]] = {}
    for query, topic in pairs:
        top = root(f"q:{query}")
        topics.setdefault(top, set()).add(topic)
        queries.setdefault(top, set()).add(query)
    found = [
        Unit(name=min(topics[top]), topics=frozenset(topics[top]), queries=frozenset(queries[top]))
        for top in topics
    ]
    return sorted(found, key=lambda unit: unit.name)


def assign(units: list[Unit], slots: Iterable[int]) -> dict[int, list[Unit]]:
    """Each live slot's units: the units in order, to the slots in order, in turn."""
    live = sorted(set(slots))
    given: dict[int, list[Unit]] = {slot: [] for slot in live}
    if live:
        for index, unit in enumerate(sorted(units, key=lambda u: u.name)):
            given[live[index % len(live)]].append(unit)
    return given


@dataclass(frozen=True)
class Owned:
    """What a member reads of the whole routes, as its thread last found it."""

    topics: frozenset[str] = frozenset()  # of the units whose locks it holds
    named: frozenset[str] = frozenset()  # of every unit: no other member shares them
    queries: Mapping[str, bool] = field(default_factory=dict)  # each query: whether it owns it

    def reads(self, topic: str) -> bool:
        """Whether the member subscribes to a whole route's `topic`: it owns its unit, or no
        unit names it (every member shares it)."""
        return topic in self.topics or topic not in self.named
