"""A DataFrame's schema as a Protobuf schema (proto3), the one a `protobuf` topic's records are
written with.

The mapping (docs/typed-records.md holds its table), chosen so that the consumer lands every
value exactly (`consumers.decoding.proto_schemas`' rules):

- strings, bytes and booleans to `string`, `bytes`, `bool`; `byte`, `short`, `int` to `int32`,
  `long` to `int64`, `float` and `double` to theirs;
- `timestamp` to `google.protobuf.Timestamp` (microseconds, as Spark keeps them);
- `decimal(p, s)`, `date` and `timestamp_ntz` to `string`: every digit of the decimal, the date
  and the local date-time in ISO 8601 (Protobuf has no decimal, and no date without importing
  types a registry does not build in); PostgreSQL casts each text into its column type;
- an array to `repeated`, a map with string, integer or boolean keys to `map<K, V>`, a struct to
  a message nested in its parent, named after its field (`Sub` for `sub`);
- a field's number is its place among its struct's fields, from 1: a later schema with a column
  added at the end is a compatible one; a column inserted or moved renumbers those after it,
  which the registry's compatibility rule refuses, naming the subject.

**Presence**: a nullable scalar column is a proto3 `optional` field, so that null stays null (an
absent field reads as NULL); a struct is a message, which has presence whatever its nullability;
a non-nullable scalar is a plain field. Protobuf cannot hold a null array or map (it is written
as an empty one), nor a null element of an array or value of a map (the row fails its task,
naming the field).

A type Protobuf cannot hold (an array of arrays or maps, a map of those, a map with other keys,
intervals, variants) or a name Protobuf refuses is a `ConfigError` naming the column's path,
raised before the query writes anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyspark.sql import types as T

from bridge.errors import ConfigError

TIMESTAMP_IMPORT = "google/protobuf/timestamp.proto"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SCALARS: tuple[tuple[type[T.DataType], str], ...] = (
    (T.StringType, "string"),
    (T.CharType, "string"),
    (T.VarcharType, "string"),
    (T.BinaryType, "bytes"),
    (T.BooleanType, "bool"),
    (T.ByteType, "int32"),
    (T.ShortType, "int32"),
    (T.IntegerType, "int32"),
    (T.LongType, "int64"),
    (T.FloatType, "float"),
    (T.DoubleType, "double"),
    (T.DecimalType, "string"),
    (T.DateType, "string"),
    (T.TimestampNTZType, "string"),
    (T.TimestampType, "google.protobuf.Timestamp"),
)
_MAP_KEYS: tuple[tuple[type[T.DataType], str], ...] = (
    (T.StringType, "string"),
    (T.BooleanType, "bool"),
    (T.ByteType, "int32"),
    (T.ShortType, "int32"),
    (T.IntegerType, "int32"),
    (T.LongType, "int64"),
)


@dataclass
class _Message:
    name: str
    lines: list[str] = field(default_factory=list)
    nested: list[_Message] = field(default_factory=list)

    def text(self, indent: str = "") -> list[str]:
        inner = indent + "  "
        out = [f"{indent}message {self.name} {{"]
        out += [inner + line for line in self.lines]
        for message in self.nested:
            out += message.text(inner)
        return [*out, f"{indent}}}"]


def proto_schema(schema: T.StructType, *, name: str, package: str = "") -> str:
    """The `.proto` text of the rows of `schema`: one top-level message named `name`, in
    `package` (none when empty)."""
    problems: list[tuple[str, str]] = []
    if not _NAME.match(name):
        problems.append(("message name", f"{name!r} is not a Protobuf name"))
    top = _message(schema, name, "", problems)
    if problems:
        raise ConfigError(problems, source="the DataFrame's schema as Protobuf")
    body = top.text()
    head = ['syntax = "proto3";']
    if package:
        head.append(f"package {package};")
    if any("google.protobuf.Timestamp" in line for line in body):
        head.append(f'import "{TIMESTAMP_IMPORT}";')
    return "\n".join([*head, "", *body, ""])


def _message(
    schema: T.StructType, name: str, path: str, problems: list[tuple[str, str]]
) -> _Message:
    message = _Message(name)
    taken = {name}  # a nested message named as its parent would shadow it
    for number, column in enumerate(schema.fields, start=1):
        where = f"{path}.{column.name}" if path else column.name
        if not _NAME.match(column.name):
            problems.append(
                (where, f"{column.name!r} is not a Protobuf field name (letters, digits, _)")
            )
            continue
        data_type = column.dataType
        if isinstance(data_type, T.ArrayType):
            element = _single(data_type.elementType, column.name, where + "[]", message, taken,
                              problems)  # fmt: skip
            message.lines.append(f"repeated {element} {column.name} = {number};")
        elif isinstance(data_type, T.MapType):
            key = _map_key(data_type.keyType, where, problems)
            value = _single(data_type.valueType, column.name, where + "{}", message, taken,
                            problems)  # fmt: skip
            message.lines.append(f"map<{key}, {value}> {column.name} = {number};")
        else:
            single = _single(data_type, column.name, where, message, taken, problems)
            scalar = not isinstance(data_type, T.StructType | T.TimestampType)
            label = "optional " if column.nullable and scalar else ""
            message.lines.append(f"{label}{single} {column.name} = {number};")
    return message


def _single(
    data_type: T.DataType,
    field_name: str,
    where: str,
    parent: _Message,
    taken: set[str],
    problems: list[tuple[str, str]],
) -> str:
    """The type of one value (a field's, an element's, a map value's): a scalar, Timestamp or a
    message nested in `parent`, named after the field."""
    for spark_type, proto in _SCALARS:
        if isinstance(data_type, spark_type):
            return proto
    if isinstance(data_type, T.StructType):
        name = field_name[0].upper() + field_name[1:]
        while name in taken:
            name += "_"
        taken.add(name)
        parent.nested.append(_message(data_type, name, where, problems))
        return name
    if isinstance(data_type, T.ArrayType | T.MapType):
        problems.append((where, f"{data_type.simpleString()}: Protobuf has no list or map of "
                         "lists or maps; put the inner one in a struct"))  # fmt: skip
    else:
        problems.append(
            (
                where,
                f"{data_type.simpleString()} has no Protobuf form here; cast it or leave it out",
            )
        )
    return "bytes"


def _map_key(data_type: T.DataType, where: str, problems: list[tuple[str, str]]) -> str:
    for spark_type, proto in _MAP_KEYS:
        if isinstance(data_type, spark_type):
            return proto
    problems.append((where, f"a map's keys must be strings, integers or booleans in Protobuf, "
                     f"not {data_type.simpleString()}"))  # fmt: skip
    return "string"
