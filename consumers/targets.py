"""The user's target tables: reflected at start-up and checked against the routes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, MetaData, Table, inspect
from sqlalchemy.exc import NoSuchTableError

from bridge.errors import ConfigError
from bridge.settings import RouteSettings
from consumers.records import RecordError, to_cell

_NESTED = frozenset((dict, list))


@dataclass(frozen=True, kw_only=True)
class Target:
    route: RouteSettings
    schema: str
    name: str
    columns: tuple[str, ...]
    required: frozenset[str]  # NOT NULL without a default: a record must carry them

    @property
    def qualified(self) -> str:
        return f'"{self.schema}"."{self.name}"'

    def check(self, value: dict[str, Any]) -> None:
        """Refuse a record that lacks a column the table cannot fill itself."""
        for column in self.required:
            if value.get(column) is None:
                missing = sorted(c for c in self.required if value.get(c) is None)
                raise RecordError(f"missing required column(s) {', '.join(missing)}")

    def present(self, values: Iterable[dict[str, Any]]) -> list[str]:
        """The table's columns that at least one of `values` carries, in table order. A column
        no record carries is left out of the statement, so the table's default fills it."""
        keys: set[str] = set()
        for value in values:
            keys.update(value)
        return self.present_among(keys)

    def present_among(self, fields: set[str]) -> list[str]:
        """The table's columns named in `fields`, in table order."""
        return [c for c in self.columns if c in fields]


def cells(value: dict[str, Any], columns: Sequence[str]) -> list[Any]:
    """One record's row for COPY: its fields in `columns` order, NULL where it has none."""
    return [to_cell(v) if (v := value.get(c)).__class__ in _NESTED else v for c in columns]


def reflect_target(engine: Engine, route: RouteSettings, index: int) -> Target:
    """Refuse at start-up a route whose table or key columns do not exist."""
    path = f"consumer.routes.{index}"
    schema, _, name = route.table.rpartition(".")
    schema = schema or "public"
    try:
        table = Table(name, MetaData(), schema=schema, autoload_with=engine)
    except NoSuchTableError:
        raise ConfigError([(f"{path}.table", f"table {route.table!r} does not exist")]) from None
    columns = tuple(c.name for c in table.columns)
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
    required = frozenset(
        c.name
        for c in table.columns
        if not c.nullable and c.server_default is None and not _is_identity(c)
    )
    return Target(route=route, schema=schema, name=name, columns=columns, required=required)


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
