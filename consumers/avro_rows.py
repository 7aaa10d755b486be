"""Registry-framed Avro values to table rows, each value its exact PostgreSQL type.

fastavro reads a value's body by its writer schema (fetched by id, `consumers.registry_schemas`)
into Python values that psycopg sends as the types they are: `timestamp-millis`/`-micros` as
aware datetimes (timestamptz), `local-timestamp-*` as naive ones (timestamp), `date`, `time-*`,
`decimal` as Decimal with every digit (numeric), `uuid` as UUID, `bytes`/`fixed` as bytes
(bytea), enums as text. Arrays go to array columns as PostgreSQL arrays, and as JSON text to any
other column (jsonb); records and maps go as JSON text (jsonb).

A column the writer schema has no field for is absent: UNSET where the table fills it (a
default, an identity) and where the route tracks absence, else NULL.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, cast

import fastavro

from consumers.records import RecordError
from consumers.registry_schemas import AVRO, HEADER, SchemaCache, schema_id, unframed
from consumers.rows import UNSET, ArrayValue, Row, as_cell, json_text

_read = fastavro.schemaless_reader
# What fastavro raises for bytes its schema does not read: too few, text that is not UTF-8, an
# enum symbol or union branch index out of range, a length that makes no sense.
_UNREADABLE = (EOFError, ValueError, IndexError, KeyError, OverflowError, TypeError, MemoryError)
RowMaker = Callable[[dict[str, Any]], Row]


class AvroRowDecoder:
    """The same calls as `consumers.rows.RowDecoder`, for registry-framed Avro values."""

    def __init__(
        self,
        columns: Sequence[str],
        *,
        schemas: SchemaCache,
        tracked: Collection[str] = (),
        filled: Collection[str] = (),
        arrays: Collection[str] = (),
    ) -> None:
        self._columns = tuple(columns)
        self._tracked = frozenset(tracked)
        self._arrays = frozenset(arrays)
        self._schemas = schemas
        self._makers: dict[int, RowMaker] = {}
        self.carried = tuple(i for i, c in enumerate(columns) if c not in filled)

    def prepare(self, raws: Iterable[bytes]) -> set[str]:
        """See `SchemaCache.prepare`."""
        return self._schemas.prepare(raws)

    def decode(self, raw: bytes) -> Row:
        writer = schema_id(raw)
        if writer is None:
            raise unframed(raw)
        maker = self._makers.get(writer) or self._maker(writer)
        body = io.BytesIO(raw)
        body.seek(HEADER)
        try:
            record = _read(body, self._schemas.schemas[writer], None)
        except _UNREADABLE as exc:
            raise RecordError(f"value does not decode by schema id {writer}: {exc!r}") from None
        if body.tell() != len(raw):
            raise RecordError(
                f"value does not decode by schema id {writer}: "
                f"{len(raw) - body.tell()} byte(s) after the record"
            )
        return maker(record)  # type: ignore[arg-type] # a record schema reads a dict

    def decode_all(self, raws: Iterable[bytes]) -> list[Row] | None:
        """Every value as a row, None when any is not one (`decode` then tells which). Values
        that all carry the same schema id, as a batch's mostly do, are read in C loops."""
        values = raws if isinstance(raws, list) else list(raws)
        if not values:
            return []
        header = values[0][:HEADER]
        writer = schema_id(header)
        if writer is None or not all(map(bytes.startswith, values, repeat(header))):
            return self._one_by_one(values)
        try:
            maker = self._makers.get(writer) or self._maker(writer)
        except RecordError:
            return None
        bodies = list(map(io.BytesIO, values))
        deque(map(io.BytesIO.seek, bodies, repeat(HEADER)), maxlen=0)
        try:
            schema = self._schemas.schemas[writer]
            # A record schema reads dicts.
            records = cast(
                list[dict[str, Any]], list(map(_read, bodies, repeat(schema), repeat(None)))
            )
        except _UNREADABLE:
            return None
        # Each body read to its end and no further: a value with bytes left over is not a row.
        if list(map(io.BytesIO.tell, bodies)) != list(map(len, values)):
            return None
        return list(map(maker, records))

    def _one_by_one(self, values: list[bytes]) -> list[Row] | None:
        try:
            return list(map(self.decode, values))
        except RecordError:
            return None

    def decode_carried(self, raws: Iterable[bytes]) -> list[Row] | None:
        return None  # every Avro row goes through `decode_all`

    def _maker(self, writer: int) -> RowMaker:
        if writer in self._schemas.missing:
            raise RecordError(self._schemas.missing[writer])
        schema = self._schemas.schemas.get(writer)
        if schema is None:  # `prepare` was not called for it: a bug, not the record's
            raise KeyError(f"schema id {writer} was not fetched before decoding")
        if self._schemas.types.get(writer) != AVRO:
            raise RecordError(f"schema id {writer} is a {self._schemas.types[writer]} schema, "
                              "not Avro: the route's value_format says avro")  # fmt: skip
        if not isinstance(schema, dict) or schema.get("type") != "record":
            self._schemas.missing[writer] = f"schema id {writer} is not an Avro record"
            raise RecordError(self._schemas.missing[writer])
        maker = row_maker(self._columns, schema, tracked=self._tracked, arrays=self._arrays)
        self._makers[writer] = maker
        return maker


def row_maker(
    columns: Sequence[str],
    schema: dict[str, Any],
    *,
    tracked: Collection[str],
    arrays: Collection[str],
) -> RowMaker:
    """A function from a decoded record (a dict) to a row of `columns`."""
    kinds = {f["name"]: _kind(f["type"]) for f in schema["fields"]}
    width = len(columns)
    present = [i for i, c in enumerate(columns) if c in kinds]
    absent = {i: (UNSET if c in tracked else None) for i, c in enumerate(columns) if c not in kinds}
    converters: list[tuple[int, Callable[[Any], Any]]] = []
    for i in present:
        column = columns[i]
        converter = _converter(kinds[column], to_array=column in arrays)
        if converter is not None:
            converters.append((i, converter))
    take = itemgetter(*(columns[i] for i in present)) if present else None
    if take is not None and not absent and not converters and width > 1:
        return take  # every column a field as it is: the row straight from the record, in C

    def make(record: dict[str, Any]) -> Row:
        values: list[Any] = [None] * width
        if take is not None:
            taken = take(record)
            if len(present) == 1:
                taken = (taken,)
            for i, value in zip(present, taken, strict=True):
                values[i] = value
        for i, marker in absent.items():
            values[i] = marker
        for i, convert in converters:
            if values[i] is not None:
                values[i] = convert(values[i])
        return tuple(values)

    return make


def _kind(avro_type: Any) -> str:
    """What a field's values are, as far as a column cares: 'nested' (records, maps), 'array',
    or 'plain'; a union is what its non-null branches are when they agree."""
    if isinstance(avro_type, list):
        kinds = {_kind(branch) for branch in avro_type if branch != "null"}
        return kinds.pop() if len(kinds) == 1 else "mixed"
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind in ("record", "map"):
            return "nested"
        if kind == "array":
            return "array"
    return "plain"


def _converter(kind: str, *, to_array: bool) -> Callable[[Any], Any] | None:
    if kind == "nested":
        return json_text
    if kind == "array":
        return ArrayValue if to_array else json_text
    if kind == "mixed":
        return _mixed_to_array if to_array else as_cell
    return None


def _mixed_to_array(value: Any) -> Any:
    if isinstance(value, list):
        return ArrayValue(value)
    return as_cell(value)
