"""Tables that follow their records' writer schemas (`auto_create`, `auto_evolve`).

Before a batch is planned, each writer schema its records name that the table has not been checked
against is compared with the table's columns (`consumers.tables.table_types` maps an Avro
record's fields, `consumers.tables.json_schema_types` a JSON Schema's properties,
`consumers.tables.proto_types` the fields of the Protobuf message the records' indexes name):

- no table, with `auto_create`: `CREATE TABLE` from the schema, the route's key columns as its
  primary key;
- a field with no column, with `auto_evolve`: `ADD COLUMN` (nullable);
- a field whose column is of another kind, a new field that is required and has no default, a
  key column or a NOT NULL column without a default that the schema has no field for: a
  `TableMismatch` naming the field, the table's type and the schema's type. The batch waits
  (`/readyz` says why), nothing is dead-lettered or skipped, and the table is read again before
  the next try, so that fixing it by hand lets the records through.

The statements run first in the batch's own transaction, after an advisory lock on the table's
name, so that the change commits with the rows and the offset advance or not at all, and two
members meeting the same schema at once change the table once (`ADD COLUMN IF NOT EXISTS` under
the lock). They go with every batch of the topic until one commits; then the table is known to
have them. A batch that finds the table other than this member knew it (`DRIFT`: created, or
without a column, by another member meanwhile) is refused as a whole, and the table read again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import psycopg
from confluent_kafka import Message
from psycopg import sql
from sqlalchemy import Engine

from bridge.errors import BridgeError, ConfigError, PermissionMissing
from bridge.settings import FieldSettings, RouteSettings
from bridge.topic_patterns import split_table
from consumers.decoding.proto_schemas import ProtoError, ProtoSchema, read_indexes
from consumers.decoding.registry_schemas import AVRO, JSON, SchemaCache, schema_id
from consumers.tables.applier import Step
from consumers.tables.conversions import CAST_COLUMNS, TIMESTAMP_COLUMNS
from consumers.tables.json_schema_types import json_schema_columns
from consumers.tables.proto_types import proto_columns
from consumers.tables.table_types import FieldColumn, field_columns
from consumers.tables.targets import Target, reflect_target

log = logging.getLogger("bridge.consumer")

# The first key of the advisory locks that serialize bridge's changes to one table: "brdg".
DDL_LOCK_CLASS = 0x62726467


# What a batch meets when a followed table changed under this member.
DRIFT = (psycopg.errors.DuplicateTable, psycopg.errors.UndefinedColumn)


class TableMismatch(BridgeError):
    """A writer schema the table cannot take by adding a column: the batch waits."""

    writer: int | None = None  # the writer schema's id, when one schema is at fault
    topic: str | None = None  # the topic whose records do not fit, once the planner knows it

    # The partitions of the topic whose records were written with the schema at fault, once
    # the planner knows them (None: every partition of the batch's records of the topic).
    partitions: frozenset[int] | None = None

    def first_record(self, records: Sequence[Message]) -> Message | None:
        """The first of `records` written with the schema at fault, for the reason to name."""
        found = self._at_fault(records)
        return found[0] if found else None

    def partitions_at_fault(self, records: Sequence[Message]) -> frozenset[int] | None:
        """The partitions of `records` that hold one written with the schema at fault; None
        when no one schema is at fault (then every partition waits)."""
        found = self._at_fault(records)
        return frozenset(cast(int, r.partition()) for r in found) if found else None

    def _at_fault(self, records: Sequence[Message]) -> list[Message]:
        if self.writer is None:
            return []
        return [
            record
            for record in records
            if (value := record.value()) is not None and schema_id(_head(value)) == self.writer
        ]


@dataclass(frozen=True)
class TableColumn:
    name: str
    sql_type: str  # format_type()
    kind: str  # pg_type.typcategory
    element_kind: str  # an array's element typcategory; "" for other types
    not_null: bool
    has_default: bool  # a default or an identity
    generated: bool


_DESCRIBE = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory,
       coalesce(e.typcategory, ''), a.attnotnull,
       (a.atthasdef AND a.attgenerated = '') OR a.attidentity <> '', a.attgenerated <> ''
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
WHERE a.attrelid = %(table)s::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def describe(conn: psycopg.Connection[Any], qualified: str) -> list[TableColumn] | None:
    """The table's columns in order, or None when there is no such table."""
    if conn.execute("SELECT to_regclass(%s)", [qualified]).fetchone() == (None,):
        return None
    return [TableColumn(*row) for row in conn.execute(_DESCRIBE, {"table": qualified})]


def target_of(
    route: RouteSettings, schema: str, name: str, columns: list[TableColumn], schemas: SchemaCache
) -> Target:
    """The Target of a table as `describe` (or the planned change) has it."""
    return Target(
        route=route,
        schema=schema,
        name=name,
        columns=tuple(c.name for c in columns),
        required=frozenset(
            c.name for c in columns if c.not_null and not c.has_default and not c.generated
        ),
        defaulted=frozenset(c.name for c in columns if c.has_default),
        generated=frozenset(c.name for c in columns if c.generated),
        arrays=frozenset(c.name for c in columns if c.kind == "A"),
        timestamps=frozenset(c.name for c in columns if c.sql_type.startswith("timestamp")),
        local_timestamps=frozenset(
            c.name for c in columns if c.sql_type.startswith("timestamp without")
        ),
        binaries=frozenset(c.name for c in columns if c.sql_type == "bytea"),
        schemas=schemas,
    )


def fits(column: TableColumn, field: FieldColumn) -> bool:
    """Whether the field's values go into the column as they are (see `table_types`)."""
    if field.kind == "S" and column.kind in ("S", "E"):  # text, or a PostgreSQL enum
        return True
    if field.kind != column.kind:
        return False
    if field.kind == "A":
        return column.element_kind == _element_kind(field.sql_type)
    if field.kind == "U":
        json = ("jsonb", "json")
        return column.sql_type == field.sql_type or (
            field.sql_type in json and column.sql_type in json
        )
    return True


def _element_kind(array_type: str) -> str:
    element = array_type.removesuffix("[]")
    if element.startswith(("numeric", "integer", "bigint", "real", "double")):
        return "N"
    if element.startswith(("date", "time")):
        return "D"
    return {"boolean": "B", "text": "S", "bytea": "U", "uuid": "U", "interval": "T"}[element]


def follow_table(
    engine: Engine,
    route: RouteSettings,
    index: int,
    schemas: SchemaCache,
    connect: Callable[[], psycopg.Connection[Any]],
) -> TableFollower:
    """At start-up: the route's table checked as any route's is (`reflect_target`), or, when
    it does not exist yet, refused unless `auto_create` is on and the role may create it."""
    named_schema, name = split_table(route.table)
    schema = str(named_schema or "public")
    qualified = sql.Identifier(schema, name).as_string()
    with connect() as conn:
        found = conn.execute("SELECT current_user").fetchone()
        role = str(found[0]) if found else "?"
        columns = describe(conn, qualified)
        if columns is None:
            if not route.auto_create:
                raise ConfigError(
                    [(f"consumer.routes.{index}.table", f"table {route.table!r} does not exist")]
                )
            exists = conn.execute("SELECT to_regnamespace(%s)", [schema]).fetchone()
            if exists == (None,):
                raise ConfigError(
                    [(f"consumer.routes.{index}.table", f"schema {schema!r} does not exist")]
                )
            may = conn.execute("SELECT has_schema_privilege(%s, 'CREATE')", [schema]).fetchone()
            if may != (True,):
                raise PermissionMissing(
                    f"role {role!r} may not create {route.table}, which auto_create needs: "
                    f'GRANT CREATE ON SCHEMA {sql.Identifier(schema).as_string()} TO "{role}"'
                )
        elif route.auto_evolve:
            owns = conn.execute(
                "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = %s::regclass",
                [qualified],
            ).fetchone()
            if owns != (True,):
                raise PermissionMissing(
                    f"role {role!r} does not own {route.table}, and only its "
                    "owner may ALTER it, which auto_evolve needs"
                )
    if columns is not None:
        reflect_target(engine, route, index, schemas=schemas)  # the checks of any route

    def read() -> list[TableColumn] | None:
        with connect() as conn:
            return describe(conn, qualified)

    return TableFollower(route=route, schemas=schemas, columns=columns, read=read)


class TableFollower:
    """One auto route's table, kept in step with its records' writer schemas."""

    def __init__(
        self,
        *,
        route: RouteSettings,
        schemas: SchemaCache,
        columns: list[TableColumn] | None,
        read: Callable[[], list[TableColumn] | None],
    ) -> None:
        """`columns`: the table as described at start-up (None: it does not exist yet);
        `read`: the table as it is now (`describe` on a connection of its own), read again
        after a mismatch or a drift, and while it does not exist."""
        self.route = route
        schema, name = split_table(route.table)
        self._schema, self._name = str(schema or "public"), str(name)
        self._identifier = sql.Identifier(self._schema, self._name)
        self._schemas = schemas
        self._read = read
        self._columns = columns  # the table as it is once `pending` commits
        self._checked: set[int] = set()  # writer ids the table (with `pending`) takes
        self._changes: list[Step] = []  # this table's changes that no batch has committed yet
        self._stale = False  # a mismatch was found: read the table again before trusting it
        # key_source record_key: the key columns as the keys' writer schemas type them.
        self._keyed_by_record = route.key_source == "record_key"
        self._key_fields: dict[str, FieldColumn] = {}
        self.target: Target | None = self._target()

    @property
    def qualified(self) -> str:
        return self._identifier.as_string()

    @property
    def pending(self) -> list[Step]:
        """The changes no batch has committed yet, after the lock on the table's name."""
        return self.pending_after([])

    def pending_after(self, sent: Sequence[Step]) -> list[Step]:
        """The changes no batch has committed yet but those among `sent` (a batch in flight
        makes them), after the lock on the table's name whenever any is left."""
        changes = [step for step in self._changes if step not in sent]
        if not changes:
            return []
        lock = sql.SQL("SELECT pg_advisory_xact_lock({}, hashtext({}))").format(
            sql.Literal(DDL_LOCK_CLASS), sql.Literal(self.qualified)
        )
        return [Step(lock), *changes]

    def placeholder(self) -> Target:
        """The Target of a table not created yet: no record of a schema that creates it can be
        a row of it, so every record planned against it is a dead letter naming why."""
        return Target(
            route=self.route,
            schema=self._schema,
            name=self._name,
            columns=self.route.key_columns,
            required=frozenset(),
            schemas=self._schemas,
        )

    def follow(self, values: list[bytes], keys: Sequence[bytes] = ()) -> list[Step]:
        """Fetch the writer schemas of `values` (RegistryUnavailable when the registry cannot
        answer) and check them against the table; the changes a batch of them must make
        first. Raises TableMismatch. With `key_source: record_key`, the key columns of a table
        it creates come from the writer schemas of the records' `keys`."""
        self._schemas.prepare(values)
        if self._keyed_by_record:
            self._schemas.prepare(keys)
            self._learn_keys(keys)
        # Not there yet as far as this member knows: another member may have created it since.
        if self._stale or self._columns is None:
            self._read_again()
        writers = {i for i in map(schema_id, set(map(_head, values))) if i is not None}
        for writer in sorted(writers - self._checked):
            fields = self._fields_of(writer, self.route.value_format, values)
            if fields is None:
                continue  # its records are dead letters naming why (consumers.decoding)
            try:
                self._take(writer, self._as_columns(fields))
            except TableMismatch as exc:
                self._stale = True
                exc.writer = writer
                raise
            self._checked.add(writer)
        return list(self.pending)

    def committed(self, steps: list[Step]) -> None:
        """A batch that made `steps` committed: the table has them."""
        self._changes = [step for step in self._changes if step not in steps]

    def drifted(self) -> None:
        """A batch found the table other than this member knew it (another member created or
        changed it meanwhile): read it again before the next one."""
        self._stale = True

    def _read_again(self) -> None:
        try:
            self._columns = self._read()
        except psycopg.OperationalError as exc:
            raise TableMismatch(f"{self.route.table} could not be read again: {exc}") from None
        self._checked.clear()
        self._changes = []
        if self._stale:
            log.info("table %s read again", self.route.table)
        self._stale = False
        self.target = self._target()

    def _target(self) -> Target | None:
        if self._columns is None:
            return None
        return target_of(self.route, self._schema, self._name, self._columns, self._schemas)

    def _as_columns(self, fields: list[FieldColumn]) -> list[FieldColumn]:
        """The schema's fields as the route's `fields` make them columns (Kafka Connect's
        ReplaceField): those it takes, each under its column's name."""
        chosen = self.route.fields
        return [
            _converted(
                chosen, replace(field, name=chosen.rename.get(field.name, field.name)), field
            )
            for field in fields
            if chosen.takes(field.name)
        ]

    def _learn_keys(self, keys: Sequence[bytes]) -> None:
        """The key columns' types from the keys' writer schemas (an Avro record holding them,
        or for one key column any Avro type), for a table still to be created."""
        if self._columns is not None or len(self._key_fields) == len(self.route.key_columns):
            return
        if self.route.key_format == "string":  # one key column, of the key's text
            (column,) = self.route.key_columns
            self._key_fields[column] = FieldColumn(column, "text", "S", False, False)
            return
        for writer in sorted({i for i in map(schema_id, set(map(_head, keys))) if i is not None}):
            schema = self._schemas.schemas.get(writer)
            fields = self._fields_of(writer, self.route.key_format, keys)
            one, kind = len(self.route.key_columns) == 1, self._format_of(writer)
            if fields is not None:
                found = {f.name: f for f in fields}
            elif one and self.route.key_format == "avro" and kind == AVRO:
                wrapped = {"type": "record", "name": "key", "fields": [
                    {"name": self.route.key_columns[0], "type": schema}]}  # fmt: skip
                found = {f.name: f for f in field_columns(wrapped)}
            elif one and self.route.key_format == "json-schema" and kind == JSON:
                column = self.route.key_columns[0]
                wrapped_json: dict[str, Any] = {
                    "type": "object", "properties": {column: schema}, "required": [column]
                }  # fmt: skip
                found = {f.name: f for f in json_schema_columns(wrapped_json) or ()}
            else:
                continue  # such keys are refused record by record (consumers.decoding.record_keys)
            for column in self.route.key_columns:
                if column in found:
                    self._key_fields.setdefault(column, found[column])

    def _format_of(self, writer: int) -> str | None:
        return self._schemas.types.get(writer) if writer in self._schemas.schemas else None

    def _fields_of(
        self, writer: int, wire_format: str, raws: Sequence[bytes]
    ) -> list[FieldColumn] | None:
        """A writer schema's fields as columns: an Avro record's on an avro route, a JSON
        Schema object's on a json-schema one, on a protobuf one the fields of the messages
        `raws` (those of `writer`) are; None for any other (its records are not rows of this
        table)."""
        schema = self._schemas.schemas.get(writer)
        kind = self._format_of(writer)
        if wire_format == "avro" and kind == AVRO:
            if isinstance(schema, dict) and schema.get("type") == "record":
                return field_columns(schema)
        elif wire_format == "json-schema" and kind == JSON:
            return json_schema_columns(schema)
        elif wire_format == "protobuf" and isinstance(schema, ProtoSchema):
            return _message_columns(schema, writer, raws)
        return None

    def _take(self, writer: int, fields: list[FieldColumn]) -> None:
        """Check one writer schema; plan the change it needs, or raise TableMismatch."""
        where = f"table {self.route.table}, schema id {writer}"
        if self._keyed_by_record:  # the key columns come from the key, not the value
            fields = [f for f in fields if f.name not in self.route.key_columns]
            if self._columns is None:
                missing = [k for k in self.route.key_columns if k not in self._key_fields]
                if missing:
                    raise TableMismatch(
                        f"{where}: key column(s) {', '.join(missing)} are in no key's writer "
                        "schema yet (key_source record_key): the table is created from the "
                        "first records whose keys carry them"
                    )
                fields = [self._key_fields[k] for k in self.route.key_columns] + fields
        by_name = {f.name: f for f in fields}
        missing_keys = [k for k in self.route.key_columns if k not in by_name]
        if missing_keys and not self._keyed_by_record:
            raise TableMismatch(
                f"{where}: key column(s) {', '.join(missing_keys)} have no field in the schema"
            )
        if self._columns is None:
            if not self.route.auto_create:
                raise TableMismatch(f"{self.route.table} does not exist and auto_create is off")
            self._create(writer, fields)
            return
        table = {c.name: c for c in self._columns}
        for column in self._columns:
            field = by_name.get(column.name)
            if field is None and self._keyed_by_record and column.name in self.route.key_columns:
                continue  # filled from the record's key
            if field is None:
                if column.not_null and not column.has_default and not column.generated:
                    raise TableMismatch(
                        f"{where}: column {column.name} ({column.sql_type} NOT NULL, no "
                        "default) has no field in the schema"
                    )
            elif not fits(column, field):
                raise TableMismatch(
                    f"{where}: field {field.name} is {field.sql_type} in the schema, "
                    f"{column.sql_type} in the table"
                )
        added = [f for f in fields if f.name not in table]
        if not added or not self.route.auto_evolve:
            return  # fields that are not columns: left out, and reported (Committer)
        required = [f for f in added if f.required]
        if required:
            raise TableMismatch(
                f"{where}: new field(s) {', '.join(f.name for f in required)} are required "
                "and have no default, which existing rows cannot have"
            )
        self._alter(writer, added)

    def _create(self, writer: int, fields: list[FieldColumn]) -> None:
        keys = set(self.route.key_columns)
        definitions = [
            sql.SQL("{} {}{}").format(
                sql.Identifier(f.name),
                sql.SQL(f.sql_type),  # from consumers.tables.table_types' table, not from input
                sql.SQL("" if f.nullable and f.name not in keys else " NOT NULL"),
            )
            for f in fields
        ]
        if self.route.key_columns:
            definitions.append(
                sql.SQL("PRIMARY KEY ({})").format(
                    sql.SQL(", ").join(map(sql.Identifier, self.route.key_columns))
                )
            )
        # Not IF NOT EXISTS: a table another member created meanwhile, maybe from another
        # schema version, fails the batch (DuplicateTable), which reads it again and retries.
        self._plan(
            sql.SQL("CREATE TABLE {} ({})").format(
                self._identifier, sql.SQL(", ").join(definitions)
            ),
            [_column(f, not_null=not f.nullable or f.name in keys) for f in fields],
            f"creates {self.route.table} from schema id {writer}",
        )

    def _alter(self, writer: int, added: list[FieldColumn]) -> None:
        statement = sql.SQL("ALTER TABLE {} {}").format(
            self._identifier,
            sql.SQL(", ").join(
                sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(
                    sql.Identifier(f.name), sql.SQL(f.sql_type)
                )
                for f in added
            ),
        )
        assert self._columns is not None  # noqa: S101 - altering an existing table
        self._plan(
            statement,
            self._columns + [_column(f, not_null=False) for f in added],
            f"adds {', '.join(f'{f.name} {f.sql_type}' for f in added)} to {self.route.table} "
            f"for schema id {writer}",
        )

    def _plan(self, statement: sql.Composed, columns: list[TableColumn], what: str) -> None:
        self._changes.append(Step(statement))
        self._columns = columns
        self.target = self._target()
        log.info("the next batch %s", what)


def _converted(chosen: FieldSettings, column: FieldColumn, field: FieldColumn) -> FieldColumn:
    """A field's `column` with the type of what its values become where the route converts
    them (`fields.cast`, `fields.timestamps`), as Connect's dialect creates it."""
    if field.name in chosen.cast:
        sql_type, kind = CAST_COLUMNS[chosen.cast[field.name]]
    elif field.name in chosen.timestamps:
        sql_type, kind = TIMESTAMP_COLUMNS[chosen.timestamps[field.name].type]
    else:
        return column
    return replace(column, sql_type=sql_type, kind=kind)


def _column(field: FieldColumn, *, not_null: bool) -> TableColumn:
    element = _element_kind(field.sql_type) if field.kind == "A" else ""
    return TableColumn(field.name, field.sql_type, field.kind, element, not_null, False, False)


def _head(value: bytes) -> bytes:
    return value[:5]


def _message_columns(
    schema: ProtoSchema, writer: int, raws: Sequence[bytes]
) -> list[FieldColumn] | None:
    """The columns of the messages of `schema` that the values of `writer` among `raws` are
    (their message indexes choose them: most often the first message alone), each field once;
    None when none of them names a message the schema has (they are dead letters, naming why)."""
    head = writer.to_bytes(4, "big")
    paths: set[tuple[int, ...]] = set()
    for raw in raws:
        if raw is not None and raw[1:5] == head:
            with contextlib.suppress(ProtoError):
                paths.add(read_indexes(raw, 5)[0])
    columns: dict[str, FieldColumn] = {}
    for path in sorted(paths):
        try:
            message = schema.message(path)
        except ProtoError:
            continue
        for column in proto_columns(message):
            columns.setdefault(column.name, column)
    return list(columns.values()) if columns else None
