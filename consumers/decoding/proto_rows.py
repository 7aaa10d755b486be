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
from typing import Any

from consumers.decoding.proto_schemas import ProtoError, ProtoSchema, read_indexes
from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import HEADER, PROTOBUF, SchemaCache, schema_id, unframed
from consumers.decoding.rows import UNSET, ArrayValue, Row, json_text

# A body's values take at most this many times its bytes in memory (a packed repeated field's
# one-byte elements as Python ints, with their list): the decoded size bound, checked up front.
_EXPANSION = 40


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
            indexes, body = read_indexes(raw, HEADER)
            values = schema.values(raw[body:], indexes)
        except ProtoError as exc:
            raise RecordError(f"value does not decode by schema id {writer}: {exc}") from None
        return tuple(
            self._cell(column, values[column]) if column in values else absent
            for column, absent in zip(self._columns, self._absent, strict=True)
        )

    def decode_all(self, raws: Iterable[bytes]) -> list[Row] | None:
        """Every value as a row, None when any is not one (`decode` then tells which)."""
        try:
            return list(map(self.decode, raws))
        except RecordError:
            return None

    def decode_carried(self, raws: Iterable[bytes]) -> list[Row] | None:
        """None: the batch's rows are made of every column (`decode_all`); the carried-only
        shortcut is the Avro and JSON readers'."""
        return None

    def _schema(self, writer: int) -> ProtoSchema:
        schema = self._schemas.of_kind(writer, PROTOBUF)
        assert isinstance(schema, ProtoSchema)  # noqa: S101 - what the cache keeps of PROTOBUF
        return schema

    def _cell(self, column: str, value: Any) -> Any:
        if isinstance(value, list):
            return ArrayValue(value) if column in self._arrays else json_text(value)
        if isinstance(value, dict):
            return json_text(value)
        return value
