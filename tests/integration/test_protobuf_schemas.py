"""Protobuf schemas compiled at run time, as the registry serves them, and values read by them
(`consumers.decoding.proto_schemas`): protoc runs in a process of its own here, and the real
registry (Apicurio 2.6.13) is asked what it does with Protobuf schemas."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf import message_factory

from consumers.decoding.proto_schemas import (
    MAX_DEPTH,
    ProtoError,
    ProtoSchema,
    compile_schema,
    read_indexes,
)

ORDER = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "shop/common.proto";

enum Status { NEW = 0; PAID = 1; }
message Order {
  int64 id = 1;
  google.protobuf.Timestamp at = 2;
  message Line { string sku = 1; uint64 qty = 2; }
  repeated Line lines = 3;
  map<string, int32> attrs = 4;
  oneof pay { string card = 5; int64 cash = 6; }
  optional sint32 maybe = 7;
  Status status = 8;
  google.protobuf.Duration took = 9;
  google.protobuf.Int64Value boxed = 10;
  bytes blob = 11;
  fixed64 f64 = 12;
  sfixed32 sf32 = 13;
  sint64 s64 = 14;
  uint32 u32 = 15;
  double ratio = 16;
  float small = 17;
  bool flag = 18;
  common.Money price = 19;
  google.protobuf.Struct extra = 20;
  map<bool, Line> by_flag = 21;
  repeated Status history = 22;
}
message Refund { int64 order_id = 1; }
"""
COMMON = """syntax = "proto3";
package common;
message Money { string currency = 1; int64 units = 2; }
"""
REFERENCES = {"shop/common.proto": COMMON}


@pytest.fixture(scope="module")
def schema() -> ProtoSchema:
    return ProtoSchema(compile_schema(ORDER, REFERENCES))


def classes(schema: ProtoSchema, indexes: tuple[int, ...]) -> Any:
    """The test's own class for a message: built by the protobuf runtime from the same
    descriptors, as a producer's generated code would be."""
    return message_factory.GetMessageClass(schema.message(indexes))


def test_every_type_reads_as_the_module_says_over_its_full_range(schema: ProtoSchema) -> None:
    order = classes(schema, (0,))()
    order.id = -(2**63)
    order.at.seconds, order.at.nanos = 1_764_000_000, 123_456_789
    line = order.lines.add()
    line.sku, line.qty = "ç", 2**64 - 1
    order.attrs["k"] = -1
    order.cash = 2**63 - 1
    order.maybe = -(2**31)
    order.status = 7  # a number the enum does not name: proto3 enums are open
    order.took.seconds, order.took.nanos = -5, -500_000_000
    order.boxed.value = 0  # present, though the default
    order.blob = bytes(range(256))
    order.f64, order.sf32, order.s64, order.u32 = 2**64 - 1, -(2**31), -(2**63), 2**32 - 1
    order.ratio, order.small, order.flag = 1.0000000000000002, 0.5, True
    order.price.currency = "EUR"
    order.extra.update({"a": [1, "x", None], "b": {"c": True}})
    order.by_flag[True].sku = "t"
    order.history.extend([1, 0])
    found = schema.values(order.SerializeToString())
    assert found == {
        "id": -(2**63),
        "at": datetime(2025, 11, 24, 16, 0, 0, 123456, tzinfo=UTC),
        "lines": [{"sku": "ç", "qty": 2**64 - 1}],
        "attrs": {"k": -1},
        "card": None,  # the oneof's other member
        "cash": 2**63 - 1,
        "maybe": -(2**31),
        "status": "7",
        "took": timedelta(seconds=-5, microseconds=-500_000),
        "boxed": 0,
        "blob": bytes(range(256)),
        "f64": 2**64 - 1,
        "sf32": -(2**31),
        "s64": -(2**63),
        "u32": 2**32 - 1,
        "ratio": 1.0000000000000002,
        "small": 0.5,
        "flag": True,
        "price": {"currency": "EUR", "units": 0},
        "extra": {"a": [1.0, "x", None], "b": {"c": True}},
        "by_flag": {"true": {"sku": "t", "qty": 0}},
        "history": ["PAID", "NEW"],
    }


def test_absent_fields_are_none_with_presence_and_their_default_without(
    schema: ProtoSchema,
) -> None:
    found = schema.values(b"")  # every field absent
    assert found["maybe"] is None and found["card"] is None and found["cash"] is None
    assert found["at"] is None and found["boxed"] is None and found["price"] is None
    assert found["id"] == 0 and found["status"] == "NEW" and found["blob"] == b""
    assert found["flag"] is False and found["lines"] == [] and found["attrs"] == {}


def test_message_indexes_choose_the_message_nested_ones_by_path(schema: ProtoSchema) -> None:
    framed = b"\x00" + (7).to_bytes(4, "big")
    assert read_indexes(framed + b"\x00rest", 5) == ((0,), 6)  # the short form of [0]
    assert read_indexes(framed + b"\x02\x02xyz", 5) == ((1,), 7)  # count 1 (zigzag 2), index 1
    assert read_indexes(framed + b"\x04\x00\x00", 5) == ((0, 0), 8)  # Order.Line
    refund = classes(schema, (1,))(order_id=9).SerializeToString()
    assert schema.values(refund, (1,)) == {"order_id": 9}
    line = classes(schema, (0, 0))(sku="a", qty=3).SerializeToString()
    assert schema.values(line, (0, 0)) == {"sku": "a", "qty": 3}
    with pytest.raises(ProtoError, match=r"message indexes \[5\]: the schema has no message 5"):
        schema.values(b"", (5,))
    with pytest.raises(ProtoError, match=r"message shop.Refund has no message 0"):
        schema.values(b"", (1, 0))
    for bad, says in [
        (b"\x02\x03", "-2 is negative"),  # count 1, index zigzag(3)
        (b"\x03", "a count of -2"),
        (b"\x02", "ends inside"),
        (b"\xff" * 11, "longer than 10 bytes"),
        (b"\x82\x01", "a count of 65"),
    ]:
        with pytest.raises(ProtoError, match=says):
            read_indexes(framed + bad, 5)


def test_a_body_that_does_not_parse_is_named(schema: ProtoSchema) -> None:
    with pytest.raises(ProtoError, match=r"body does not parse as shop.Order"):
        schema.values(b"\x0a\xff\xff")  # field 1 as length-delimited, its length past the end
    order = classes(schema, (0,))()
    order.extra.update({"n": float("nan")})  # a Struct's number that JSON cannot hold
    with pytest.raises(ProtoError, match=r"field shop.Order.extra: Fail to serialize NaN"):
        schema.values(order.SerializeToString())


def test_a_schema_that_does_not_compile_says_what_protoc_says() -> None:
    with pytest.raises(ProtoError, match=r'"nope.X" is not defined'):
        compile_schema('syntax = "proto3";\nmessage A { nope.X x = 1; }\n', {})
    with pytest.raises(ProtoError, match=r"not an import path"):
        compile_schema(ORDER, {"../etc/passwd": COMMON})
    with pytest.raises(ProtoError, match=r"more than"):
        compile_schema("//" + "x" * 1024**2, {})
    with pytest.raises(ProtoError, match=r"is not text protoc can read"):
        compile_schema('syntax = "proto3";\n// \ud800\nmessage A {}\n', {})
    with pytest.raises(ProtoError, match=r"defines no message"):
        ProtoSchema(compile_schema('syntax = "proto3";\nenum E { A = 0; }\n', {}))


def test_a_message_that_contains_itself_is_read_as_deep_as_a_body_nests_it_bounded() -> None:
    schema = ProtoSchema(
        compile_schema('syntax = "proto3";\nmessage Node { Node next = 1; int32 n = 2; }\n', {})
    )
    node = classes(schema, (0,))
    shallow = node(n=1)
    shallow.next.n = 2
    assert schema.values(shallow.SerializeToString()) == {
        "next": {"next": None, "n": 2}, "n": 1,
    }  # fmt: skip
    deep = node(n=0)
    tip = deep
    for n in range(MAX_DEPTH + 5):
        tip = tip.next
        tip.n = n
    with pytest.raises(ProtoError, match=r"nest deeper than"):
        schema.values(deep.SerializeToString())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - the stack's own
        return str(answer.read().decode())


def test_the_registry_serves_protobuf_text_with_its_references_and_it_compiles(
    registry_url: str, names: dict[str, str]
) -> None:
    """What Apicurio 2.6.13's Confluent-compatible API does with Protobuf, as the reader relies
    on it: the text back as registered, with its references; `format=serialized` ignored (so
    the text is what there is to compile); well-known imports taken without a reference; a text
    that is not a schema refused; a self-recursive message taken; BACKWARD enforced."""
    with SchemaRegistryClient({"url": registry_url}) as client:
        _ask(client, registry_url, names)


def _ask(client: SchemaRegistryClient, registry_url: str, names: dict[str, str]) -> None:
    common = f"{names['topic']}-common"
    client.register_schema(common, Schema(COMMON, "PROTOBUF"))
    reference = SchemaReference("shop/common.proto", common, 1)
    subject = f"{names['topic']}-value"
    schema_id = client.register_schema(subject, Schema(ORDER, "PROTOBUF", [reference]))
    served = client.get_schema(schema_id)
    assert served.schema_type == "PROTOBUF" and served.schema_str == ORDER
    references = served.references or []
    assert [(r.name, r.subject, r.version) for r in references] == [
        ("shop/common.proto", common, 1)
    ]
    assert '"schema":"syntax' in _get(f"{registry_url}/schemas/ids/{schema_id}?format=serialized")
    referenced = {str(r.name): str(client.get_version(str(r.subject), int(r.version or 0))
                                   .schema.schema_str) for r in references}  # fmt: skip
    compiled = ProtoSchema(compile_schema(served.schema_str, referenced))
    assert compiled.message((1,)).full_name == "shop.Refund"

    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(f"{subject}-x", Schema("this is not proto", "PROTOBUF"))
    assert refused.value.http_status_code == 422
    client.register_schema(f"{subject}-rec", Schema(
        'syntax = "proto3";\nmessage Node { Node next = 1; }\n', "PROTOBUF"))  # fmt: skip
    v1 = 'syntax = "proto3";\nmessage A { int64 id = 1; }\n'
    client.register_schema(f"{subject}-compat", Schema(v1, "PROTOBUF"))
    client.set_compatibility(f"{subject}-compat", "BACKWARD")
    added = 'syntax = "proto3";\nmessage A { int64 id = 1; string n = 2; }\n'
    client.register_schema(f"{subject}-compat", Schema(added, "PROTOBUF"))
    with pytest.raises(SchemaRegistryError, match="not backward compatible"):
        retyped = 'syntax = "proto3";\nmessage A { string id = 1; string n = 2; }\n'
        client.register_schema(f"{subject}-compat", Schema(retyped, "PROTOBUF"))
