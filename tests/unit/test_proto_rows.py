"""Protobuf values to rows (`consumers.decoding.proto_rows`) on a schema built as descriptors
(no registry, no protoc): the batch paths give what `decode` gives a value at a time, the
carried-only path only when the message fits it, and a value that cannot be read is named."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pb2, message_factory

from bridge.settings import SchemaRegistrySettings
from consumers.decoding.proto_rows import ProtobufRowDecoder
from consumers.decoding.proto_schemas import ProtoSchema
from consumers.decoding.records import RecordError
from consumers.decoding.registry_schemas import PROTOBUF, SchemaCache
from consumers.decoding.rows import UNSET

F = descriptor_pb2.FieldDescriptorProto
WRITER = 7


def _cache() -> tuple[SchemaCache, Any]:
    main = descriptor_pb2.FileDescriptorProto(name="bridge_schema.proto", package="t",
                                              syntax="proto3")  # fmt: skip
    order = main.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    order.field.add(name="note", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    order.field.add(name="tags", number=3, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    schema = ProtoSchema(descriptor_pb2.FileDescriptorSet(file=[main]).SerializeToString())
    cache = SchemaCache(SchemaRegistrySettings(url="http://registry.invalid"))
    cache.schemas[WRITER], cache.types[WRITER] = schema, PROTOBUF
    return cache, message_factory.GetMessageClass(schema.message((0,)))


def _framed(message: Any, indexes: bytes = b"\x00") -> bytes:
    body: bytes = message.SerializeToString()
    return b"\x00" + WRITER.to_bytes(4, "big") + indexes + body


@pytest.mark.parametrize(
    "columns",
    [("id", "note"), ("id", "note", "applied_at"), ("tags", "id"), ("applied_at",)],
)
def test_a_batch_reads_as_each_value_does(columns: tuple[str, ...]) -> None:
    cache, order = _cache()
    decoder = ProtobufRowDecoder(columns, schemas=cache, tracked=["applied_at"],
                                 filled=["applied_at"], arrays=["tags"])  # fmt: skip
    values = [_framed(order(id=i, note=f"n{i}", tags=["a", "b"][: i % 3])) for i in range(5)]
    one_by_one = [decoder.decode(v) for v in values]
    assert decoder.decode_all(values) == one_by_one
    assert one_by_one[4] == tuple(
        {"id": 4, "note": "n4", "applied_at": UNSET, "tags": ["a"]}[c] for c in columns
    )
    carried = decoder.decode_carried(values)
    assert carried == [tuple(row[i] for i in decoder.carried) for row in one_by_one]
    # The long form of [0] is read one by one, to the same rows.
    long_form = _framed(order(id=1), b"\x02\x00")  # a count of 1, then index 0
    assert decoder.decode_all([long_form]) == [decoder.decode(_framed(order(id=1)))]


def test_the_carried_path_declines_a_message_with_a_field_the_table_fills() -> None:
    cache, order = _cache()
    decoder = ProtobufRowDecoder(["id", "note"], schemas=cache, filled=["note"])
    assert decoder.decode_carried([_framed(order(id=1, note="x"))]) is None
    assert decoder.decode_all([_framed(order(id=1, note="x"))]) == [(1, "x")]


def test_a_value_that_cannot_be_read_is_named_and_the_batch_goes_one_by_one() -> None:
    cache, order = _cache()
    decoder = ProtobufRowDecoder(["id"], schemas=cache)
    bad = b"\x00" + WRITER.to_bytes(4, "big") + b"\x00\x0a\xff\xff"
    assert decoder.decode_all([_framed(order(id=1)), bad]) is None
    with pytest.raises(RecordError, match=rf"does not decode by schema id {WRITER}: body"):
        decoder.decode(bad)
    with pytest.raises(RecordError, match=r"has no message 3"):
        decoder.decode(b"\x00" + WRITER.to_bytes(4, "big") + b"\x02\x06")
    with pytest.raises(RecordError, match=r"wire format"):
        decoder.decode(b"{}")
