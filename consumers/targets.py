"""The user's target tables: reflected at start-up and checked against the routes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, MetaData, Table, inspect
from sqlalchemy.exc import NoSuchTableError

from bridge.errors import ConfigError
from bridge.settings import RouteSettings
from consumers.records import RecordError
from consumers.rows import UNSET, Row, RowDecoder, as_cell


@dataclass(frozen=True, kw_only=True)
class Target:
    route: RouteSettings
    schema: str
    name: str
    columns: tuple[str, ...]
    required: frozenset[str]  # NOT NULL without a default: a record must carry them
    defaulted: frozenset[str] = frozenset()  # with a default or an identity
    decoder: RowDecoder = field(init=False, repr=False, compare=False)
    # Where absent must stay apart from null: a column with a default takes it when absent; in
    # upsert mode an absent column is also left as it is in an existing row.
    tracked: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # Positions a row must hold a value at: the required columns, and in upsert mode the keys.
    _must_carry: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _key_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        position = {name: i for i, name in enumerate(self.columns)}
        keys = tuple(position[c] for c in self.route.key_columns)
        required = tuple(position[c] for c in self.columns if c in self.required)
        upsert = self.route.mode == "upsert"
        tracked = self.columns if upsert else [c for c in self.columns if c in self.defaulted]
        object.__setattr__(self, "decoder", RowDecoder(self.columns, tracked=tracked))
        object.__setattr__(self, "tracked", tuple(position[c] for c in tracked))
        object.__setattr__(self, "_must_carry", tuple(dict.fromkeys(required + keys * upsert)))
        object.__setattr__(self, "_key_positions", keys)

    @property
    def qualified(self) -> str:
        return f'"{self.schema}"."{self.name}"'

    def row(self, raw: bytes) -> Row:
        """A record value as a row of this table, or a RecordError naming what is wrong."""
        row = self.decoder.decode(raw)
        for i in self._must_carry:
            if row[i] is None or row[i] is UNSET:
                raise RecordError(self._missing(row))
        return row

    def _missing(self, row: Row) -> str:
        def lacking(names: Iterable[str]) -> list[str]:
            values = [(c, row[self.columns.index(c)]) for c in names]
            return sorted(c for c, value in values if value is None or value is UNSET)

        required = lacking(self.required)
        if required:
            return f"missing required column(s) {', '.join(required)}"
        return f"value lacks key column(s) {', '.join(lacking(self.route.key_columns))}"

    def key(self, row: Row) -> tuple[Any, ...]:
        """The row's key columns, comparable with a tombstone's decoded key."""
        return tuple(as_cell(row[i]) for i in self._key_positions)

    def names(self, positions: Iterable[int]) -> list[str]:
        return [self.columns[i] for i in positions]


def reflect_target(engine: Engine, route: RouteSettings, index: int) -> Target:
    """Refuse at start-up a route whose table or key columns do not exist."""
    path = f"consumer.routes.{index}"
    schema, _, name = route.table.rpartition(".")
    schema = schema or "public"
    try:
        table = Table(name, MetaData(), schema=schema, autoload_with=engine)
    except NoSuchTableError:
        raise ConfigError([(f"{path}.table", f"table {route.table!r} does not exist")]) from None
    # SQLAlchemy's names are a str subclass (quoted_name); the decoder's keys must be plain str.
    columns = tuple(str(c.name) for c in table.columns)
    unknown = [c for c in route.key_columns if c not in columns]
    if unknown:
        raise ConfigError(
            [(f"{path}.key_columns", f"{route.table} has no column {', '.join(unknown)}")]
        )
    if route.mode == "upsert" and not _has_unique(engine, schema, name, route.key_columns):
        raise ConfigError(
            [(f"{path}.key_columns", f"{route.table} has no primary key or unique constraint "
              f"on ({', '.join(route.key_columns)}), which upsert needs")]
        )  # fmt: skip
    defaulted = frozenset(
        str(c.name) for c in table.columns if c.server_default is not None or _is_identity(c)
    )
    required = frozenset(str(c.name) for c in table.columns if not c.nullable) - defaulted
    return Target(
        route=route,
        schema=schema,
        name=name,
        columns=columns,
        required=required,
        defaulted=defaulted,
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
