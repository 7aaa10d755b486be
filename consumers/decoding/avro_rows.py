"""Registry-framed Avro values to table rows, each value its exact PostgreSQL type.

A value's body is read by its writer schema (fetched by id, `consumers.decoding.registry_schemas`),
compiled once (`consumers.decoding.avro_program`) and read in C (`consumers.decoding._avro_body`), a
batch in one call, into Python values that psycopg sends as the types they are:
`timestamp-millis`/`-micros` as aware datetimes (timestamptz), `local-timestamp-*` as naive ones
(timestamp), `date`, `time-*`, `decimal` as Decimal with every digit (numeric), `uuid` as its text,
`bytes`/`fixed` as bytes (bytea), enums as text. Arrays go to array columns as PostgreSQL arrays,
and as JSON text to any other column (jsonb); records and maps go as JSON text (jsonb).

A column the writer schema has no field for is absent: UNSET where the table fills it (a
default, an identity) and where the route tracks absence, else NULL.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import repeat
from typing import Any, NamedTuple

from consumers.decoding.avro_program import Program, SchemaRefused, compile_record
from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import AVRO, HEADER, SchemaCache, schema_id, unframed
from consumers.decoding.rows import UNSET, ArrayValue, Row, as_cell, json_text

RowFix = Callable[[Row], Row]


class Reading(NamedTuple):
    """How the values of one writer schema become rows."""

    program: Program
    fix: RowFix | None  # nested values to JSON text, lists to arrays; None: nothing to fix


class AvroRowDecoder:
    """The same calls as `consumers.decoding.rows.RowDecoder`, for registry-framed Avro values."""

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
        self._readings: dict[int, Reading] = {}
        self._carried_readings: dict[int, Reading | None] = {}
        self._filled = frozenset(filled)
        self.carried = tuple(i for i, c in enumerate(columns) if c not in filled)

    def prepare(self, raws: Iterable[bytes]) -> set[str]:
        """See `SchemaCache.prepare`."""
        return self._schemas.prepare(raws)

    def decode(self, raw: bytes) -> Row:
        writer = schema_id(raw)
        if writer is None:
            raise unframed(raw)
        reading = self._readings.get(writer) or self._reading(writer)
        try:
            (row,) = reading.program.rows([raw], HEADER)
        except ValueError as exc:
            raise RecordError(f"value does not decode by schema id {writer}: {exc}") from None
        return row if reading.fix is None else reading.fix(row)

    def decode_all(self, raws: Iterable[bytes]) -> list[Row] | None:
        """Every value as a row, None when any is not one (`decode` then tells which). Values
        that all carry the same schema id, as a batch's mostly do, are read in one C call."""
        values = raws if isinstance(raws, list) else list(raws)
        writer = _one_writer(values)
        if writer is None:
            return self._one_by_one(values) if values else []
        try:
            reading = self._readings.get(writer) or self._reading(writer)
            rows = reading.program.rows(values, HEADER)
        except (RecordError, ValueError):
            return None
        return rows if reading.fix is None else list(map(reading.fix, rows))

    def _one_by_one(self, values: list[bytes]) -> list[Row] | None:
        try:
            return list(map(self.decode, values))
        except RecordError:
            return None

    def decode_carried(self, raws: Iterable[bytes]) -> list[Row] | None:
        """As `RowDecoder.decode_carried`: rows of the carried columns only, when the values
        share a writer schema that has a field for every tracked carried column and none for a
        column the table fills; else None."""
        values = raws if isinstance(raws, list) else list(raws)
        writer = _one_writer(values)
        if writer is None:
            return None
        if writer not in self._carried_readings:
            try:
                self._readings.get(writer) or self._reading(writer)
            except RecordError:
                return None
            self._carried_readings[writer] = self._carried_reading(writer)
        reading = self._carried_readings[writer]
        if reading is None:
            return None
        try:
            rows = reading.program.rows(values, HEADER)
        except ValueError:
            return None
        return rows if reading.fix is None else list(map(reading.fix, rows))

    def _carried_reading(self, writer: int) -> Reading | None:
        schema = self._schemas.schemas[writer]
        fields = {str(f["name"]) for f in schema["fields"]}
        carried = [self._columns[i] for i in self.carried]
        if fields & self._filled or not self._tracked.intersection(carried) <= fields:
            return None
        return reading_of(
            carried,
            schema,
            tracked=self._tracked,
            arrays=self._arrays,
            limit=self._schemas.max_decoded_bytes,
        )

    def _reading(self, writer: int) -> Reading:
        schema = self._schemas.of_kind(writer, AVRO)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            self._schemas.missing[writer] = f"schema id {writer} is not an Avro record"
            raise RecordError(self._schemas.missing[writer])
        try:
            reading = reading_of(
                self._columns,
                schema,
                tracked=self._tracked,
                arrays=self._arrays,
                limit=self._schemas.max_decoded_bytes,
            )
        except SchemaRefused as exc:  # the cache checks what it fetches; this is a second guard
            self._schemas.missing[writer] = f"schema id {writer} cannot be read: {exc}"
            raise RecordError(self._schemas.missing[writer]) from None
        self._readings[writer] = reading
        return reading


def _one_writer(values: list[bytes]) -> int | None:
    """The schema id every value names, in C loops; None when they name none or several."""
    if not values:
        return None
    header = values[0][:HEADER]
    writer = schema_id(header)
    if writer is None or not all(map(bytes.startswith, values, repeat(header))):
        return None
    return writer


def reading_of(
    columns: Sequence[str],
    schema: dict[str, Any],
    *,
    tracked: Collection[str],
    arrays: Collection[str],
    limit: int,
) -> Reading:
    """How values of the record `schema` (as fastavro parses it) become rows of `columns`."""
    kinds = {f["name"]: _kind(f["type"]) for f in schema["fields"]}
    absent = [None if c in kinds else (UNSET if c in tracked else None) for c in columns]
    fixes: list[tuple[int, Callable[[Any], Any]]] = []
    for i, column in enumerate(columns):
        fix = _converter(kinds[column], to_array=column in arrays) if column in kinds else None
        if fix is not None:
            fixes.append((i, fix))
    program = compile_record(schema, columns, absent, limit=limit)
    return Reading(program, _row_fix(fixes) if fixes else None)


def _row_fix(fixes: list[tuple[int, Callable[[Any], Any]]]) -> RowFix:
    def fix(row: Row) -> Row:
        values = list(row)
        for i, convert in fixes:
            if values[i] is not None:
                values[i] = convert(values[i])
        return tuple(values)

    return fix


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
