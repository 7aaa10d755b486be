"""Whether a record's fields make a row of its table: a record never becomes a row it does not
fill.

Two rules, judged on a record's top-level fields (a JSON object's keys, the fields of the
writer schema or Protobuf message it was written with):

- A record that carries none of its table's columns beyond the key is not a row of it, whatever
  the route says: a Debezium change event (`before`, `after`, `op`), a Connect JSON envelope
  (`schema`, `payload`) or another table's record would be a row of NULLs. It is refused, and
  named.
- Fields the table has no column for follow the route's `unknown_fields`: `refuse` (the
  default, as Kafka Connect's JDBC sink refuses them unless it may evolve the table) makes the
  record a record error (a dead letter, or a stop with `on_record_error: stop`); `ignore` leaves
  them out, and every such record is counted and reported (`LeftOut`).

Fields a route means to leave out (`fields.exclude`, those `fields.include` does not name, a
column's name filled from elsewhere) are never unknown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from bridge.settings import UnknownFields

# How many of a record's field names an error lists, and how much of each: the names come
# from outside, and a record of a million keys must not make a message of them all.
_NAMES_SHOWN = 12
_NAME_CHARS = 64
_any_json = msgspec.json.Decoder()


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

    def note(self, fields: Collection[str]) -> None:
        self.records += 1
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
