"""JSON record values to table rows, exactly, at C speed.

This is the consumer's per-record path. Each target table gets a msgspec Struct with one field
per column: decoding a value fills that Struct in C, takes the last of duplicate keys and ignores
keys that are not columns. Where it matters, a column the record does not carry is left `UNSET`,
so that "absent" (the table's default fills it, an upsert leaves it as it is) stays apart from
JSON null (NULL); elsewhere absent and null are both NULL, and cost nothing to tell apart.

Numbers are exact by construction: integers of any size are Python ints, and every number with
a fraction or an exponent becomes a Decimal from its own digits, which PostgreSQL reads exactly
into numeric, or refuses (a record fault) where a double or an integer column cannot hold it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from decimal import Decimal
from itertools import groupby, repeat
from operator import is_, itemgetter
from typing import Any, NamedTuple

import msgspec
import psycopg
from psycopg.adapt import Dumper
from psycopg.types.array import ListDumper

from consumers.decoding.records import RecordError

UNSET = msgspec.UNSET
Row = tuple[Any, ...]  # one value per table column, in table order; UNSET where not carried

_any_json = msgspec.json.Decoder(float_hook=Decimal)
_objects = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_json = msgspec.json.Encoder(decimal_format="number")
_astuple = msgspec.structs.astuple
_NESTED = (dict, list)


class RowDecoder:
    """Decodes a record value into a `Row` of the given columns: UNSET where a `tracked` column
    is absent, None where any other column is absent or null.

    `filled`: the columns the table fills (a default, an identity, a generated column), which
    producers seldom send; the others are the `carried` columns, for `decode_carried`.

    `others`: the other keys a value may hold, which land in no column; `decode_all` and
    `decode_carried` decline a batch with any key beyond those (for `decode`, one value at a
    time, which reads any). None: any key."""

    def __init__(
        self,
        columns: Sequence[str],
        *,
        tracked: Collection[str] = (),
        filled: Collection[str] = (),
        others: Collection[str] | None = None,
    ) -> None:
        defaults = [(c, UNSET if c in tracked else None) for c in columns]
        self._decode = _struct_decoder(defaults, forbid_unknown=False)
        # Known keys that land nowhere are read as raw bytes (not decoded) and cut off the row.
        skipped = sorted(set(others or ()) - set(columns))
        self._decode_batch = (
            self._decode
            if others is None
            else _struct_decoder(defaults, forbid_unknown=True, skipped=skipped)
        )
        self._cut = itemgetter(slice(0, len(columns))) if skipped else None
        self.carried = tuple(i for i, c in enumerate(columns) if c not in filled)
        # With nothing tracked, `decode_all` gives what `decode_carried` would, as cheaply. A
        # tracked column is required among the carried ones: absent is not null there.
        self._decode_carried = (
            _struct_decoder(
                [(columns[i], _REQUIRED if columns[i] in tracked else None) for i in self.carried],
                forbid_unknown=True,
            )
            if tracked and self.carried
            else None
        )
        self._carried_skips = 0  # batches left before the carried columns are tried again

    def decode(self, raw: bytes) -> Row:
        try:
            return _astuple(self._decode(raw))
        except msgspec.ValidationError as exc:  # valid JSON, but not an object
            raise RecordError(f"value is not a JSON object: {exc}") from None
        except msgspec.DecodeError as exc:
            raise RecordError(f"value is not JSON: {exc}") from None

    def decode_all(self, raws: Iterable[bytes]) -> list[Row] | None:
        """Every value as a row, in C loops; None when any value is not one, for the caller to
        decode them one by one and tell which and why."""
        try:
            rows = list(map(_astuple, map(self._decode_batch, raws)))
        except msgspec.DecodeError:  # ValidationError included
            return None
        return rows if self._cut is None else list(map(self._cut, rows))

    def decode_all_leaving_out(self, raws: Iterable[bytes]) -> list[Row] | None:
        """As `decode_all`, with any key that is not a column left out (`others` or not)."""
        try:
            return list(map(_astuple, map(self._decode, raws)))
        except msgspec.DecodeError:  # ValidationError included
            return None

    def decode_carried(self, raws: Iterable[bytes]) -> list[Row] | None:
        """Every value as a row of the `carried` columns only, in C loops, when each holds
        every tracked one of them and no other key: the same rows as `decode_all` gives
        without their filled columns (all UNSET) and with no UNSET elsewhere, and no Python
        step per row to take the filled ones out. None otherwise, and then the next batches
        are not tried for a while, so that a topic whose records do not fit pays for a failed
        try once in so many batches."""
        if self._decode_carried is None or self._carried_skips:
            self._carried_skips = max(0, self._carried_skips - 1)
            return None
        try:
            return list(map(_astuple, map(self._decode_carried, raws)))
        except msgspec.DecodeError:  # ValidationError included
            self._carried_skips = _CARRIED_SKIPS
            return None


# After a batch whose records carry more than the carried columns: how many batches go straight
# to the whole decoding before the carried columns are tried again.
_CARRIED_SKIPS = 100
_REQUIRED = msgspec.NODEFAULT  # a field without a default: a value without it is refused


def _struct_decoder(
    fields: Sequence[tuple[str, Any]], *, forbid_unknown: bool, skipped: Sequence[str] = ()
) -> Callable[[bytes], Any]:
    """A decoder of JSON objects into a Struct of the given (column, default) fields; with
    `forbid_unknown`, an object with a key that is not one of them (or of `skipped`, read
    after them as raw bytes) is refused."""
    # Struct fields must be identifiers and column names need not be: the fields are
    # positional names renamed to the columns, which are the JSON keys.
    names = [name for name, _ in fields] + list(skipped)
    struct = msgspec.defstruct(
        "Row",
        [
            (f"c{i}", Any) if default is _REQUIRED else (f"c{i}", Any, default)
            for i, (_, default) in enumerate(fields)
        ]
        + [(f"c{len(fields) + i}", msgspec.Raw, UNSET) for i in range(len(skipped))],
        rename={f"c{i}": name for i, name in enumerate(names)},
        forbid_unknown_fields=forbid_unknown,
        kw_only=True,  # required and defaulted fields in any order, kept in the given one
    )
    return msgspec.json.Decoder(struct, float_hook=Decimal).decode


class Run(NamedTuple):
    """Consecutive rows that carry the same columns: one statement writes them."""

    positions: list[int]  # the columns the statement names, in table order
    rows: list[Row]


def runs(rows: list[Row], tracked: Sequence[int], width: int) -> list[Run]:
    """The rows, in order, in runs that carry the same tracked columns. A tracked column no row
    carries is left out of the statement, so that the table's default fills it (or an upsert
    leaves it as it is); batches whose rows all carry the same columns are one run."""
    count = len(rows)
    named = [i for i in range(width) if i not in tracked]
    mixed = []
    for i in tracked:  # one C pass over the batch per tracked column
        absent = count_of(rows, i, UNSET)
        if absent == 0:
            named.append(i)
        elif absent < count:
            mixed.append(i)
    if not mixed:
        return [Run(sorted(named), rows)]
    return [
        Run(sorted(named + [i for i, unset in zip(mixed, shape, strict=True) if not unset]), [*run])
        for shape, run in groupby(rows, key=lambda row: tuple(row[i] is UNSET for i in mixed))
    ]


def count_of(rows: list[Row], position: int, marker: Any) -> int:
    """How many rows hold `marker` (UNSET, None) at `position`, in C loops. By identity: an
    equality test would ask each value's own `__eq__`, which costs twice as much."""
    return sum(map(is_, map(itemgetter(position), rows), repeat(marker)))


def projector(positions: Sequence[int], width: int) -> Callable[[Row], Row] | None:
    """A function keeping `positions` of a row, or None when that is every column."""
    if len(positions) == width:
        return None
    if len(positions) == 1:
        only = positions[0]
        return lambda row: (row[only],)
    return itemgetter(*positions)


def json_text(value: Any) -> str:
    """A value as JSON text, decimals as numbers with every digit."""
    return _json.encode(value).decode()


def objects(raws: Iterable[bytes]) -> list[dict[str, msgspec.Raw]] | None:
    """Each value as an object of its keys, their values left undecoded, in C loops; None when
    any value is not a JSON object."""
    try:
        return list(map(_objects, raws))
    except msgspec.DecodeError:  # ValidationError included
        return None


def json_keys(raw: bytes | None) -> list[str]:
    """The keys of a JSON object value; none for anything else (a dead letter's business)."""
    if raw is None:
        return []
    try:
        parsed = _any_json.decode(raw)
    except msgspec.DecodeError:
        return []
    return [str(key) for key in parsed] if isinstance(parsed, dict) else []


def as_cell(value: Any) -> Any:
    """A value as a statement parameter: nested objects and arrays as their JSON text."""
    return json_text(value) if isinstance(value, _NESTED) else value


def decode_key(raw: bytes | None, key_columns: tuple[str, ...]) -> tuple[Any, ...]:
    """The key columns of a record's key: a JSON object with them, or for one key column a
    bare JSON scalar or plain text."""
    if raw is None:
        raise RecordError("tombstone without a key")
    try:
        parsed: Any = _any_json.decode(raw)
    except msgspec.DecodeError:
        parsed = raw.decode("utf-8", "replace")
    return key_columns_of(parsed, key_columns)


def key_columns_of(parsed: Any, key_columns: tuple[str, ...]) -> tuple[Any, ...]:
    """The key columns of a decoded key: an object (a mapping) with them, or for one key column
    any other value but an array."""
    if isinstance(parsed, dict):
        missing = [c for c in key_columns if c not in parsed]
        if missing:
            raise RecordError(f"key lacks key column(s) {', '.join(missing)}")
        return tuple(as_cell(parsed[c]) for c in key_columns)
    if len(key_columns) == 1 and not isinstance(parsed, list):
        return (as_cell(parsed),)
    raise RecordError(f"key must be a JSON object with {', '.join(key_columns)}")


class ArrayValue(list[Any]):
    """A list bound for a PostgreSQL array column, sent as an array (`{1,2}`), where any other
    list is JSON text (for json and jsonb columns)."""


class _NullDumper(Dumper):
    """A column the row does not carry, in a statement that names it: NULL."""

    def dump(self, obj: Any) -> None:
        return None


class _JsonTextDumper(Dumper):
    """Nested objects and arrays as JSON text, which json, jsonb and text columns take."""

    def dump(self, obj: Any) -> bytes:
        return _json.encode(obj)


def row_cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A cursor whose COPY writes rows as they are: UNSET as NULL, nested values as JSON text,
    an `ArrayValue` as an array. The dumpers are the cursor's own; the connection keeps
    psycopg's (lists as arrays)."""
    cursor = conn.cursor()
    cursor.adapters.register_dumper(type(UNSET), _NullDumper)
    cursor.adapters.register_dumper(dict, _JsonTextDumper)
    cursor.adapters.register_dumper(list, _JsonTextDumper)
    cursor.adapters.register_dumper(ArrayValue, ListDumper)
    return cursor
