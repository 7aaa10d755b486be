"""The Protobuf reader (`consumers.decoding.proto_schemas`) against hostile bytes and against the
protobuf library's own encoding: any body and any message-index framing give a dict or a
ProtoError, nothing else; and messages the library encodes from generated values read back as
those values, by the module's rules; and the C reader of plain fields (`_proto_body.c`) gives the
runtime's rows or declines, never rows for a body the runtime refuses. The schema is built as
descriptors here (no protoc: no I/O); `tests/integration/test_protobuf_schemas.py` compiles real
`.proto` text."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import descriptor_pb2, message_factory, timestamp_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.decoding.proto_schemas import MISSING, ProtoError, ProtoSchema, read_indexes

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    "i64": (F.TYPE_INT64, st.integers(-(2**63), 2**63 - 1)),
    "s32": (F.TYPE_SINT32, st.integers(-(2**31), 2**31 - 1)),
    "u64": (F.TYPE_UINT64, st.integers(0, 2**64 - 1)),
    "fx64": (F.TYPE_FIXED64, st.integers(0, 2**64 - 1)),
    "sfx32": (F.TYPE_SFIXED32, st.integers(-(2**31), 2**31 - 1)),
    "u32": (F.TYPE_UINT32, st.integers(0, 2**32 - 1)),
    "dbl": (F.TYPE_DOUBLE, st.floats(allow_nan=False)),
    "flag": (F.TYPE_BOOL, st.booleans()),
    "text": (F.TYPE_STRING, st.text(max_size=20)),
    "blob": (F.TYPE_BYTES, st.binary(max_size=20)),
}


def _schema() -> ProtoSchema:
    """`bridge_schema.proto` as the compiler would write it: message Rec with a field of each
    scalar kind, a repeated one, an enum, a nested Rec, a Timestamp and a proto3 optional."""
    main = descriptor_pb2.FileDescriptorProto(
        name="bridge_schema.proto", package="t", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )  # fmt: skip
    main.enum_type.add(name="Color").value.extend(
        [descriptor_pb2.EnumValueDescriptorProto(name=n, number=i) for i, n in enumerate("RGB")]
    )
    rec = main.message_type.add(name="Rec")
    number = 0
    for number, (name, (kind, _)) in enumerate(SCALARS.items(), start=1):
        rec.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL)
    more = [
        ("many", F.TYPE_SINT64, F.LABEL_REPEATED, None),
        ("color", F.TYPE_ENUM, F.LABEL_OPTIONAL, ".t.Color"),
        ("next", F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".t.Rec"),
        ("at", F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
    ]
    for name, kind, label, type_name in more:
        number += 1
        added = rec.field.add(name=name, number=number, type=kind, label=label)
        if type_name is not None:
            added.type_name = type_name
    rec.oneof_decl.add(name="_maybe")  # a proto3 optional is a synthetic oneof of one
    rec.field.add(name="maybe", number=number + 1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL,
                  oneof_index=0, proto3_optional=True)  # fmt: skip
    wkt = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(wkt)
    return ProtoSchema(descriptor_pb2.FileDescriptorSet(file=[wkt, main]).SerializeToString())


SCHEMA = _schema()
REC: Any = message_factory.GetMessageClass(SCHEMA.message((0,)))
# `make test` runs a few hundred examples a property, the same on every machine;
# `python -m bench.fuzz --protobuf` runs many more, fresh (BRIDGE_FUZZ_EXAMPLES, _RANDOM).
EXAMPLES = int(os.environ.get("BRIDGE_FUZZ_EXAMPLES", "400"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
    derandomize=os.environ.get("BRIDGE_FUZZ_RANDOM") is None,
)


@FUZZ
@given(st.binary(max_size=200), st.lists(st.integers(0, 3), min_size=1, max_size=3))
def test_any_body_and_any_path_give_values_or_a_proto_error(body: bytes, path: list[int]) -> None:
    try:
        found = SCHEMA.values(body, tuple(path))
    except ProtoError:
        return
    assert isinstance(found, dict)


@FUZZ
@given(st.binary(max_size=30))
def test_any_framing_gives_indexes_or_a_proto_error(raw: bytes) -> None:
    try:
        indexes, body_at = read_indexes(b"\x00\x00\x00\x00\x01" + raw, 5)
    except ProtoError:
        return
    assert indexes and all(i >= 0 for i in indexes) and 5 < body_at <= 5 + len(raw)


@st.composite
def records(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    values = {name: draw(strategy) for name, (_, strategy) in SCALARS.items()}
    values["many"] = draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4))
    values["color"] = draw(st.integers(0, 4))  # 3 and 4: numbers the enum does not name
    values["maybe"] = draw(st.none() | st.integers(-(2**31), 2**31 - 1))
    values["at"] = draw(st.none() | st.tuples(st.integers(-62_135_596_800, 253_402_300_799),
                                              st.integers(0, 999_999_999)))  # fmt: skip
    values["next"] = draw(st.none() | records(depth + 1)) if depth < 3 else None
    return values


def _encoded(values: dict[str, Any]) -> Any:
    message = REC()
    for name in SCALARS:
        setattr(message, name, values[name])
    message.many.extend(values["many"])
    message.color = values["color"]
    if values["maybe"] is not None:
        message.maybe = values["maybe"]
    if values["at"] is not None:
        message.at.seconds, message.at.nanos = values["at"]
    if values["next"] is not None:
        message.next.CopyFrom(_encoded(values["next"]))
    return message


def _expected(values: dict[str, Any]) -> dict[str, Any]:
    expected = {name: values[name] for name in SCALARS}
    expected["many"] = values["many"]
    expected["color"] = "RGB"[values["color"]] if values["color"] < 3 else str(values["color"])
    expected["maybe"] = values["maybe"]
    at = values["at"]
    expected["at"] = None if at is None else (
        datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=at[0], microseconds=at[1] // 1000)
    )  # fmt: skip
    expected["next"] = None if values["next"] is None else _expected(values["next"])
    return expected


@FUZZ
@given(records())
def test_what_the_library_encodes_reads_back_as_its_values(values: dict[str, Any]) -> None:
    body = _encoded(values).SerializeToString()
    expected = _expected(values)
    assert SCHEMA.values(body) == expected
    # The column-wise reader the routes use gives the same, plain columns read in one call.
    plain = ["not_a_field", *SCALARS, "nor_this"]
    for columns in (list(SCALARS), plain, [*expected, "not_a_field"], ["not_a_field"]):
        reading = SCHEMA.reader((0,), columns)
        assert reading.plain == (columns != [*expected, "not_a_field"])
        assert reading.read(SCHEMA.parse(body)) == tuple(expected.get(c, MISSING) for c in columns)


# Every kind of plain scalar field, numbered with gaps (fields the reader does not read fall in
# them), for the C reader of plain fields (`consumers.decoding._proto_body`).
PLAIN_KINDS = {
    "i32": (F.TYPE_INT32, st.integers(-(2**31), 2**31 - 1)),
    "i64": (F.TYPE_INT64, st.integers(-(2**63), 2**63 - 1)),
    "u32": (F.TYPE_UINT32, st.integers(0, 2**32 - 1)),
    "u64": (F.TYPE_UINT64, st.integers(0, 2**64 - 1)),
    "s32": (F.TYPE_SINT32, st.integers(-(2**31), 2**31 - 1)),
    "s64": (F.TYPE_SINT64, st.integers(-(2**63), 2**63 - 1)),
    "flag": (F.TYPE_BOOL, st.booleans()),
    "fx32": (F.TYPE_FIXED32, st.integers(0, 2**32 - 1)),
    "sfx32": (F.TYPE_SFIXED32, st.integers(-(2**31), 2**31 - 1)),
    "flt": (F.TYPE_FLOAT, st.floats(width=32)),
    "fx64": (F.TYPE_FIXED64, st.integers(0, 2**64 - 1)),
    "sfx64": (F.TYPE_SFIXED64, st.integers(-(2**63), 2**63 - 1)),
    "dbl": (F.TYPE_DOUBLE, st.floats()),
    "text": (F.TYPE_STRING, st.text(max_size=12)),
    "blob": (F.TYPE_BYTES, st.binary(max_size=12)),
}


def _plain_schema() -> ProtoSchema:
    main = descriptor_pb2.FileDescriptorProto(name="bridge_schema.proto", package="p",
                                              syntax="proto3")  # fmt: skip
    plain = main.message_type.add(name="Plain")
    for at, (name, (kind, _)) in enumerate(PLAIN_KINDS.items()):
        plain.field.add(name=name, number=3 * at + 1, type=kind, label=F.LABEL_OPTIONAL)
    # Fields no column takes, which the C reader checks as the runtime parses them (a packed
    # list, a list of text), or declines (a nested message).
    plain.field.add(name="many", number=2, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
    plain.field.add(name="names", number=3, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    plain.field.add(name="sub", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".p.Plain")  # fmt: skip
    return ProtoSchema(descriptor_pb2.FileDescriptorSet(file=[main]).SerializeToString())


PLAIN_SCHEMA = _plain_schema()
PLAIN: Any = message_factory.GetMessageClass(PLAIN_SCHEMA.message((0,)))
PLAIN_COLUMNS = ["gone", *PLAIN_KINDS]  # a column the message has no field for, first
PLAIN_READER = PLAIN_SCHEMA.reader((0,), PLAIN_COLUMNS, ["absent", *([MISSING] * 15)])
HEAD = b"\x00\x00\x00\x00\x07\x00"


@st.composite
def plain_bodies(draw: st.DrawFn) -> bytes:
    """A body the library encodes, then maybe mutated: cut short, a byte changed, another
    encoding after it (its fields win), or bytes of any kind inserted."""
    values = {name: draw(strategy) for name, (_, strategy) in PLAIN_KINDS.items()}
    values["many"] = draw(st.lists(st.integers(0, 9), max_size=3))
    values["names"] = draw(st.lists(st.text(max_size=3), max_size=2))
    values["sub"] = draw(st.none() | st.just({"i32": 1, "text": "ç"}))
    body: bytes = PLAIN(**values).SerializeToString()
    change = draw(st.sampled_from(["none", "cut", "flip", "again", "insert"]))
    if change == "cut" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif change == "flip" and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1 :]
    elif change == "again":
        more = {name: draw(strategy) for name, (_, strategy) in PLAIN_KINDS.items()}
        chosen = draw(st.sets(st.sampled_from(list(more))))  # some fields again, or none
        body += PLAIN(**{name: more[name] for name in chosen}).SerializeToString()
    elif change == "insert":
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.binary(max_size=8)) + body[at:]
    return body


@FUZZ
@given(plain_bodies() | st.binary(max_size=80))
def test_the_c_reader_of_plain_fields_reads_as_the_runtime_or_declines(body: bytes) -> None:
    """Rows equal to the runtime's wherever the C reader gives rows (NaN and -0.0 compared by
    their repr), and never rows for a body the runtime refuses."""
    from consumers.decoding import _proto_body

    assert PLAIN_READER.program is not None
    rows = _proto_body.decode_rows([HEAD + body], len(HEAD), *PLAIN_READER.program)
    try:
        expected = PLAIN_READER.read(PLAIN_SCHEMA.parse(body))
    except ProtoError:
        assert rows is None
        return
    if rows is not None:
        assert repr(rows) == repr([expected])


@FUZZ
@given(st.fixed_dictionaries({name: s for name, (_, s) in PLAIN_KINDS.items()}))
def test_the_c_reader_reads_what_the_library_encodes(values: dict[str, Any]) -> None:
    from consumers.decoding import _proto_body

    assert PLAIN_READER.program is not None
    body = PLAIN(**values, many=[1, 2]).SerializeToString()
    rows = _proto_body.decode_rows([HEAD + body, HEAD], len(HEAD), *PLAIN_READER.program)
    assert rows is not None
    assert repr(rows[0]) == repr(("absent", *PLAIN_READER.read(PLAIN_SCHEMA.parse(body))[1:]))
    assert rows[1] == ("absent", 0, 0, 0, 0, 0, 0, False, 0, 0, 0.0, 0, 0, 0.0, "", b"")
