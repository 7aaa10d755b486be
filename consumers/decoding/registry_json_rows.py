"""Registry-framed JSON values (a JSON Schema's id, then the JSON text) to table rows.

The body is JSON like any other route's and is decoded the same way, in C
(`consumers.decoding.rows`); what the frame adds is checked first: the magic byte, and a schema id
the registry knows as a JSON Schema. The values are not validated against that schema here: the
producer's serializer did so, and the table's types decide what lands (a value a column cannot hold
is a dead letter, as on a JSON route).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from itertools import repeat
from operator import getitem

from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import HEADER, JSON, SchemaCache, schema_id, unframed
from consumers.decoding.rows import Row, RowDecoder

_BODY = slice(HEADER, None)


class RegistryJsonRowDecoder:
    """The same calls as `consumers.decoding.rows.RowDecoder`, for registry-framed JSON values."""

    def __init__(
        self,
        columns: Sequence[str],
        *,
        schemas: SchemaCache,
        tracked: Collection[str] = (),
        filled: Collection[str] = (),
        others: Collection[str] | None = None,
    ) -> None:
        self._json = RowDecoder(columns, tracked=tracked, filled=filled, others=others)
        self._schemas = schemas
        self.carried = self._json.carried

    def prepare(self, raws: Iterable[bytes]) -> set[str]:
        """See `SchemaCache.prepare`."""
        return self._schemas.prepare(raws)

    def decode(self, raw: bytes) -> Row:
        self._check(raw)
        return self._json.decode(raw[HEADER:])

    def decode_all(self, raws: Iterable[bytes]) -> list[Row] | None:
        bodies = self._bodies(raws)
        return None if bodies is None else self._json.decode_all(bodies)

    def bodies(self, raws: Iterable[bytes]) -> list[bytes] | None:
        """The JSON bodies, when every value is framed by one good JSON Schema id."""
        return self._bodies(raws)

    def decode_all_leaving_out(self, raws: Iterable[bytes]) -> list[Row] | None:
        bodies = self._bodies(raws)
        return None if bodies is None else self._json.decode_all_leaving_out(bodies)

    def decode_carried(self, raws: Iterable[bytes]) -> list[Row] | None:
        bodies = self._bodies(raws)
        return None if bodies is None else self._json.decode_carried(bodies)

    def _bodies(self, raws: Iterable[bytes]) -> list[bytes] | None:
        """The bodies, when every value is framed by one good JSON Schema id (checked in C
        loops); None otherwise, for `decode` to tell which value and why."""
        values = raws if isinstance(raws, list) else list(raws)
        if not values:
            return []
        header = values[0][:HEADER]
        if not all(map(bytes.startswith, values, repeat(header))):
            return None
        try:
            self._check(header)
        except RecordError:
            return None
        return list(map(getitem, values, repeat(_BODY)))

    def _check(self, raw: bytes) -> None:
        writer = schema_id(raw)
        if writer is None:
            raise unframed(raw)
        if writer in self._schemas.missing:
            raise RecordError(self._schemas.missing[writer])
        kind = self._schemas.types.get(writer)
        if kind is None:  # `prepare` was not called for it: a bug, not the record's
            raise KeyError(f"schema id {writer} was not fetched before decoding")
        if kind != JSON:
            raise RecordError(
                f"schema id {writer} is a {kind} schema, not JSON Schema: the route's "
                "value_format says json-schema"
            )
