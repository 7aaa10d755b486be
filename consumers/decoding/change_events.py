"""Debezium change events unwrapped on the consumer side, as Debezium's ExtractNewRecordState
SMT unwraps them on a connector (`unwrap: debezium` on a route).

An event is a JSON object `{"before", "after", "source", "op", "ts_ms", ...}`. A create, a
snapshot read or an update (`op` c, r, u) becomes its `after` image, with the event's fields the
route asks for added as columns named as the SMT's `add.fields` names them (`op` -> `__op`,
`source.ts_ms` -> `__source_ts_ms`); a delete (`d`) becomes a tombstone, which deletes by the
record's key. A value that is no change event (no `op`, or not a JSON object) is left as it is,
as the SMT leaves such records: the route reads it, and says what is wrong with it. An event
that cannot be unwrapped (a truncate, a message, a create without `after`) is a RecordError
naming why, which its route dead-letters or stops at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import msgspec

from consumers.decoding.records import RecordError

# A value a route reads (bytes), a delete (None), or why it is no row.
Unwrapped = bytes | None | RecordError

_decode = msgspec.json.Decoder(float_hook=Decimal).decode  # numbers kept exact, as rows keep them
_encode = msgspec.json.Encoder(decimal_format="number").encode
_WRITES = frozenset({"c", "r", "u"})


def debezium_unwrapper(fields: Sequence[str]) -> Callable[[bytes | None], Unwrapped]:
    """The unwrapping of one value, adding the event's `fields` (`op`, `source.ts_ms`, ...)."""
    added = [(f"__{name.replace('.', '_')}", name.split(".")) for name in fields]

    def unwrap(raw: bytes | None) -> Unwrapped:
        if raw is None:
            return None  # Debezium's own tombstone after a delete: a delete again
        try:
            event: Any = _decode(raw)
        except msgspec.DecodeError:
            return raw  # not JSON: its route's decoding names it
        if not isinstance(event, dict) or not isinstance(event.get("op"), str):
            return raw  # no change event: read as it is
        op = event["op"]
        if op == "d":
            return None
        if op not in _WRITES:
            return RecordError(
                f"a Debezium change event with op {op[:20]!r}: only c, r, u (written) and d "
                "(deleted by the record's key) have a row to write"
            )
        after = event.get("after")
        if not isinstance(after, dict):
            return RecordError(f"a Debezium change event with op {op!r} and no after image")
        for column, path in added:
            after[column] = _field(event, path)
        return _encode(after)

    return unwrap


def _field(event: dict[str, Any], path: list[str]) -> Any:
    """The event's field at `path` (`["source", "ts_ms"]`); None where it has none."""
    found: Any = event
    for name in path:
        found = found.get(name) if isinstance(found, dict) else None
    return found
