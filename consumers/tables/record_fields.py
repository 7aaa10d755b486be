"""Whether a record's fields make a row of its table: a record never becomes a row it does not
fill.

Two rules, judged on a record's top-level fields (a JSON object's keys, the fields of the
writer schema or Protobuf message it was written with):

- A record that carries none of its table's columns beyond the key is not a row of it, whatever
  the route says: a Debezium change event (`before`, `after`, `op`), a Connect JSON envelope
  (`schema`, `payload`) or another table's record would be a row of NULLs. It is refused, and
  named.
- Fields the table has no column for follow the route's `unknown_fields`: `ignore` (the
  default, as Spark's and Flink's JSON readers do) leaves them out, and every such record is
  counted and reported (`LeftOut`); `refuse` (as Kafka Connect's JDBC sink refuses them unless
  it may evolve the table) makes the record a record error (a dead letter, or a stop with
  `on_record_error: stop`).

Fields a route means to leave out (`fields.exclude`, those `fields.include` does not name, a
column's name filled from elsewhere) are never unknown.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import msgspec

from bridge.settings import UnknownFields

# How many of a record's field names an error lists, and how much of each: the names come
# from outside, and a record of a million keys must not make a message of them all.
_NAMES_SHOWN = 12
_NAME_CHARS = 64
_any_json = msgspec.json.Decoder()
_FIELDS_COUNTED = 100


class Verdict(NamedTuple):
    """What a record of some fields is: `problem`, why it is no row (None: it is one), and the
    fields `unknown_fields: ignore` leaves out of it."""

    problem: str | None
    ignored: tuple[str, ...] = ()


@dataclass
class LeftOut:
    """The fields `unknown_fields: ignore` left out of a table's records, counted record by
    record until the member takes them to report."""

    records: int = 0
    fields: Counter[str] = field(default_factory=Counter)

    def note(self, fields: Collection[str], records: int = 1) -> None:
        self.records += records
        self.fields.update(dict.fromkeys(fields, records))

    def add(self, records: int, fields: Counter[str]) -> None:
        self.records += records
        self.fields.update(fields)

    def take(self) -> tuple[int, Counter[str]]:
        """The records and fields noted since the last take."""
        taken = self.records, self.fields
        self.records, self.fields = 0, Counter()
        return taken


class FieldRules:
    """The two rules above for one table's route, each verdict kept by the set of fields it
    was given (a topic's records come in a few shapes)."""

    def __init__(
        self,
        *,
        table: str,
        landing: Collection[str],
        beyond_key: Collection[str],
        known: Collection[str] | None,
        unknown_fields: UnknownFields,
    ) -> None:
        """`landing`: the fields that fill a column; `beyond_key`: those of them that fill a
        column other than the key's (a record must carry one, if there are any); `known`: every
        field a record may carry without it being unknown (None: any field)."""
        self._table = table
        self._beyond_key = frozenset(beyond_key)
        self._known = None if known is None else frozenset(known) | frozenset(landing)
        self._policy = unknown_fields
        self._verdicts: dict[frozenset[str], Verdict] = {}

    @property
    def checks(self) -> bool:
        """Whether any record could be refused or have fields left out."""
        return bool(self._beyond_key) or self._known is not None

    @property
    def known(self) -> frozenset[str] | None:
        return self._known

    def left_out_of(self, found: list[dict[str, Any]]) -> tuple[int, Counter[str]] | None:
        """For `unknown_fields: ignore`, a batch's objects (their keys) at once: how many carry
        fields that are left out, and how often each field is; None when some object is no
        row (it fills no column beyond the key), for each to be judged alone. In C loops."""
        if self._beyond_key and any(map(self._beyond_key.isdisjoint, found)):
            return None
        if self._known is None:
            return 0, Counter()
        fitting = sum(map(self._known.issuperset, found))
        if fitting == len(found):
            return 0, Counter()
        unknown = set().union(*found) - self._known
        # A field a time, each a C loop; past so many distinct ones, hostile or broken
        # producers are told apart by their first fields only.
        counts = Counter({
            name: sum(map(operator.contains, found, repeat(name)))
            for name in sorted(unknown)[:_FIELDS_COUNTED]
        })  # fmt: skip
        return len(found) - fitting, counts

    def judge(self, fields: Collection[str]) -> Verdict:
        """The verdict on a record that carries `fields`."""
        shape = frozenset(fields)
        verdict = self._verdicts.get(shape)
        if verdict is None:
            verdict = self._judged(shape)
            if len(self._verdicts) < 1_000:  # a topic's shapes are few; a hostile one's not
                self._verdicts[shape] = verdict
        return verdict

    def _judged(self, fields: frozenset[str]) -> Verdict:
        if self._beyond_key and not fields & self._beyond_key:
            return Verdict(
                f"the record fills none of {self._table}'s columns beyond its key: its fields "
                f"are {_named(fields) or 'none'}{_envelope(fields)}"
            )
        unknown = sorted(fields - self._known) if self._known is not None else []
        if not unknown:
            return Verdict(None)
        if self._policy == "ignore":
            return Verdict(None, tuple(unknown))
        return Verdict(
            f"field(s) {_named(unknown)} are not columns of {self._table}: add the column(s), "
            "let the table evolve (auto_evolve, registry formats), leave them out by name "
            "(fields.exclude) or all (unknown_fields: ignore)"
        )


def object_keys(raw: bytes) -> list[str] | None:
    """The keys of a JSON object value; None for anything else, which decoding names."""
    try:
        parsed = _any_json.decode(raw)
    except msgspec.DecodeError:
        return None
    return [str(key) for key in parsed] if isinstance(parsed, dict) else None


def _named(fields: Collection[str]) -> str:
    names = sorted(fields)
    shown = ", ".join(
        n if len(n) <= _NAME_CHARS else n[:_NAME_CHARS] + "…" for n in names[:_NAMES_SHOWN]
    )
    return shown + (f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else "")


def _envelope(fields: frozenset[str]) -> str:
    """What a record that is a known envelope is, and how to unwrap it."""
    if {"before", "after", "op"} <= fields:
        return (
            " (a Debezium change event: unwrap it on the source connector with "
            "io.debezium.transforms.ExtractNewRecordState, transforms=unwrap)"
        )
    if {"schema", "payload"} == fields:
        return (
            " (a Kafka Connect JSON envelope: produce plain JSON, JsonConverter with "
            "schemas.enable=false, or JSON Schema through the registry)"
        )
    return ""
