"""Writer schemas (Avro, JSON Schema, Protobuf) by id, from the schema registry, each fetched
once (a Protobuf one with its references, and compiled: `consumers.decoding.proto_schemas`).

A registry-framed value is a magic byte (0), its schema's id (4 bytes, big-endian) and the body.
The ids a batch needs are fetched before the batch is planned (`fetch`), so that decoding never
waits on the network. What the registry answers decides what a failure is:

- the id does not exist (HTTP 404 with the API's error code 40403): a record fault, and the
  record is dead-lettered naming the id (`missing`);
- the registry cannot be reached, times out, or answers anything else (5xx, 429, an
  authentication refusal, a 404 of a URL that is not the API's): an infrastructure fault,
  `RegistryUnavailable`. The batch waits and is tried again; nothing is dead-lettered for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import fastavro
from fastavro.schema import SchemaParseException
from google.protobuf.descriptor import Descriptor

from bridge.errors import BridgeError
from bridge.settings import SchemaRegistrySettings
from consumers.backoff import HoldBackoff
from consumers.decoding.avro_program import check as check_avro
from consumers.decoding.debezium_time import with_debezium_time_types
from consumers.decoding.proto_schemas import (
    MAX_REFERENCES,
    ProtoError,
    ProtoSchema,
    compile_schema,
    read_indexes,
)
from consumers.decoding.records import RecordError

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import Schema

log = logging.getLogger("bridge.consumer")

MAGIC = 0
HEADER = 5  # the magic byte and the schema id
_head = itemgetter(slice(0, HEADER))  # a value's header
_SCHEMA_NOT_FOUND = 40403  # the Confluent-compatible API's error code (HTTP 404 with it)
_VERSION_NOT_FOUND = (40401, 40402)  # a reference's subject, or its version, not there
AVRO, JSON, PROTOBUF = "AVRO", "JSON", "PROTOBUF"  # the registry's schema types bridge reads
_NAMES = {AVRO: "Avro", JSON: "JSON Schema", PROTOBUF: "Protobuf"}
# One request at a time, each bounded; the batch's own backoff retries, not the client.
_CLIENT_TIMEOUT_S = 10
MAX_SCHEMA_CHARS = 1024**2  # a writer schema's text; a real one is a few kilobytes


class RegistryUnavailable(BridgeError):
    """The registry could not answer for a schema id; the batch waits, nothing is dead-lettered."""


def schema_id(raw: bytes) -> int | None:
    """The schema id a registry-framed value names, or None when it is not framed."""
    if len(raw) < HEADER or raw[0] != MAGIC:
        return None
    return int.from_bytes(raw[1:HEADER], "big")


def unframed(raw: bytes) -> RecordError:
    """The error of a value that is not in the wire format, naming how it starts."""
    first = f"0x{raw[0]:02x}" if raw else "nothing"
    return RecordError(
        f"value is not in the schema registry's wire format (starts with {first}, not the "
        "magic byte 0x00 and a schema id)"
    )


class SchemaCache:
    """Parsed writer schemas by id; `missing` holds, with why, the ids no record can be
    decoded by (the registry does not know them, they are of a kind bridge does not read, or
    they cannot be parsed)."""

    def __init__(
        self, settings: SchemaRegistrySettings, *, max_decoded_bytes: int = 64 * 1024**2
    ) -> None:
        """`max_decoded_bytes`: what one record read by these schemas may decode to."""
        self.max_decoded_bytes = max_decoded_bytes
        config: dict[str, Any] = {
            "timeout": _CLIENT_TIMEOUT_S,
            "max.retries": 0,
            **settings.client_config(),
        }
        # Imported here, where a registry is configured: the client and its HTTP stack were a
        # fifth of the import time of every consumer's start, with a registry or without.
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self._client = SchemaRegistryClient(config)
        self.url = settings.url
        # Avro ones parsed by fastavro, JSON ones as read, Protobuf ones compiled (ProtoSchema).
        self.schemas: dict[int, Any] = {}
        self.types: dict[int, str] = {}  # AVRO, JSON or PROTOBUF
        self.missing: dict[int, str] = {}
        self._unavailable_since: float | None = None

    def fetch(self, ids: Iterable[int]) -> None:
        """Fetch every id not known yet; raises RegistryUnavailable when the registry cannot
        answer for one of them."""
        for wanted in set(ids) - self.schemas.keys() - self.missing.keys():
            self._fetch(wanted)
        if self._unavailable_since is not None:
            log.info(
                "the schema registry answers again after %.0fs",
                time.monotonic() - self._unavailable_since,
            )
            self._unavailable_since = None

    def prepare(self, raws: Iterable[bytes]) -> set[str]:
        """Fetch the schemas the framed values among `raws` name (RegistryUnavailable when the
        registry cannot answer), so that decoding them waits on nothing. Returns their
        top-level fields: an Avro record's fields, a JSON Schema's properties, the fields of the
        Protobuf messages the values' indexes name."""
        values = raws if isinstance(raws, list) else list(raws)
        # A batch's values share a few headers: one C pass takes them apart, not a step each.
        headers: set[bytes] = set(map(_head, values))
        self.fetch(i for i in map(schema_id, headers) if i is not None)
        return set().union(*self.shapes(values, headers))

    def shapes(self, values: list[bytes], headers: set[bytes] | None = None) -> set[frozenset[str]]:
        """The top-level fields of each kind of value among `values` (their schemas fetched):
        an Avro record's fields, a JSON Schema's properties, a Protobuf message's fields (a
        value's indexes name its message). A value of no known schema has none here: its
        decoding says what is wrong with it."""
        found: set[frozenset[str]] = set()
        for writer in {
            i for i in map(schema_id, headers or set(map(_head, values))) if i is not None
        }:
            schema = self.schemas.get(writer)
            if isinstance(schema, ProtoSchema):
                for message in _messages(schema, writer, values):
                    found.add(frozenset(f.name for f in message.fields))
                continue
            if not isinstance(schema, dict):
                continue
            if self.types[writer] == AVRO and schema.get("type") == "record":
                found.add(frozenset(str(f["name"]) for f in schema["fields"]))
            elif self.types[writer] == JSON:
                found.add(frozenset(str(name) for name in schema.get("properties", {})))
        return found

    def _fetch(self, wanted: int) -> None:
        from confluent_kafka.schema_registry.error import SchemaRegistryError  # see __init__

        try:
            schema = self._client.get_schema(wanted)
        except SchemaRegistryError as exc:
            # Only the API's own "schema not found" is the record's; any other answer, a 404 of
            # a URL that is not the API's among them, is the registry's or the settings'.
            if exc.error_code == _SCHEMA_NOT_FOUND:
                self._missing(wanted, f"schema id {wanted} is not in the registry")
                return
            self._unavailable(f"the registry at {self.url} answered {exc}")
        # Anything else the client raises (its transport's errors: unreachable, timed out, TLS
        # refused) is the registry's or the network's, never the record's.
        except Exception as exc:  # noqa: BLE001
            self._unavailable(f"the registry at {self.url} is unreachable ({exc!r})")
        kind = schema.schema_type or AVRO
        if kind not in (AVRO, JSON, PROTOBUF):
            self._missing(wanted, f"schema id {wanted} is {kind}, which bridge does not read")
            return
        if kind == PROTOBUF:
            self._protobuf(wanted, schema)
            return
        text = schema.schema_str or "null"
        if len(text) > MAX_SCHEMA_CHARS:
            self._missing(wanted, f"schema id {wanted} is {len(text)} characters long, more "
                          f"than the {MAX_SCHEMA_CHARS} bridge reads")  # fmt: skip
            return
        try:
            document = json.loads(text)
            if kind == AVRO:
                document = with_debezium_time_types(document)
            parsed = fastavro.parse_schema(document) if kind == AVRO else document
            if kind == AVRO:
                check_avro(parsed)  # the numbers fastavro lets through
        except (ValueError, TypeError, KeyError, RecursionError, SchemaParseException) as exc:
            # Such as an Avro schema that names types of another subject (schema references,
            # which are not followed here), or one nested past what JSON is read to: no record
            # of it can be read.
            why = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
            self._missing(wanted, f"schema id {wanted} cannot be read: {why}")
            return
        self.types[wanted] = kind
        self.schemas[wanted] = parsed

    def of_kind(self, writer: int, kind: str) -> Any:
        """Schema `writer` as fetched, for a route whose values must be of `kind` (AVRO or
        PROTOBUF): RecordError when no record can be read by it (missing, or of another kind),
        KeyError when it was not fetched (`prepare` comes first: a bug, not the record's)."""
        if writer in self.missing:
            raise RecordError(self.missing[writer])
        schema = self.schemas.get(writer)
        if schema is None:
            raise KeyError(f"schema id {writer} was not fetched before decoding")
        if self.types.get(writer) != kind:
            named = _NAMES[kind]
            raise RecordError(
                f"schema id {writer} is a {self.types[writer]} schema, not {named}: the "
                f"route's value_format says {named.lower()}"
            )
        return schema

    def _protobuf(self, wanted: int, schema: Schema) -> None:
        """A Protobuf schema, its references fetched (theirs too) and compiled
        (`consumers.decoding.proto_schemas`); one that does not compile is missing."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError  # see __init__

        references: dict[str, str] = {}
        pending = list(schema.references or [])
        while pending:
            reference = pending.pop()
            name = str(reference.name)
            if name in references:
                continue
            if len(references) >= MAX_REFERENCES:
                self._missing(wanted, f"schema id {wanted} has more than {MAX_REFERENCES} "
                              "references")  # fmt: skip
                return
            try:
                subject = str(reference.subject)
                found = (
                    self._client.get_version(subject, "latest")
                    if reference.version is None
                    else self._client.get_version(subject, reference.version)
                )
            except SchemaRegistryError as exc:
                if exc.http_status_code == 404 and exc.error_code in _VERSION_NOT_FOUND:
                    self._missing(wanted, f"schema id {wanted}: its reference {name} "
                                  f"({reference.subject} v{reference.version}) is not in the "
                                  "registry")  # fmt: skip
                    return
                self._unavailable(f"the registry at {self.url} answered {exc}")
            except Exception as exc:  # noqa: BLE001 - the transport's, as in `_fetch`
                self._unavailable(f"the registry at {self.url} is unreachable ({exc!r})")
            references[name] = found.schema.schema_str or ""
            pending += found.schema.references or []
        try:
            compiled = ProtoSchema(compile_schema(schema.schema_str or "", references))
        except ProtoError as exc:
            self._missing(wanted, f"schema id {wanted} cannot be read: {exc}")
            return
        self.types[wanted] = PROTOBUF
        self.schemas[wanted] = compiled

    def _missing(self, wanted: int, why: str) -> None:
        log.warning("%s (registry %s): its records are dead-lettered", why, self.url)
        self.missing[wanted] = why

    def _unavailable(self, why: str) -> None:
        if self._unavailable_since is None:
            self._unavailable_since = time.monotonic()
        raise RegistryUnavailable(why)

    def answers(self) -> None:
        """Ask the registry for its subjects: RegistryUnavailable when it cannot answer."""
        try:
            self._client.get_subjects()
        except Exception as exc:  # noqa: BLE001 - the client's transport errors, and its own
            raise RegistryUnavailable(
                f"the registry at {self.url} does not answer: {exc}"
            ) from None

    def close(self) -> None:
        self._client.close()


def _messages(schema: ProtoSchema, writer: int, values: list[bytes]) -> list[Descriptor]:
    """The messages of `schema` that the values of `writer` are, by their indexes: read from
    one value of each distinct start (the header, the count of indexes, then as many bytes:
    each index's one byte, below 64), for a batch's values share a few; an index path the
    schema lacks is left to the value's decoding, which names it."""
    head = bytes([MAGIC]) + writer.to_bytes(4, "big")
    starts: dict[bytes, bytes] = {}
    for framed in {v[: HEADER + 1] for v in values if v.startswith(head)}:
        count = framed[HEADER] >> 1 if len(framed) > HEADER and framed[HEADER] < 0x80 else 0
        for value in values:
            if value.startswith(framed):
                starts.setdefault(value[: HEADER + 1 + count], value)
                if count == 0:
                    break
    paths: set[tuple[int, ...]] = set()
    for value in starts.values():
        with contextlib.suppress(ProtoError):
            paths.add(read_indexes(value, HEADER)[0])
    found = []
    for path in sorted(paths):
        with contextlib.suppress(ProtoError):
            found.append(schema.message(path))
    return found


def registry_backoff() -> HoldBackoff:
    return HoldBackoff(
        what="schema registry unavailable",
        consequence="the batch waits for its schemas, nothing is dead-lettered",
    )  # `SchemaCache.fetch` logs its coming back
