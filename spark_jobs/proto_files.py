"""The Protobuf schema a column is written with: derived from the DataFrame's schema
(`spark_jobs.proto_schema`), or the user's own `.proto` file and a message of it.

Either is compiled here, on the driver, by protoc (`bridge.protobuf_compiler`), and becomes a
`ProtoWriting`: the text the registry takes, the imports it references, the compiled
descriptors the workers build the message from, the message's full name, and its **message
indexes** as the wire format frames them (the message's path among the file's messages, nested
ones included; `[0]`, the first message, in its short form: a lone 0).

A user's file may import others: each is read from the file's own directory, and registered as
a schema of its own under its import path as the subject (Confluent's default for references),
before the file that names it; the well-known types (`google/protobuf/*.proto`) are built in,
as the registry and protoc both take them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FileDescriptor
from pyspark.sql import types as T

from bridge.errors import ConfigError
from bridge.protobuf_compiler import MAIN_FILE, MAX_REFERENCES, ProtoError, compile_schema
from spark_jobs.proto_schema import proto_schema

_IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.MULTILINE)
_WELL_KNOWN = "google/protobuf/"


@dataclass(frozen=True)
class ProtoWriting:
    text: str
    # (import path, text) of every file it imports but the well-known ones, each after those
    # it imports itself: the order they are registered in.
    references: tuple[tuple[str, str], ...]
    imports: dict[str, tuple[str, ...]]  # each file's own imports (the main one's under "")
    descriptors: bytes
    full_name: str
    indexes: bytes


def derived(data_type: T.StructType, *, name: str, package: str) -> ProtoWriting:
    """The schema `spark_jobs.proto_schema` derives, compiled; its one message."""
    text = proto_schema(data_type, name=name, package=package)
    return _compiled(text, (), {"": ()}, f"{package}.{name}" if package else name, "value")


def from_file(path: str, message: str | None, *, option: str) -> ProtoWriting:
    """The user's `.proto` at `path` and its message `message` (full name; the file's first
    message when None). `option`: the sink option that named the file, for errors."""
    main = Path(path)
    try:
        text = main.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([(option, f"cannot read {path}: {exc}")]) from None
    references: dict[str, str] = {}
    imports: dict[str, tuple[str, ...]] = {"": _imports(text)}
    order: list[str] = []

    def read(name: str, trail: tuple[str, ...]) -> None:
        if name in references or name.startswith(_WELL_KNOWN):
            return
        if name in trail:
            raise ConfigError([(option, f"{path}: its imports go round: {' -> '.join(trail)}")])
        if len(references) >= MAX_REFERENCES:
            raise ConfigError([(option, f"{path}: more than {MAX_REFERENCES} imports")])
        where = PurePosixPath(name)
        if where.is_absolute() or ".." in where.parts:
            raise ConfigError([(option, f"{path}: import {name!r} is not below its directory")])
        try:
            body = (main.parent / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError([(option, f"{path}: its import {name}: {exc}")]) from None
        imports[name] = _imports(body)
        for inner in imports[name]:
            read(inner, (*trail, name))
        references[name] = body
        order.append(name)

    for name in imports[""]:
        read(name, ("the file",))
    try:
        pool_file = _main_file(compile_schema(text, references))
    except ProtoError as exc:
        raise ConfigError([(option, f"{path} does not compile: {exc}")]) from None
    chosen = _message(pool_file, message, path=path, option=option)
    return _compiled(
        text, tuple((n, references[n]) for n in order), imports, chosen.full_name, option
    )


def _imports(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_IMPORT.findall(text)))


def _compiled(
    text: str,
    references: tuple[tuple[str, str], ...],
    imports: dict[str, tuple[str, ...]],
    full_name: str,
    option: str,
) -> ProtoWriting:
    try:
        descriptors = compile_schema(text, dict(references))
    except ProtoError as exc:  # a derived schema with a name protoc refuses
        raise ConfigError([(option, f"its Protobuf schema does not compile: {exc}")]) from None
    message = _main_file(descriptors).pool.FindMessageTypeByName(full_name)
    return ProtoWriting(text, references, imports, descriptors, full_name, indexes(message))


def _main_file(descriptors: bytes) -> FileDescriptor:
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptors).file:
        pool.Add(file)
    return pool.FindFileByName(MAIN_FILE)


def _message(file: FileDescriptor, wanted: str | None, *, path: str, option: str) -> Descriptor:
    top: Sequence[Descriptor] = list(file.message_types_by_name.values())
    if wanted is None:
        if not top:
            raise ConfigError([(option, f"{path} defines no message")])
        return top[0]
    try:
        found: Descriptor = file.pool.FindMessageTypeByName(wanted)
    except KeyError:
        names = ", ".join(m.full_name for m in top)
        why = f"{path} has no message {wanted!r} (its messages: {names})"
        raise ConfigError([(option.replace(".file", ".message"), why)]) from None
    if found.file.name != MAIN_FILE:
        why = f"{wanted} is defined in {found.file.name}, not in {path}"
        raise ConfigError([(option.replace(".file", ".message"), why)])
    return found


def indexes(message: Descriptor) -> bytes:
    """The message indexes of `message` as the wire format writes them: a zigzag varint count,
    then each index; `[0]` as a lone 0, the short form Confluent's serializers write."""
    path: list[int] = []
    found: Descriptor | None = message
    while found is not None:
        parent = found.containing_type
        siblings = parent.nested_types if parent is not None else list(
            found.file.message_types_by_name.values()
        )  # fmt: skip
        path.append(list(siblings).index(found))
        found = parent
    path.reverse()
    if path == [0]:
        return b"\x00"
    return b"".join(_zigzag(n) for n in (len(path), *path))


def _zigzag(number: int) -> bytes:
    value = (number << 1) ^ (number >> 63)
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
