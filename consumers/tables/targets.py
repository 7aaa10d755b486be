"""The user's target tables: reflected at start-up and checked against the routes."""

from __future__ import annotations

import binascii
from base64 import b64decode
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from operator import add, itemgetter
from typing import Any, cast

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message
from psycopg import sql
from sqlalchemy import ARRAY, DateTime, Engine, LargeBinary, MetaData, Table, inspect, text
from sqlalchemy.exc import NoSuchTableError

from bridge.acls import table_rights
from bridge.errors import ConfigError, PermissionMissing
from bridge.names import PROVENANCE_EPOCH, PROVENANCE_PARTITION, PROVENANCE_QUERY
from bridge.settings import KEYED_MODES, UNIQUE_KEY_MODES, RouteSettings
from bridge.topic_patterns import split_table
from consumers.decoding.avro_rows import AvroRowDecoder
from consumers.decoding.change_events import Unwrapped, debezium_unwrapper
from consumers.decoding.proto_rows import ProtobufRowDecoder
from consumers.decoding.record_keys import KeyReader
from consumers.decoding.records import Record, RecordError
from consumers.decoding.registry_json_rows import RegistryJsonRowDecoder
from consumers.decoding.registry_schemas import HEADER, SchemaCache, schema_id
from consumers.decoding.rows import (
    UNSET,
    ArrayValue,
    Row,
    RowDecoder,
    as_cell,
    count_of,
    decode_key,
    objects,
)
from consumers.tables.conversions import field_conversions, zone_conversion
from consumers.tables.record_fields import FieldRules, LeftOut, object_keys

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class Target:
    route: RouteSettings
    schema: str
    name: str
    columns: tuple[str, ...]
    required: frozenset[str]  # NOT NULL without a default: a record must carry them
    defaulted: frozenset[str] = frozenset()  # with a default or an identity
    # GENERATED ALWAYS AS (...) STORED: the table computes them, and refuses any value for them.
    generated: frozenset[str] = frozenset()
    arrays: frozenset[str] = frozenset()  # PostgreSQL array columns
    timestamps: frozenset[str] = frozenset()  # timestamp and timestamptz columns
    local_timestamps: frozenset[str] = frozenset()  # timestamp (without time zone) columns
    binaries: frozenset[str] = frozenset()  # bytea columns
    # Where registry routes find their writer schemas; None when no route needs the registry.
    schemas: SchemaCache | None = field(default=None, repr=False, compare=False)
    decoder: RowDecoder | AvroRowDecoder | RegistryJsonRowDecoder | ProtobufRowDecoder = field(
        init=False, repr=False, compare=False
    )
    # What a decoded row needs before it is written: the route's conversions (`fields.cast`,
    # `fields.timestamps`, `timestamp_zone`) and, for JSON values, its lists made arrays and
    # epoch milliseconds timestamps where the table has such columns; None when nothing does.
    _fix: Callable[[Row], Row] | None = field(init=False, repr=False, compare=False)
    # Whether a record's fields make a row (consumers.tables.record_fields), and the fields
    # `unknown_fields: ignore` left out of records, until the member reports them.
    fields_rules: FieldRules = field(init=False, repr=False, compare=False)
    left_out: LeftOut = field(init=False, repr=False, compare=False, default_factory=LeftOut)
    # Where the columns beyond the key that a record fills from its value are, in a row and in
    # a carried row (None: the carried rows cannot tell, and are not used).
    # The records' values as the route reads them: a Debezium change event unwrapped
    # (`unwrap: debezium`); None where a value is read as it is.
    _unwrap: Callable[[bytes | None], Unwrapped] | None = field(
        init=False, repr=False, compare=False
    )
    # Each with whether the column is tracked (an absent field is UNSET there, not None).
    _beyond_key: tuple[tuple[int, bool], ...] = field(init=False, repr=False, compare=False)
    _beyond_key_of_carried: tuple[tuple[int, bool], ...] | None = field(
        init=False, repr=False, compare=False
    )
    # The metadata columns' values of a record (route.metadata); None without any.
    _meta: Callable[[Record], Row] | None = field(init=False, repr=False, compare=False)
    # Where absent must stay apart from null: a column with a default takes it when absent; in
    # upsert and update modes an absent column is also left as it is in an existing row.
    tracked: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # Positions a row must hold a value at: the required columns, and in keyed modes the keys.
    _must_carry: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _key_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _generated: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _must_carry_of_carried: tuple[int, ...] | None = field(init=False, repr=False, compare=False)
    # Reads records' keys as key columns (key_source record_key, tombstones), by key_format.
    keys: KeyReader = field(init=False, repr=False, compare=False)
    # The key of a row that `carried_rows` gives.
    carried_key: Callable[[Row], Any] | None = field(
        init=False, default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # The value's columns first, then those the record fills: from its coordinates and
        # headers (`route.metadata`, and the key columns with key_source kafka), and from its
        # key (key_source record_key). A row is the value's decoded row with those after it.
        sources = record_sources(self.route)
        meta = tuple(c for c in sources if c in self.columns)
        object.__setattr__(self, "keys", KeyReader(self.route, schemas=self.schemas))
        field_of = value_fields(self.route, self.columns)
        values = tuple(c for c in self.columns if c in field_of and c not in sources)
        object.__setattr__(self, "columns", values + meta)
        object.__setattr__(
            self,
            "_meta",
            metadata_reader(
                sources,
                meta,
                binary=self.binaries,
                key_columns=self.route.key_columns,
                read_key=self.keys.read,
            ),
        )
        position = {name: i for i, name in enumerate(self.columns)}
        keys = tuple(position[c] for c in self.route.key_columns)
        # An update writes into rows that exist: a column a record lacks stays as it is there,
        # so none is required of it but the key.
        mode = self.route.mode
        required = tuple(position[c] for c in self.columns if c in self.required)
        required = () if mode == "update" else required
        keyed = mode in KEYED_MODES
        # Where a column a record lacks is left as it is in an existing row.
        merges = mode in ("upsert", "update")
        # A generated column is tracked too, so that a record carrying it can be told apart.
        fills = self.defaulted | self.generated
        tracked = values if merges else [c for c in values if c in fills]
        # The decoders read the value's fields by name: each column's field (`fields.rename`).
        named = [field_of[c] for c in values]
        tracked_fields = [field_of[c] for c in tracked]
        filled_fields = [field_of[c] for c in values if c in fills]
        # The fields that are not unknown: those that land, those a column of the record's
        # takes the name of, and those the route leaves out on purpose (all but `include`'s).
        known = None
        if self.route.fields.include is None:
            known = set(named) | set(sources) | set(self.route.fields.exclude)
        beyond = [c for c in values if c not in self.route.key_columns and c not in self.generated]
        rules = FieldRules(
            table=self.route.table,
            landing=named,
            beyond_key=[field_of[c] for c in beyond],
            known=known,
            unknown_fields=self.route.unknown_fields,
        )
        object.__setattr__(self, "fields_rules", rules)
        unwrap = self.route.unwrap == "debezium"
        object.__setattr__(
            self, "_unwrap", debezium_unwrapper(self.route.unwrap_fields) if unwrap else None
        )
        others = None if known is None else known - set(named)
        decoder: RowDecoder | AvroRowDecoder | RegistryJsonRowDecoder | ProtobufRowDecoder
        if self.route.value_format != "json" and self.schemas is None:
            raise ValueError(f"a {self.route.value_format} route needs the schema registry")
        if self.route.value_format in ("avro", "protobuf"):
            assert self.schemas is not None  # noqa: S101 - checked above
            # Both read each value into its columns' exact types, arrays included.
            kind = AvroRowDecoder if self.route.value_format == "avro" else ProtobufRowDecoder
            decoder = kind(
                named,
                schemas=self.schemas,
                tracked=tracked_fields,
                filled=filled_fields,
                arrays=[field_of[c] for c in values if c in self.arrays],
            )
            fix = None
        elif self.route.value_format == "json-schema":
            assert self.schemas is not None  # noqa: S101 - checked above
            decoder = RegistryJsonRowDecoder(
                named,
                schemas=self.schemas,
                tracked=tracked_fields,
                filled=filled_fields,
                others=others,
            )
            # JSON has no bytes: JSON Schema's (and Spark's to_json) are base64 text.
            fix = _json_fix(values, self.arrays, frozenset(), base64=self.binaries)
        else:
            decoder = RowDecoder(named, tracked=tracked_fields, filled=filled_fields, others=others)
            fix = _json_fix(values, self.arrays, self._epoch_columns())
        object.__setattr__(self, "decoder", decoder)
        steps = [
            field_conversions(self.route, self.columns, {c: field_of[c] for c in values}),
            fix,
            zone_conversion(self.route, self.columns, self.local_timestamps),
        ]
        fix = _chained([step for step in steps if step is not None])
        object.__setattr__(self, "_fix", fix)
        # In upsert and update modes the metadata columns are written like any other: tracked.
        tracked = [*tracked, *meta] if merges else tracked
        object.__setattr__(self, "tracked", tuple(position[c] for c in tracked))
        object.__setattr__(self, "_must_carry", tuple(dict.fromkeys(required + keys * keyed)))
        object.__setattr__(self, "_key_positions", keys)
        object.__setattr__(self, "_generated", tuple(position[c] for c in sorted(self.generated)))
        # Where the key and the columns a row must hold are among the carried columns. A key
        # the table fills (an identity) is not: a record that carries it is not decoded that way.
        carried = decoder.carried
        object.__setattr__(self, "_beyond_key", tuple((position[c], c in tracked) for c in beyond))
        # In a carried row a tracked column is always carried (its field is required there).
        beyond_carried = tuple(
            (carried.index(i), known) for i, known in self._beyond_key if i in carried
        )
        # Carried rows hold no column the table fills: with only such columns beyond the key,
        # none of them fills any, and they are not used.
        object.__setattr__(
            self, "_beyond_key_of_carried", beyond_carried if beyond_carried or not beyond else None
        )
        in_carried = [carried.index(i) if i in carried else None for i in self._must_carry]
        if None in in_carried or fix is not None or meta:
            object.__setattr__(self, "_must_carry_of_carried", None)
        else:
            object.__setattr__(self, "_must_carry_of_carried", tuple(in_carried))
            if keyed:  # then the key is among the columns a row must hold
                key = itemgetter(*(carried.index(i) for i in keys))
                object.__setattr__(self, "carried_key", key)

    def _epoch_columns(self) -> frozenset[str]:
        return self.timestamps if self.route.epoch_millis_timestamps else frozenset()

    def values(self, records: Sequence[Record]) -> list[Unwrapped]:
        """The records' values as the route reads them: as they are, or with `unwrap` each
        change event's row (bytes), a delete (None) or why it has none (a RecordError)."""
        values: list[bytes | None] = list(map(Message.value, records))
        if self._unwrap is None:
            return cast(list[Unwrapped], values)  # the same list: no copy a batch
        return list(map(self._unwrap, values))

    @property
    def unwraps(self) -> bool:
        """Whether `values` may hold a RecordError."""
        return self._unwrap is not None

    def prepare(self, records: Sequence[Record]) -> None:
        """Fetch what decoding the records' values needs from elsewhere (the writer schemas of
        registry-framed values): raises RegistryUnavailable when it cannot be had now."""
        if isinstance(self.decoder, AvroRowDecoder | RegistryJsonRowDecoder | ProtobufRowDecoder):
            # Tombstones (None) have no schema; filtered in C, not a step per record.
            self.decoder.prepare(filter(None, map(Message.value, records)))
        if self.keys.framed:  # a framed key's schema, fetched before the batch is written
            self.keys.prepare(filter(None, map(Message.key, records)))

    @property
    def identifier(self) -> sql.Identifier:
        """The table's name as it reaches SQL: quoted by psycopg, whatever it holds."""
        return sql.Identifier(self.schema, self.name)

    @property
    def qualified(self) -> str:
        return self.identifier.as_string()

    def row(self, raw: bytes, record: Record | None = None) -> Row:
        """A record value as a row of this table, or a RecordError naming what is wrong.
        `record` fills the metadata columns, if the route has any."""
        fields = self._fields_of(raw) if self.fields_rules.checks else None
        if fields is not None:
            verdict = self.fields_rules.judge(fields)
            if verdict.problem is not None:
                raise RecordError(verdict.problem)
            if verdict.ignored:
                self.left_out.note(verdict.ignored)
        row = self.decoder.decode(raw)
        if self._fix is not None:
            row = self._fix(row)
        if self._meta is not None:
            assert record is not None  # noqa: S101 - a route with metadata passes its records
            row += self._meta(record)
        for i in self._must_carry:
            if row[i] is None or row[i] is UNSET:
                raise RecordError(self._missing(row))
        for i in self._generated:  # empty unless the table has generated columns
            if row[i] is not UNSET:
                raise RecordError(
                    f"column {self.columns[i]} is generated by the table; a record cannot set it"
                )
        return row

    def rows(self, raws: list[bytes], records: Sequence[Record] = ()) -> list[Row] | None:
        """The rows of a batch of values, with no Python step per record (but the metadata
        columns', where the route has any, from `records`), or None when any of them is not a
        row of this table: `row` then tells, record by record, which and why. Fields that
        `unknown_fields: ignore` leaves out are counted here, a batch at a time."""
        left_out = self._shapes_left_out(raws)
        if left_out is None:
            return None
        rows = self.decoder.decode_all(raws)
        if rows is None and self.route.unknown_fields == "ignore":
            leaving_out = self._leaving_out(raws)
            if leaving_out is not None:
                left_out, rows = leaving_out
        if rows is None or _some_fill_none(rows, self._beyond_key):
            return None
        try:
            if self._fix is not None:
                rows = list(map(self._fix, rows))
            if self._meta is not None:
                if len(records) != len(rows):  # map() would stop at the shorter, silently
                    raise ValueError("a route with metadata columns needs every value's record")
                rows = list(map(add, rows, map(self._meta, records)))
        except RecordError:
            return None
        for i in self._must_carry:
            if count_of(rows, i, None) or count_of(rows, i, UNSET):
                return None
        for i in self._generated:
            if count_of(rows, i, UNSET) != len(rows):
                return None
        if left_out[0]:
            self.left_out.add(*left_out)
        return rows

    def carried_rows(self, raws: list[bytes]) -> tuple[list[str], list[Row]] | None:
        """When every value holds no column the table fills (a default, an identity, a
        generated column) and no key that is not a column, and in upsert and update modes
        every other column: those columns and the rows of just them, with no Python step per
        record. None otherwise, or when a required column or the key is null, for `rows`."""
        beyond_key = self._beyond_key_of_carried
        if self._must_carry_of_carried is None or beyond_key is None:
            return None
        if self._shapes_left_out(raws) != _NOTHING_LEFT_OUT:
            return None
        rows = self.decoder.decode_carried(raws)
        if rows is None or _some_fill_none(rows, beyond_key):
            return None
        for i in self._must_carry_of_carried:
            if count_of(rows, i, None):
                return None
        return self.names(self.decoder.carried), rows

    def _fields_of(self, raw: bytes) -> frozenset[str] | None:
        """A value's top-level fields: a JSON object's keys, or those of the writer schema or
        message it names; None when it is none of these (its decoding says why)."""
        if isinstance(self.decoder, AvroRowDecoder | ProtobufRowDecoder):
            assert self.schemas is not None  # noqa: S101 - such a decoder has them
            shapes = self.schemas.shapes([raw])
            return next(iter(shapes)) if len(shapes) == 1 else None
        if isinstance(self.decoder, RegistryJsonRowDecoder):
            if schema_id(raw) is None:
                return None
            raw = raw[HEADER:]
        keys = object_keys(raw)
        return None if keys is None else frozenset(keys)

    def _shapes_left_out(self, raws: list[bytes]) -> tuple[int, Counter[str]] | None:
        """For values read by writer schemas (Avro, Protobuf): None unless every schema's
        fields make rows, so that the batch is read in C with no check per record; then how
        many records have fields `unknown_fields: ignore` leaves out, and which, counted by
        schema (a schema whose values are of several messages is left to `row`). JSON's keys
        are checked as they are decoded (`RowDecoder`'s `others`, `_leaving_out`)."""
        if not isinstance(self.decoder, AvroRowDecoder | ProtobufRowDecoder):
            return _NOTHING_LEFT_OUT
        if not self.fields_rules.checks:
            return _NOTHING_LEFT_OUT
        assert self.schemas is not None  # noqa: S101 - such a decoder has them
        verdicts = [self.fields_rules.judge(s) for s in self.schemas.shapes(raws)]
        if any(v.problem is not None for v in verdicts):
            return None
        if not any(v.ignored for v in verdicts):
            return _NOTHING_LEFT_OUT
        by_head = Counter(map(_head, raws))  # a batch's values share a few headers
        first = {head: raw for raw in reversed(raws) if (head := raw[:HEADER]) in by_head}
        records, fields = 0, Counter[str]()
        for head, count in by_head.items():
            shape = next(iter(self.schemas.shapes([first[head]])), frozenset())
            if (
                isinstance(self.decoder, ProtobufRowDecoder)
                and len(self.schemas.shapes([r for r in raws if r[:HEADER] == head])) > 1
            ):
                return None  # of several messages: `row` counts them one by one
            ignored = self.fields_rules.judge(shape).ignored
            if ignored:
                records += count
                fields.update(dict.fromkeys(ignored, count))
        return records, fields

    def _leaving_out(self, raws: list[bytes]) -> tuple[tuple[int, Counter[str]], list[Row]] | None:
        """For JSON values with `unknown_fields: ignore`, when some carry keys that are not
        columns: their rows with those left out, and how many records had which left out, in
        C loops; None when some value is no row (`row` tells which)."""
        decoder = self.decoder
        if not isinstance(decoder, RowDecoder | RegistryJsonRowDecoder):
            return None
        bodies = raws if isinstance(decoder, RowDecoder) else decoder.bodies(raws)
        found = None if bodies is None else objects(bodies)
        left_out = None if found is None else self.fields_rules.left_out_of(found)
        if left_out is None:
            return None
        rows = decoder.decode_all_leaving_out(raws)
        return None if rows is None else (left_out, rows)

    def _missing(self, row: Row) -> str:
        def lacking(names: Iterable[str]) -> list[str]:
            values = [(c, row[self.columns.index(c)]) for c in names]
            return sorted(c for c, value in values if value is None or value is UNSET)

        required = lacking(self.required) if self.route.mode != "update" else []
        if required:
            return f"missing required column(s) {', '.join(required)}"
        return f"value lacks key column(s) {', '.join(lacking(self.route.key_columns))}"

    def key(self, row: Row) -> tuple[Any, ...]:
        """The row's key columns, comparable with a tombstone's decoded key."""
        return tuple(as_cell(row[i]) for i in self._key_positions)

    def distinct_keys(self, rows: list[Row]) -> bool:
        """Whether no two rows have the same key, found in C loops; False also when a key holds
        a nested value (unhashable), for the caller to compare the keys one by one."""
        try:
            return len(set(map(itemgetter(*self._key_positions), rows))) == len(rows)
        except TypeError:
            return False

    def names(self, positions: Iterable[int]) -> list[str]:
        return [self.columns[i] for i in positions]


# The record's coordinates, and the Spark sink's provenance headers, by metadata source.
_COORDINATES: dict[str, Callable[[Message], Any]] = {
    "topic": Message.topic,
    "partition": Message.partition,
    "offset": Message.offset,
}
_PROVENANCE = {"spark.query": PROVENANCE_QUERY, "spark.partition": PROVENANCE_PARTITION,
               "spark.epoch": PROVENANCE_EPOCH}  # fmt: skip


# The source of a key column that key_source record_key fills from the record's key.
KEY_FIELD = "record_key"


_NOTHING_LEFT_OUT: tuple[int, Counter[str]] = (0, Counter())
_head = itemgetter(slice(0, HEADER))  # a registry-framed value's magic byte and schema id


def _some_fill_none(rows: list[Row], beyond_key: tuple[tuple[int, bool], ...]) -> bool:
    """Whether some row may be of a record that fills none of the columns beyond the key, at
    the positions `beyond_key` (each with whether absent is UNSET there, null then being
    carried; elsewhere absent and null are both None): in C loops, column by column, until a
    column every row carries (as almost every batch's first); else row by row. A row with
    only nulls there may be of a record that carries those fields as null: `row` tells."""
    if not beyond_key:
        return False
    for i, tracked in beyond_key:
        if not count_of(rows, i, UNSET) and (tracked or not count_of(rows, i, None)):
            return False
    return any(
        all(row[i] is UNSET or (row[i] is None and not tracked) for i, tracked in beyond_key)
        for row in rows
    )


def record_sources(route: RouteSettings) -> dict[str, str]:
    """The columns a route fills from the record rather than its value, by source: its
    metadata columns, and its key columns where key_source is kafka (the coordinates) or
    record_key (the key's fields), those last."""
    sources = dict(route.metadata)
    if route.key_source == "kafka":
        sources.update(zip(route.key_columns, ("topic", "partition", "offset"), strict=True))
    elif route.key_source == "record_key":
        sources.update(dict.fromkeys(route.key_columns, KEY_FIELD))
    return sources


def value_fields(route: RouteSettings, columns: Sequence[str]) -> dict[str, str]:
    """Each column the value fills, with the value's field that fills it: the field of the
    same name unless `fields` renames another field to it, renames this one away, or leaves
    it out."""
    rename, rules = route.fields.rename, route.fields
    of_column = {c: c for c in columns if c not in rename}
    of_column.update({column: source for source, column in rename.items()})
    return {c: f for c, f in of_column.items() if c in columns and rules.takes(f)}


def metadata_reader(
    sources: dict[str, str],
    columns: Sequence[str],
    *,
    binary: frozenset[str],
    key_columns: tuple[str, ...] = (),
    read_key: Callable[[bytes | None], tuple[Any, ...]] | None = None,
) -> Callable[[Record], Row] | None:
    """The values of the metadata `columns` of a record, each from its source (see
    `RouteSettings.metadata`): a key or a header as bytes for a bytea column, else as text
    (RecordError when it is not UTF-8); a timestamp as an aware datetime. Columns whose source
    is KEY_FIELD come last, all of them from one decoding of the record's key
    (`read_key`, by default `rows.decode_key` by `key_columns`). None when there are no such
    columns."""
    if not columns:
        return None
    from_key = tuple(c for c in key_columns if c in columns and sources[c] == KEY_FIELD)

    def by_key(key: bytes) -> tuple[Any, ...]:
        return read_key(key) if read_key is not None else decode_key(key, from_key)

    if columns[len(columns) - len(from_key) :] != from_key:
        raise ValueError("the columns of the record's key must come last")
    getters: list[Callable[[Record], Any]] = []
    for column in columns[: len(columns) - len(from_key)]:
        source = sources[column]
        header = _PROVENANCE.get(source) or source.removeprefix("header:")
        if source in _COORDINATES:
            getters.append(_COORDINATES[source])
        elif source == "timestamp":
            getters.append(_record_time)
        elif source == "key":
            getters.append(_as_column(Message.key, column, column in binary))
        else:
            getters.append(_as_column(_header(header), column, column in binary))

    if from_key:

        def read_with_key(record: Record) -> Row:
            key = record.key()
            if key is None:
                raise RecordError("the record has no key, which key_source record_key reads")
            return tuple(get(record) for get in getters) + by_key(key)

        return read_with_key

    def read(record: Record) -> Row:
        return tuple(get(record) for get in getters)

    return read


def _record_time(record: Record) -> datetime | None:
    kind, millis = record.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE:
        return None
    return _EPOCH + timedelta(milliseconds=millis)


def _header(name: str) -> Callable[[Record], bytes | None]:
    def value(record: Record) -> bytes | None:
        found = None
        headers = record.headers() or ()
        # A consumed record's headers are a list of pairs (a dict only when producing).
        for key, data in cast(list[tuple[str, Any]], headers):
            if key == name:
                found = data  # the last of a repeated header, as Kafka's lastHeader
        return found

    return value


def _as_column(read: Callable[[Record], Any], column: str, binary: bool) -> Callable[[Record], Any]:
    if binary:
        return read

    def text(record: Record) -> str | None:
        data = read(record)
        if data is None or isinstance(data, str):
            return data
        try:
            return bytes(data).decode()
        except UnicodeDecodeError:
            raise RecordError(f"column {column}: not UTF-8 text") from None

    return text


def _chained(steps: list[Callable[[Row], Row]]) -> Callable[[Row], Row] | None:
    """The steps one after the other; None for none, the one step for one."""
    if len(steps) <= 1:
        return steps[0] if steps else None

    def chained(row: Row) -> Row:
        for step in steps:
            row = step(row)
        return row

    return chained


def _json_fix(
    columns: tuple[str, ...],
    arrays: frozenset[str],
    epoch_millis: frozenset[str],
    *,
    base64: frozenset[str] = frozenset(),
) -> Callable[[Row], Row] | None:
    """What a JSON row needs before COPY: a list bound for an array column as an array (else
    it goes as JSON text, which an array column refuses), with `epoch_millis_timestamps` an
    integer bound for a timestamp column as the instant it counts from 1970 in ms, and a string
    bound for a `base64` column as the bytes it encodes."""
    to_array = [i for i, c in enumerate(columns) if c in arrays]
    to_instant = [i for i, c in enumerate(columns) if c in epoch_millis]
    to_bytes = [i for i, c in enumerate(columns) if c in base64]
    if not to_array and not to_instant and not to_bytes:
        return None

    def fix(row: Row) -> Row:
        values = list(row)
        for i in to_array:
            if isinstance(values[i], list):
                values[i] = ArrayValue(values[i])
        for i in to_instant:
            value = values[i]
            if isinstance(value, int) and not isinstance(value, bool):
                try:
                    values[i] = _EPOCH + timedelta(milliseconds=value)
                except OverflowError:
                    raise RecordError(
                        f"column {columns[i]}: {value} ms from 1970 is out of range"
                    ) from None
        for i in to_bytes:
            if isinstance(values[i], str):
                try:
                    values[i] = b64decode(values[i], validate=True)
                except binascii.Error:
                    raise RecordError(f"column {columns[i]}: not base64 text") from None
        return tuple(values)

    return fix


def reflect_target(
    engine: Engine, route: RouteSettings, index: int, *, schemas: SchemaCache | None = None
) -> Target:
    """Refuse at start-up a route whose table or key columns do not exist, or whose upsert has
    no unique key to go by or goes by a generated column."""
    path = f"consumer.routes.{index}"
    named_schema, name = split_table(route.table)
    schema = named_schema or "public"
    try:
        table = Table(str(name), MetaData(), schema=str(schema), autoload_with=engine)
    except NoSuchTableError:
        raise ConfigError([(f"{path}.table", f"table {route.table!r} does not exist")]) from None
    # SQLAlchemy's names are a str subclass (quoted_name); the decoder's keys must be plain str.
    columns = tuple(str(c.name) for c in table.columns)
    absent = [c for c in route.metadata if c not in columns]
    if absent:
        raise ConfigError(
            [(f"{path}.metadata.{c}", f"{route.table} has no column {c}") for c in absent]
        )
    unknown = [c for c in route.key_columns if c not in columns]
    if unknown:
        raise ConfigError(
            [(f"{path}.key_columns", f"{route.table} has no column {', '.join(unknown)}")]
        )
    if route.mode in UNIQUE_KEY_MODES and not _has_unique(engine, schema, name, route.key_columns):
        raise ConfigError(
            [(f"{path}.key_columns", f"{route.table} has no primary key or unique constraint "
              f"on ({', '.join(route.key_columns)}), which {route.mode} needs")]
        )  # fmt: skip
    generated = frozenset(str(c.name) for c in table.columns if c.computed is not None)
    generated_keys = sorted(generated.intersection(route.key_columns))
    if route.mode in KEYED_MODES and generated_keys:
        raise ConfigError(
            [(f"{path}.key_columns", f"{', '.join(generated_keys)} is generated by "
              f"{route.table}: records cannot carry it as a key")]
        )  # fmt: skip
    _check_rights(engine, route, schema, name)
    # SQLAlchemy reports a generated column's expression as its server default too.
    with_default = [c for c in table.columns if c.server_default is not None or _is_identity(c)]
    defaulted = frozenset(str(c.name) for c in with_default) - generated
    not_null = frozenset(str(c.name) for c in table.columns if not c.nullable)
    required = not_null - defaulted - generated
    _check_fields(route, path, columns, required)
    return Target(
        route=route,
        schema=schema,
        name=name,
        columns=columns,
        required=required,
        defaulted=defaulted,
        generated=generated,
        arrays=frozenset(str(c.name) for c in table.columns if isinstance(c.type, ARRAY)),
        timestamps=frozenset(str(c.name) for c in table.columns if isinstance(c.type, DateTime)),
        local_timestamps=frozenset(
            str(c.name)
            for c in table.columns
            if isinstance(c.type, DateTime) and not c.type.timezone
        ),
        binaries=frozenset(str(c.name) for c in table.columns if isinstance(c.type, LargeBinary)),
        schemas=schemas,
    )


def _check_fields(
    route: RouteSettings, path: str, columns: tuple[str, ...], required: frozenset[str]
) -> None:
    """Refuse at start-up `fields` that name a column the table lacks, or that leave no field
    for a key column or a column every new row needs: each of its records would be refused."""
    rules, problems = route.fields, []
    for source, column in rules.rename.items():
        if column not in columns:
            problems.append(
                (f"{path}.fields.rename.{source}", f"{route.table} has no column {column}")
            )
    for source in rules.include or ():
        column = rules.rename.get(source, source)
        if column not in columns:
            problems.append((f"{path}.fields.include", f"{route.table} has no column {column}"))
    landing = set(value_fields(route, columns).values())
    for setting, named in (("cast", rules.cast), ("timestamps", rules.timestamps)):
        for source in named:
            if source not in landing:
                column = rules.rename.get(source, source)
                problems.append(
                    (f"{path}.fields.{setting}.{source}", f"{route.table} has no column {column}")
                )
    filled = set(value_fields(route, columns)) | set(record_sources(route))
    keys = [c for c in route.key_columns if c not in filled]
    if keys:
        problems.append((f"{path}.fields", f"no field fills key column(s) {', '.join(keys)}"))
    needed = [] if route.mode == "update" else sorted(required - filled - set(keys))
    if needed:
        problems.append(
            (f"{path}.fields", f"no field fills {', '.join(needed)}, which {route.table} "
             "needs in every row (NOT NULL without a default)")
        )  # fmt: skip
    if problems:
        raise ConfigError(problems)


def _check_rights(engine: Engine, route: RouteSettings, schema: str, name: str) -> None:
    """Refuse at start-up, naming the grant, a table the role may not write: found later, it
    would stop the first batch instead."""
    qualified = sql.Identifier(schema, name).as_string()
    with engine.connect() as conn:
        role = conn.execute(text("SELECT current_user")).scalar()
        missing = [
            right
            for right in table_rights(route.mode, deletes=bool(route.key_columns))
            if not conn.execute(
                text("SELECT has_table_privilege(:table, :right)"),
                {"table": qualified, "right": right},
            ).scalar()
        ]
    if missing:
        raise PermissionMissing(
            f"role {role!r} may not {', '.join(missing)} on {route.table}, which its "
            f'{route.mode} route needs: GRANT {", ".join(missing)} ON {qualified} TO "{role}"'
        )


def _is_identity(column: Any) -> bool:
    return column.identity is not None or (column.autoincrement is True and column.primary_key)


def _has_unique(engine: Engine, schema: str, name: str, keys: tuple[str, ...]) -> bool:
    inspector = inspect(engine)
    wanted = set(keys)
    primary = inspector.get_pk_constraint(name, schema=schema).get("constrained_columns") or []
    if set(primary) == wanted:
        return True
    for constraint in inspector.get_unique_constraints(name, schema=schema):
        if set(constraint["column_names"]) == wanted:
            return True
    return any(
        index.get("unique") and set(c for c in index["column_names"] if c) == wanted
        for index in inspector.get_indexes(name, schema=schema)
    )
