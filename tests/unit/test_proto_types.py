"""Protobuf fields as columns (`consumers.tables.proto_types`), and what a Protobuf writer
schema does to a followed table: no I/O (the schema built as descriptors, no protoc)."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, duration_pb2, struct_pb2, timestamp_pb2, wrappers_pb2

from bridge.settings import RouteSettings, SchemaRegistrySettings
from consumers.decoding.proto_schemas import ProtoSchema
from consumers.decoding.registry_schemas import PROTOBUF, SchemaCache
from consumers.tables.proto_types import proto_columns
from consumers.tables.table_follower import TableFollower

F = descriptor_pb2.FieldDescriptorProto
WRITER = 9
_IMPORTS = [timestamp_pb2, duration_pb2, wrappers_pb2, struct_pb2]


def _schema() -> ProtoSchema:
    main = descriptor_pb2.FileDescriptorProto(
        name="bridge_schema.proto", package="t", syntax="proto3",
        dependency=[m.DESCRIPTOR.name for m in _IMPORTS],
    )  # fmt: skip
    every = main.message_type.add(name="Every")
    scalars = [
        ("i32", F.TYPE_INT32), ("s32", F.TYPE_SINT32), ("sf32", F.TYPE_SFIXED32),
        ("u32", F.TYPE_UINT32), ("f32", F.TYPE_FIXED32), ("i64", F.TYPE_INT64),
        ("s64", F.TYPE_SINT64), ("sf64", F.TYPE_SFIXED64), ("u64", F.TYPE_UINT64),
        ("f64", F.TYPE_FIXED64), ("fl", F.TYPE_FLOAT), ("db", F.TYPE_DOUBLE),
        ("flag", F.TYPE_BOOL), ("text", F.TYPE_STRING), ("raw", F.TYPE_BYTES),
    ]  # fmt: skip
    number = 0
    for number, (name, kind) in enumerate(scalars, start=1):
        every.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL)
    every.enum_type.add(name="Kind").value.add(name="A", number=0)
    messages = [
        ("kind", F.TYPE_ENUM, ".t.Every.Kind", F.LABEL_OPTIONAL),
        ("at", F.TYPE_MESSAGE, ".google.protobuf.Timestamp", F.LABEL_OPTIONAL),
        ("took", F.TYPE_MESSAGE, ".google.protobuf.Duration", F.LABEL_OPTIONAL),
        ("boxed", F.TYPE_MESSAGE, ".google.protobuf.UInt64Value", F.LABEL_OPTIONAL),
        ("said", F.TYPE_MESSAGE, ".google.protobuf.StringValue", F.LABEL_OPTIONAL),
        ("doc", F.TYPE_MESSAGE, ".google.protobuf.Struct", F.LABEL_OPTIONAL),
        ("sub", F.TYPE_MESSAGE, ".t.Every", F.LABEL_OPTIONAL),
        ("tags", F.TYPE_STRING, "", F.LABEL_REPEATED),
        ("counts", F.TYPE_UINT64, "", F.LABEL_REPEATED),
        ("kinds", F.TYPE_ENUM, ".t.Every.Kind", F.LABEL_REPEATED),
        ("times", F.TYPE_MESSAGE, ".google.protobuf.Timestamp", F.LABEL_REPEATED),
        ("spans", F.TYPE_MESSAGE, ".google.protobuf.Duration", F.LABEL_REPEATED),
        ("subs", F.TYPE_MESSAGE, ".t.Every", F.LABEL_REPEATED),
        ("attrs", F.TYPE_MESSAGE, ".t.Every.AttrsEntry", F.LABEL_REPEATED),
    ]
    for at, (name, kind, type_name, label) in enumerate(messages, start=number + 1):
        field = every.field.add(name=name, number=at, type=kind, label=label)
        if type_name:
            field.type_name = type_name
    entry = every.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    every.field.add(name="note", number=90, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL,
                    proto3_optional=True, oneof_index=1)  # fmt: skip
    every.field.add(name="card", number=91, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL,
                    oneof_index=0)  # fmt: skip
    every.oneof_decl.add(name="pay")
    every.oneof_decl.add(name="_note")  # proto3 optional's own oneof, after the real ones
    every.field.add(name="x" * 64, number=99, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    second = main.message_type.add(name="Second")
    second.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    second.field.add(name="region", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    files = [descriptor_pb2.FileDescriptorProto.FromString(m.DESCRIPTOR.serialized_pb)
             for m in _IMPORTS]  # fmt: skip
    return ProtoSchema(descriptor_pb2.FileDescriptorSet(file=[*files, main]).SerializeToString())


def test_every_protobuf_type_has_its_column_type_kind_and_presence() -> None:
    got = {
        c.name: (c.sql_type, c.kind, c.nullable, c.has_default)
        for c in proto_columns(_schema().message((0,)))
    }
    integer, bigint, unsigned = ("integer", "N"), ("bigint", "N"), ("numeric(20,0)", "N")
    plain = (False, True)  # never NULL: absent reads as the default
    assert got == {
        "i32": (*integer, *plain), "s32": (*integer, *plain), "sf32": (*integer, *plain),
        "u32": (*bigint, *plain), "f32": (*bigint, *plain), "i64": (*bigint, *plain),
        "s64": (*bigint, *plain), "sf64": (*bigint, *plain), "u64": (*unsigned, *plain),
        "f64": (*unsigned, *plain), "fl": ("real", "N", *plain),
        "db": ("double precision", "N", *plain), "flag": ("boolean", "B", *plain),
        "text": ("text", "S", *plain), "raw": ("bytea", "U", *plain),
        "kind": ("text", "S", *plain),
        "at": ("timestamp with time zone", "D", True, True),
        "took": ("interval", "T", True, True),
        "boxed": ("numeric(20,0)", "N", True, True),
        "said": ("text", "S", True, True),
        "doc": ("jsonb", "U", True, True),
        "sub": ("jsonb", "U", True, True),
        "tags": ("text[]", "A", *plain),
        "counts": ("numeric(20,0)[]", "A", *plain),
        "kinds": ("text[]", "A", *plain),
        "times": ("timestamp with time zone[]", "A", *plain),
        "spans": ("interval[]", "A", *plain),
        "subs": ("jsonb", "U", *plain),
        "attrs": ("jsonb", "U", *plain),
        "note": ("text", "S", True, True),
        "card": ("text", "S", True, True),
    }  # fmt: skip  # "x" * 64 is no column: PostgreSQL would cut its name short


def _framed(indexes: bytes) -> bytes:
    return b"\x00" + WRITER.to_bytes(4, "big") + indexes + b""


def test_a_followed_table_is_created_from_the_message_the_records_name() -> None:
    cache = SchemaCache(SchemaRegistrySettings(url="http://registry.invalid"))
    cache.schemas[WRITER], cache.types[WRITER] = _schema(), PROTOBUF
    route = RouteSettings(topic="t", table="public.t", value_format="protobuf",
                          auto_create=True, key_columns=("id",), mode="upsert")  # fmt: skip
    follower = TableFollower(route=route, schemas=cache, columns=None, read=lambda: None)
    # The second top-level message ([1]); a value whose indexes do not parse is left to its
    # dead letter.
    (_lock, create) = follower.follow([_framed(b"\x02\x02"), _framed(b"\x02\x80")])
    statement = create.statement.as_string()
    assert statement == (
        'CREATE TABLE "public"."t" ("id" bigint NOT NULL, "region" text NOT NULL, '
        'PRIMARY KEY ("id"))'
    ), statement
