"""Protobuf writer schemas compiled at run time from the `.proto` text the registry serves, and
registry-framed Protobuf values read by them, with no generated code.

A Confluent-framed Protobuf value is the magic byte, the schema id (4 bytes), the **message
indexes**, then the body. The indexes say which message of the schema the body is, nested ones
by their path: a zigzag varint count, then each index as a zigzag varint; a lone 0 (a count of
none) stands for [0], the schema's first message, as Confluent's serializers write it.

**Compiling** (`compile_schema`, the foundations' `bridge.protobuf_compiler`, which the sink
uses too): the schema's text and its references' (by the name its `import` gives) go to protoc,
the reference compiler (`grpcio-tools`), in a process of its own, bounded in time and memory: a
hostile schema can fail its own compilation and nothing else. A well-known import
(`google/protobuf/timestamp.proto` and the others) that no reference names is protoc's own
copy, as Confluent's registry treats them as built in. The FileDescriptorSet it writes is
loaded into a pool of the schema's own, and its messages become classes (`message_factory`)
that the protobuf runtime parses in C. Checked by hand against Apicurio 2.6.13
(docs/typed-records.md): it serves the text as registered, with the references it was
registered with, and ignores `?format=serialized`, so the text is what there is to compile.

**Reading** (`ProtoSchema.values`): a body becomes a dict of its fields, by name:

- integers of every kind as int, over their full ranges (uint64 to 2**64-1, sint*, fixed*);
  float and double as float; bool; string as str; bytes as bytes;
- an enum as its value's name; a number the schema does not name (proto3 enums are open) as
  that number, in text;
- `repeated` as a list; a map as a dict (keys as text, JSON's only kind); a nested message as a
  dict of its own;
- `google.protobuf.Timestamp` as an aware datetime (UTC, microseconds: PostgreSQL's precision,
  nanoseconds below them dropped), `Duration` as a timedelta (likewise), the wrappers
  (`Int64Value`, `StringValue`, ...) as their value, `Struct`/`Value`/`ListValue` as the JSON
  they stand for;
- **presence**: a field that has it (proto3 `optional`, a message, a oneof's member, proto2's
  optional) and is absent is None; a proto3 scalar without it that is absent is its default
  (0, "", false, empty bytes, the enum's first name), since the body cannot tell "absent" from
  "default" for it. So a column fed by a plain proto3 scalar is never NULL.

Every failure is a `ProtoError` naming what and where: a schema that does not compile, that
nests messages or values deeper than `MAX_DEPTH`, an index path the schema has no message for, a
body protobuf will not parse. Nothing else escapes (the fuzz test holds it to that).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from operator import attrgetter, itemgetter
from typing import Any, Final, NamedTuple, cast

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError, Message

# The compiler is the foundations' (the sink compiles its schemas too); its names are this
# module's as well, for the reader's one error is the compiler's.
from bridge.protobuf_compiler import MAIN_FILE, MAX_REFERENCES, MAX_SCHEMA_CHARS, ProtoError
from bridge.protobuf_compiler import compile_schema as compile_schema

__all__ = ["MAX_REFERENCES", "MAX_SCHEMA_CHARS", "MISSING", "JsonDocument", "ProtoError",
           "ProtoSchema", "Reader", "compile_schema", "read_indexes"]  # fmt: skip

MAX_DEPTH = 64  # nested messages, in the schema and in a body's values
MAX_INDEXES = MAX_DEPTH  # a message's path among the schema's nested messages
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WELL_KNOWN = "google.protobuf."
_WRAPPERS = {
    f"{_WELL_KNOWN}{name}"
    for name in ("DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value",
                 "UInt32Value", "BoolValue", "StringValue", "BytesValue")
}  # fmt: skip


MISSING: Final = object()  # `ProtoSchema.reader`'s value of a column the message has no field for


class JsonDocument(NamedTuple):
    """`ProtoSchema.reader`'s value of a `google.protobuf.Value` field that is set: JSON of any
    kind (a string, a number, a bool, null as well as an object or a list), which its column
    takes as JSON text, not as a value of that kind."""

    value: Any


Program = tuple[tuple[tuple[int, int, int] | None, ...], tuple[Any, ...]]


class Reader(NamedTuple):
    """`ProtoSchema.reader`'s: `read` a parsed message's values; `plain` when every one is a
    scalar as it is or an absent value (no list or object among them); `program`, when every
    column is a plain scalar field or absent, what `consumers.decoding._proto_body` reads a
    body by without the runtime: slots by field number, each (kind, column, repeated), column
    -1 for a field it only checks as the runtime would parse it, and the row's template (the
    fields' defaults, the absent columns' values)."""

    read: Callable[[Message], tuple[Any, ...]]
    plain: bool
    program: Program | None = None


# The field types `_proto_body.c` reads, by its numbers for them (keep the two in step).
_KINDS = {
    FieldDescriptor.TYPE_INT32: 1, FieldDescriptor.TYPE_INT64: 2, FieldDescriptor.TYPE_UINT32: 3,
    FieldDescriptor.TYPE_UINT64: 4, FieldDescriptor.TYPE_SINT32: 5, FieldDescriptor.TYPE_SINT64: 6,
    FieldDescriptor.TYPE_BOOL: 7, FieldDescriptor.TYPE_FIXED32: 8,
    FieldDescriptor.TYPE_SFIXED32: 9, FieldDescriptor.TYPE_FLOAT: 10,
    FieldDescriptor.TYPE_FIXED64: 11, FieldDescriptor.TYPE_SFIXED64: 12,
    FieldDescriptor.TYPE_DOUBLE: 13, FieldDescriptor.TYPE_STRING: 14,
    FieldDescriptor.TYPE_BYTES: 15, FieldDescriptor.TYPE_ENUM: 16,
    FieldDescriptor.TYPE_MESSAGE: 17, FieldDescriptor.TYPE_GROUP: 17,
}  # fmt: skip
# A program's slots are a tuple indexed by field number: a schema numbering its fields past
# this is read by the runtime alone.
_MAX_PROGRAM_FIELD = 4096


def read_indexes(raw: bytes, start: int) -> tuple[tuple[int, ...], int]:
    """The message indexes that follow the schema id at `start`, and where the body begins."""
    count, at = _zigzag(raw, start)
    if count == 0:
        return (0,), at
    if not 0 < count <= MAX_INDEXES:
        raise ProtoError(f"message indexes: a count of {count}, not 1 to {MAX_INDEXES}")
    indexes = []
    for _ in range(count):
        index, at = _zigzag(raw, at)
        if index < 0:
            raise ProtoError(f"message indexes: {index} is negative")
        indexes.append(index)
    return tuple(indexes), at


def _zigzag(raw: bytes, at: int) -> tuple[int, int]:
    """A zigzag varint of at most 64 bits at `at`, and the offset after it."""
    value = shift = 0
    while True:
        if at >= len(raw):
            raise ProtoError("message indexes: the value ends inside them")
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7
        if shift >= 64:
            raise ProtoError("message indexes: a varint longer than 10 bytes")


class ProtoSchema:
    """One registry schema, compiled: its messages by index path, each read into a dict."""

    def __init__(self, descriptor_set: bytes) -> None:
        try:
            files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file
            pool = descriptor_pool.DescriptorPool()
            for file in files:
                pool.Add(file)
            main = pool.FindFileByName(MAIN_FILE)
        except (DecodeError, TypeError, KeyError, ValueError) as exc:  # as the backends say it
            raise ProtoError(f"schema: its descriptors do not load: {exc}") from None
        self._top = tuple(main.message_types_by_name.values())
        if not self._top:
            raise ProtoError("schema: it defines no message")
        for message in self._top:
            _check_depth(message, 1, set())
        self._classes: dict[tuple[int, ...], type[Message]] = {}

    def message(self, indexes: tuple[int, ...]) -> Descriptor:
        """The message at `indexes`: the schema's n-th top-level message, then nested ones."""
        found: Descriptor | None = None
        level: tuple[Descriptor, ...] = self._top
        for depth, index in enumerate(indexes):
            if index >= len(level):
                where = "the schema" if depth == 0 else f"message {found.full_name}"  # type: ignore[union-attr]
                raise ProtoError(f"message indexes {list(indexes)}: {where} has no message "
                                 f"{index} (it has {len(level)})")  # fmt: skip
            found = level[index]
            level = tuple(found.nested_types)
        assert found is not None  # noqa: S101 - indexes are never empty
        return found

    def values(self, body: bytes, indexes: tuple[int, ...] = (0,)) -> dict[str, Any]:
        """The body as the message at `indexes`, its fields by name (see the module's rules)."""
        return _message(self.parse(body, indexes), 0)

    def parse(self, body: bytes, indexes: tuple[int, ...] = (0,)) -> Message:
        """The body as the message at `indexes`, parsed by the protobuf runtime (in C)."""
        kind = self._classes.get(indexes)
        if kind is None:
            kind = self._classes[indexes] = message_factory.GetMessageClass(self.message(indexes))
        try:
            return kind.FromString(body)
        except (DecodeError, RecursionError, ValueError) as exc:
            name = kind.DESCRIPTOR.full_name
            raise ProtoError(f"body does not parse as {name}: {exc or 'truncated'}") from None

    def reader(
        self,
        indexes: tuple[int, ...],
        columns: Sequence[str],
        absent: Sequence[Any] | None = None,
    ) -> Reader:
        """How a parsed message (`parse`) gives the values of its fields named by `columns`,
        in order, by the module's rules; where the message has no such field, that column's
        `absent` value (MISSING by default). The fields that need no rule (scalars without
        presence, not enums: most of a message) are read together in one C call; with only
        those and absent columns, a row is two C calls."""
        fields = self.message(indexes).fields_by_name
        absent = tuple(absent) if absent is not None else (MISSING,) * len(columns)
        plain = [
            c for c in columns
            if c in fields and fields[c].message_type is None and fields[c].enum_type is None
            and not fields[c].is_repeated and not fields[c].has_presence
        ]  # fmt: skip
        if not plain:
            read_plain: Callable[[Message], tuple[Any, ...]] = lambda _: ()  # noqa: E731
        elif len(plain) == 1:
            one = attrgetter(plain[0])
            read_plain = lambda message: (one(message),)  # noqa: E731
        else:
            read_plain = attrgetter(*plain)
        if len(plain) == len(columns):
            program = _program(self.message(indexes), columns, absent)
            return Reader(read_plain, plain=True, program=program)
        where = {c: i for i, c in enumerate(plain)}
        if all(c in where or c not in fields for c in columns):
            # Absent columns after the plain values, then each column picked in its place.
            missing = tuple(a for c, a in zip(columns, absent, strict=True) if c not in fields)
            at_missing = iter(range(len(plain), len(plain) + len(missing)))
            order = [where[c] if c in where else next(at_missing) for c in columns]
            program = _program(self.message(indexes), columns, absent)
            if len(order) == 1:  # an itemgetter of one index gives the item, not a tuple
                return Reader(lambda message: missing, plain=True, program=program)
            pick = itemgetter(*order)
            return Reader(
                lambda message: pick(read_plain(message) + missing), plain=True, program=program
            )
        parts: list[Callable[[Message, tuple[Any, ...]], Any]] = []
        for column, value in zip(columns, absent, strict=True):
            if column in where:
                parts.append(_plain_at(where[column]))
            elif column in fields:
                parts.append(_by_rule(fields[column]))
            else:
                parts.append(_constant(value))

        def read(message: Message) -> tuple[Any, ...]:
            found = read_plain(message)
            return tuple(part(message, found) for part in parts)

        return Reader(read, plain=False)


def _program(message: Descriptor, columns: Sequence[str], absent: Sequence[Any]) -> Program | None:
    """The C reader's program for `columns` of `message`, each a plain scalar field or absent
    (the caller checked); every other field of the message checked only. None for a message
    that is not proto3 (its text's UTF-8 is another matter to the runtime), or that numbers a
    field past what the slots hold."""
    main = descriptor_pb2.FileDescriptorProto()
    message.file.CopyToProto(main)
    numbers = [field.number for field in message.fields]
    if main.syntax != "proto3" or max(numbers, default=0) > _MAX_PROGRAM_FIELD:
        return None
    slots: list[tuple[int, int, int] | None] = [None] * (max(numbers, default=0) + 1)
    for field in message.fields:
        slots[field.number] = (_KINDS[field.type], -1, int(field.is_repeated))
    template = []
    for at, (column, value) in enumerate(zip(columns, absent, strict=True)):
        read = message.fields_by_name.get(column)
        if read is None:
            template.append(value)
            continue
        slots[read.number] = (_KINDS[read.type], at, 0)
        template.append(read.default_value)
    return tuple(slots), tuple(template)


def _plain_at(at: int) -> Callable[[Message, tuple[Any, ...]], Any]:
    return lambda _, found: found[at]


def _by_rule(field: FieldDescriptor) -> Callable[[Message, tuple[Any, ...]], Any]:
    kind = field.message_type
    if kind is not None and kind.full_name == f"{_WELL_KNOWN}Value" and not field.is_repeated:

        def document(message: Message, _: tuple[Any, ...]) -> Any:
            found = _field(message, field, 0)
            return None if found is None else JsonDocument(found)

        return document
    return lambda message, _: _field(message, field, 0)


def _constant(value: Any) -> Callable[[Message, tuple[Any, ...]], Any]:
    return lambda *_: value


def _check_depth(message: Descriptor, depth: int, path: set[str]) -> None:
    """Nesting of messages (fields of message type, through every path) within MAX_DEPTH; a
    message that contains itself is read only as deep as a body nests it, bounded at reading."""
    if depth > MAX_DEPTH:
        raise ProtoError(f"schema: messages nest deeper than {MAX_DEPTH} at {message.full_name}")
    if message.full_name in path:
        return
    path.add(message.full_name)
    for field in message.fields:
        if field.message_type is not None:
            _check_depth(field.message_type, depth + 1, path)
    path.discard(message.full_name)


def _message(message: Message, depth: int) -> dict[str, Any]:
    if depth >= MAX_DEPTH:
        raise ProtoError(f"value: messages nest deeper than {MAX_DEPTH}")
    found: dict[str, Any] = {}
    descriptor = cast(Descriptor, message.DESCRIPTOR)  # the stubs also name upb's own class
    for field in descriptor.fields:
        found[field.name] = _field(message, field, depth)
    return found


def _field(message: Message, field: FieldDescriptor, depth: int) -> Any:
    value = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entry = field.message_type.fields_by_name["value"]
        return {_key(k): _single(v, entry, depth) for k, v in value.items()}
    if field.is_repeated:
        return [_single(v, field, depth) for v in value]
    if field.has_presence and not message.HasField(field.name):
        return None
    return _single(value, field, depth)


def _key(key: Any) -> str:
    """A map's key as JSON's object keys are: text (a bool as JSON writes it)."""
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _single(value: Any, field: FieldDescriptor, depth: int) -> Any:
    if field.enum_type is not None:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    if field.message_type is None:
        return value
    name = field.message_type.full_name
    if name.startswith(_WELL_KNOWN):
        try:
            if name == f"{_WELL_KNOWN}Timestamp":
                return _EPOCH + timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)
            if name == f"{_WELL_KNOWN}Duration":
                return timedelta(seconds=value.seconds, microseconds=int(value.nanos / 1000))
        except OverflowError:
            raise ProtoError(f"value: field {field.full_name}: {name[len(_WELL_KNOWN):]} "
                             f"{value.seconds} s is out of range") from None  # fmt: skip
        if name in _WRAPPERS:
            return value.value
        if name in (f"{_WELL_KNOWN}Struct", f"{_WELL_KNOWN}Value", f"{_WELL_KNOWN}ListValue"):
            try:
                return MessageToDict(value)
            except (ValueError, RecursionError) as exc:  # NaN and infinities are not JSON
                raise ProtoError(f"value: field {field.full_name}: {exc}") from None
    return _message(value, depth + 1)
