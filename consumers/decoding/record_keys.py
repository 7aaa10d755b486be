"""A record's key read as key columns: JSON or text as it is, or framed by the schema registry
(Avro, JSON Schema, Protobuf) and decoded by its writer schema.

Keys are read one record at a time (a route's tombstones, and `key_source: record_key`): a key
is a handful of bytes, and fastavro's reader serves; the C reader is for values."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import fastavro

from bridge.settings import RouteSettings
from consumers.decoding.proto_schemas import ProtoError, read_indexes
from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import (
    AVRO,
    HEADER,
    JSON,
    PROTOBUF,
    SchemaCache,
    schema_id,
)
from consumers.decoding.rows import decode_key, key_columns_of

_KINDS = {"avro": AVRO, "json-schema": JSON, "protobuf": PROTOBUF}  # key_format's registry type


class KeyReader:
    """The key columns of records' keys, by the route's `key_format`."""

    def __init__(self, route: RouteSettings, *, schemas: SchemaCache | None) -> None:
        self._columns = route.key_columns
        self._format = route.key_format
        if self.framed and schemas is None:
            raise ValueError(f"a {self._format} key needs the schema registry")
        self._schemas = schemas

    @property
    def framed(self) -> bool:
        return self._format not in ("json", "string")

    def prepare(self, keys: Iterable[bytes]) -> None:
        """Fetch the writer schemas framed keys name (RegistryUnavailable when the registry
        cannot answer), so that reading them inside a transaction waits on nothing."""
        if self._schemas is not None and self.framed:
            self._schemas.prepare(keys)

    def read(self, raw: bytes | None) -> tuple[Any, ...]:
        """The key columns of `raw`, or a RecordError naming why it has none."""
        if self._format == "string":  # Kafka Connect's StringConverter: the text as it is
            if raw is None:
                raise RecordError("the record has no key")
            try:
                return (raw.decode("utf-8"),)
            except UnicodeDecodeError as exc:
                where = f"{exc.reason} at byte {exc.start}"
                raise RecordError(f"key is not UTF-8 text: {where}") from None
        if not self.framed:
            return decode_key(raw, self._columns)
        assert self._schemas is not None  # noqa: S101 - checked in the constructor
        if raw is None:
            raise RecordError("the record has no key")
        writer = schema_id(raw)
        if writer is None:
            first = f"0x{raw[0]:02x}" if raw else "nothing"
            raise RecordError(
                f"key is not in the schema registry's wire format (starts with {first})"
            )
        if writer in self._schemas.missing:
            raise RecordError(f"key: {self._schemas.missing[writer]}")
        schema = self._schemas.schemas.get(writer)
        if schema is None:  # `prepare` was not called for it: a bug, not the record's
            raise KeyError(f"key schema id {writer} was not fetched before decoding")
        kind = self._schemas.types[writer]
        if kind != _KINDS[self._format]:
            raise RecordError(f"key: schema id {writer} is {kind}, the route reads {self._format}")
        body = raw[HEADER:]
        if kind == JSON:
            return decode_key(body, self._columns)
        if kind == PROTOBUF:
            try:
                indexes, at = read_indexes(raw, HEADER)
                return key_columns_of(schema.values(raw[at:], indexes), self._columns)
            except ProtoError as exc:
                raise RecordError(f"key does not decode by schema id {writer}: {exc}") from None
        try:
            reader = io.BytesIO(body)
            parsed = fastavro.schemaless_reader(reader, schema, None)
            if reader.tell() != len(body):
                raise ValueError(f"{len(body) - reader.tell()} bytes left over")
        except (ValueError, EOFError, IndexError) as exc:
            raise RecordError(f"key does not decode by schema id {writer}: {exc}") from None
        return key_columns_of(parsed, self._columns)
