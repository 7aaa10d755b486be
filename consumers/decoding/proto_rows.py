"""Registry-framed Protobuf values to table rows, with no generated code.

Each value names its writer schema by id and its message by the indexes after it; the schema,
fetched and compiled once (`consumers.decoding.registry_schemas`,
`consumers.decoding.proto_schemas`), reads the body into its fields by the rules stated there
(docs/typed-records.md, Protobuf), which are PostgreSQL's types already: int, float, bool, text,
bytes (bytea), an aware datetime (timestamptz), a timedelta (interval). A list goes to an array
column as a PostgreSQL array and to any other column as JSON text (jsonb), as a map and a
nested message do.

A column the message has no field for is absent: UNSET where the table fills it and where the
route tracks absence, else NULL. A field that has presence and is not set is NULL, a plain
proto3 scalar that is not set its default: the body cannot tell that one from its default.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

from consumers.decoding import _proto_body
from consumers.decoding.proto_schemas import (
    JsonDocument,
    ProtoError,
    ProtoSchema,
    Reader,
    read_indexes,
)
from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import HEADER, PROTOBUF, SchemaCache, schema_id, unframed
from consumers.decoding.rows import UNSET, ArrayValue, Row, json_text

# A body's values take at most this many times its bytes in memory (a packed repeated field's
# one-byte elements as Python ints, with their list): the decoded size bound, checked up front.
_EXPANSION = 40
_FIRST: tuple[int, ...] = (0,)


class ProtobufRowDecoder:
    """The same calls as `consumers.decoding.rows.RowDecoder`, for registry-framed Protobuf."""

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
        self._absent = tuple(UNSET if c in tracked else None for c in columns)
        self._arrays = frozenset(arrays)
        self._schemas = schemas
        self._tracked = frozenset(tracked)
        self._filled = frozenset(filled)
        self._readings: dict[tuple[int, tuple[int, ...]], Reader] = {}
        self._carried_readings: dict[int, Reader | None] = {}
        self.carried = tuple(i for i, c in enumerate(columns) if c not in filled)

    def prepare(self, raws: Iterable[bytes]) -> set[str]:
        """See `SchemaCache.prepare`."""
        return self._schemas.prepare(raws)

    def decode(self, raw: bytes) -> Row:
        writer = schema_id(raw)
        if writer is None:
            raise unframed(raw)
        schema = self._schema(writer)
        limit = self._schemas.max_decoded_bytes
        if len(raw) * _EXPANSION > limit:
            raise RecordError(f"value of {len(raw)} bytes may decode to more than the "
                              f"{limit} bytes a record may (max_decoded_record_bytes)")  # fmt: skip
        try:
            if len(raw) > HEADER and raw[HEADER] == 0:  # [0], the first message: most values
                indexes, body = _FIRST, HEADER + 1
            else:
                indexes, body = read_indexes(raw, HEADER)
            reading = self._readings.get((writer, indexes)) or self._reading(
                writer, schema, indexes
            )
            row = reading.read(schema.parse(raw[body:], indexes))
        except ProtoError as exc:
            raise RecordError(f"value does not decode by schema id {writer}: {exc}") from None
        return row if reading.plain else self._cells(row, self._columns)

    def decode_all(self, raws: Iterable[bytes]) -> list[Row] | None:
        """Every value as a row, None when any is not one (`decode` then tells which). Values
        that all start alike (one schema id, the first message), as a batch's mostly do, are
        checked once and read in C loops (in one call by `_proto_body.c` when every column is
        a plain scalar field or absent); others one by one."""
        values = raws if isinstance(raws, list) else list(raws)
        writer = self._one_writer(values)
        if writer is None:
            return self._one_by_one(values)
        try:
            schema = self._schema(writer)
        except RecordError:
            return None
        reading = self._readings.get((writer, _FIRST)) or self._reading(writer, schema, _FIRST)
        return self._read(values, schema, reading, self._columns)

    def decode_carried(self, raws: Iterable[bytes]) -> list[Row] | None:
        """As `RowDecoder.decode_carried`: rows of the carried columns only, when the values
        share a writer schema and message that have a field for every tracked carried column
        and none for a column the table fills; else None."""
        values = raws if isinstance(raws, list) else list(raws)
        writer = self._one_writer(values)
        if writer is None:
            return None
        if writer not in self._carried_readings:
            try:
                schema = self._schema(writer)
            except RecordError:
                return None
            fields = set(schema.message(_FIRST).fields_by_name)
            carried = [self._columns[i] for i in self.carried]
            fits = not fields & self._filled and self._tracked.intersection(carried) <= fields
            absent = [self._absent[i] for i in self.carried]
            self._carried_readings[writer] = (
                schema.reader(_FIRST, carried, absent) if fits else None
            )
        reading = self._carried_readings[writer]
        if reading is None:
            return None
        carried_columns = tuple(self._columns[i] for i in self.carried)
        return self._read(values, self._schema(writer), reading, carried_columns)

    def _one_writer(self, values: list[bytes]) -> int | None:
        """The schema id every value names with the first message ([0], the short form), in
        C loops; None when they name none, several, or other messages."""
        head = values[0][: HEADER + 1] if values else b""
        writer = schema_id(head)
        if writer is None or len(head) <= HEADER or head[HEADER] != 0:
            return None
        return writer if all(map(bytes.startswith, values, repeat(head))) else None

    def _read(
        self, values: list[bytes], schema: ProtoSchema, reading: Reader, columns: tuple[str, ...]
    ) -> list[Row] | None:
        """The bodies after one shared header as rows of `columns`; None when one does not
        parse or may decode past the bound (`decode` then names it)."""
        if max(map(len, values)) * _EXPANSION > self._schemas.max_decoded_bytes:
            return None
        if reading.program is not None:  # plain scalars: the whole batch in one C call
            rows = _proto_body.decode_rows(values, HEADER + 1, *reading.program)
            if rows is not None:
                return rows  # else something it declines: the runtime reads every value
        bodies = map(itemgetter(slice(HEADER + 1, None)), values)
        try:
            rows = list(map(reading.read, map(schema.parse, bodies)))
        except ProtoError:
            return None
        if reading.plain:
            return rows
        return [self._cells(row, columns) for row in rows]

    def _one_by_one(self, values: list[bytes]) -> list[Row] | None:
        try:
            return list(map(self.decode, values))
        except RecordError:
            return None

    def _schema(self, writer: int) -> ProtoSchema:
        schema = self._schemas.of_kind(writer, PROTOBUF)
        assert isinstance(schema, ProtoSchema)  # noqa: S101 - what the cache keeps of PROTOBUF
        return schema

    def _reading(self, writer: int, schema: ProtoSchema, indexes: tuple[int, ...]) -> Reader:
        reading = schema.reader(indexes, self._columns, self._absent)
        self._readings[writer, indexes] = reading
        return reading

    def _cells(self, values: tuple[Any, ...], columns: tuple[str, ...]) -> Row:
        """Lists to arrays (array columns) or JSON text, objects to JSON text."""
        return tuple(map(self._cell, columns, values))

    def _cell(self, column: str, value: Any) -> Any:
        if isinstance(value, JsonDocument):
            return json_text(value.value)
        if isinstance(value, list):
            return ArrayValue(value) if column in self._arrays else json_text(value)
        if isinstance(value, dict):
            return json_text(value)
        return value
