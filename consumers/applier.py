"""Applies one route's records to its table inside the caller's transaction.

Bad records never stop the flow: a record that cannot be decoded, or that PostgreSQL refuses
(SQLSTATE class 22 data exception, 23 integrity violation), is written to the dead-letter table
in the same transaction. A refused batch is split in halves, each under a savepoint, until the
offending rows are isolated; everything else is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, cast

import psycopg
from psycopg import sql

from consumers.records import Record, RecordError, decode_key, decode_object
from consumers.state import StateTables
from consumers.targets import Target, cells

_RECORD_FAULT_CLASSES = ("22", "23")

T = TypeVar("T")


class Delete(NamedTuple):
    record: Record
    key: tuple[Any, ...]


# A record to insert or upsert is its own operation, with its decoded object in `fields` (fields
# that are not columns are ignored); a tombstone is a Delete. No wrapper per record: this is the
# per-record path.
Op = Record | Delete


class _Decoded(NamedTuple):
    ops: list[Op]
    deletes: bool  # whether any op is a Delete
    flat: bool  # whether no value can hold a nested object or array (rows need no conversion)
    fields: set[str]  # every field name of every decoded value


@dataclass
class ApplyCounts:
    applied: int = 0
    deleted: int = 0
    dead: int = 0


class Applier:
    def __init__(self, *, tables: StateTables, group_id: str) -> None:
        self._group = group_id
        self._dead_letters = tables.qualified(tables.dead_letters)

    def apply(
        self, conn: psycopg.Connection, target: Target, records: Sequence[Record]
    ) -> ApplyCounts:
        counts = ApplyCounts()
        decoded = self._decode(conn, target, records, counts)
        if target.route.mode == "upsert":
            ops = _last_per_key(target, decoded.ops)
            self._apply_upserts(conn, target, ops, counts, flat=decoded.flat)
        elif decoded.deletes:
            self._apply_in_order(conn, target, decoded.ops, counts)
        elif decoded.ops:
            rows = cast(list[Record], decoded.ops)  # no Delete among them
            # The whole batch's columns are known from decoding; a split recomputes its own.
            columns = target.present_among(decoded.fields)
            counts.applied += self._isolate(
                conn,
                rows,
                lambda run: self._copy(
                    conn, target, run, flat=decoded.flat, columns=columns if run is rows else None
                ),
            )
        return counts

    # -- decoding -----------------------------------------------------------------------------

    def _decode(
        self,
        conn: psycopg.Connection,
        target: Target,
        records: Sequence[Record],
        counts: ApplyCounts,
    ) -> _Decoded:
        """Decode every record into an op; a record that cannot be one is dead-lettered here."""
        ops: list[Op] = []
        deletes, flat = False, True
        fields: set[str] = set()
        keys = target.route.key_columns
        upsert = target.route.mode == "upsert"
        check = target.check
        for record in records:
            raw = record.value
            try:
                if raw is None:
                    if not keys:
                        raise RecordError(
                            "tombstone, but the route has no key_columns to delete by"
                        )
                    ops.append(Delete(record, decode_key(record.key, keys)))
                    deletes = True
                    continue
                value = decode_object(raw)
                check(value)
                if upsert:
                    absent = [c for c in keys if value.get(c) is None]
                    if absent:
                        raise RecordError(f"value lacks key column(s) {', '.join(absent)}")
            except RecordError as exc:
                self._dead_letter(conn, record, str(exc))
                counts.dead += 1
                continue
            # Nested values need converting to JSON text; without '[' or a second '{' in the
            # raw bytes there can be none.
            if flat and (b"[" in raw or raw.count(b"{") != 1):
                flat = False
            fields.update(value)
            record.fields = value
            ops.append(record)
        return _Decoded(ops, deletes, flat, fields)

    # -- writing ------------------------------------------------------------------------------

    def _apply_in_order(
        self, conn: psycopg.Connection, target: Target, ops: list[Op], counts: ApplyCounts
    ) -> None:
        # Runs of inserts go through COPY; a tombstone in between is applied at its place.
        run: list[Record] = []
        for op in [*ops, None]:
            if isinstance(op, Record):
                run.append(op)
                continue
            if run:
                counts.applied += self._isolate(
                    conn, run, lambda rows: self._copy(conn, target, rows, flat=False)
                )
                run = []
            if isinstance(op, Delete):
                counts.deleted += self._isolate(
                    conn, [op], lambda ds: self._delete(conn, target, ds)
                )

    def _apply_upserts(
        self,
        conn: psycopg.Connection,
        target: Target,
        ops: list[Op],
        counts: ApplyCounts,
        *,
        flat: bool,
    ) -> None:
        upserts = [op for op in ops if isinstance(op, Record)]
        deletes = [op for op in ops if isinstance(op, Delete)]
        if upserts:
            counts.applied += self._isolate(
                conn, upserts, lambda rows: self._merge(conn, target, rows, flat=flat)
            )
        if deletes:
            counts.deleted += self._isolate(
                conn, deletes, lambda ds: self._delete(conn, target, ds)
            )

    def _isolate(
        self, conn: psycopg.Connection, ops: list[T], write: Callable[[list[T]], None]
    ) -> int:
        """Write `ops` under a savepoint; when PostgreSQL refuses a record, split and retry, and
        dead-letter each single op it still refuses. Returns how many ops were written."""
        try:
            with conn.transaction():
                write(ops)
            return len(ops)
        except psycopg.Error as exc:
            if not (exc.sqlstate or "").startswith(_RECORD_FAULT_CLASSES):
                raise
            if len(ops) == 1:
                op = ops[0]
                assert isinstance(op, Record | Delete)  # noqa: S101 - ops are always ours
                record = op if isinstance(op, Record) else op.record
                self._dead_letter(conn, record, f"{exc.sqlstate}: {exc.diag.message_primary}")
                return 0
            middle = len(ops) // 2
            return self._isolate(conn, ops[:middle], write) + self._isolate(
                conn, ops[middle:], write
            )

    @staticmethod
    def _columns(target: Target, rows: list[Record]) -> list[str]:
        return target.present(_fields(record) for record in rows)

    def _copy(
        self,
        conn: psycopg.Connection,
        target: Target,
        rows: list[Record],
        *,
        flat: bool,
        columns: list[str] | None = None,
    ) -> None:
        columns = columns if columns is not None else self._columns(target, rows)
        self._copy_into(conn, sql.SQL(target.qualified), columns, rows, flat=flat)

    @staticmethod
    def _copy_into(
        conn: psycopg.Connection,
        table: sql.Composable,
        columns: list[str],
        rows: list[Record],
        *,
        flat: bool,
    ) -> None:
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            table, sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        with conn.cursor().copy(statement) as copy:
            write_row = copy.write_row
            if flat:  # the common case, at C speed per row; _decode set every record's fields
                for record in rows:
                    write_row(list(map(record.fields.get, columns)))  # type: ignore[union-attr]
            else:
                for record in rows:
                    write_row(cells(_fields(record), columns))

    def _merge(
        self, conn: psycopg.Connection, target: Target, rows: list[Record], *, flat: bool
    ) -> None:
        columns = self._columns(target, rows)
        stage = sql.Identifier(f"bridge_stage_{target.name}")
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DROP"
            ).format(stage, sql.SQL(target.qualified))
        )
        conn.execute(sql.SQL("TRUNCATE {}").format(stage))
        self._copy_into(conn, stage, columns, rows, flat=flat)
        names = sql.SQL(", ").join(map(sql.Identifier, columns))
        keys = sql.SQL(", ").join(map(sql.Identifier, target.route.key_columns))
        updates = [c for c in columns if c not in target.route.key_columns]
        action = (
            sql.SQL("DO UPDATE SET ")
            + sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates
            )
            if updates
            else sql.SQL("DO NOTHING")
        )
        conn.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) ").format(
                sql.SQL(target.qualified), names, names, stage, keys
            )
            + action
        )

    @staticmethod
    def _delete(conn: psycopg.Connection, target: Target, deletes: list[Delete]) -> None:
        condition = sql.SQL(" AND ").join(
            sql.SQL("{} = %s").format(sql.Identifier(c)) for c in target.route.key_columns
        )
        statement = sql.SQL("DELETE FROM {} WHERE ").format(sql.SQL(target.qualified)) + condition
        with conn.cursor() as cursor:
            cursor.executemany(statement, [op.key for op in deletes])

    def _dead_letter(self, conn: psycopg.Connection, record: Record, error: str) -> None:
        conn.execute(
            f"INSERT INTO {self._dead_letters} "  # noqa: S608 - our table
            '(group_id, topic, partition, "offset", key, value, headers, error) '
            "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s)",
            (
                self._group,
                record.topic,
                record.partition,
                record.offset,
                record.key,
                record.value,
                record.headers_json(),
                error,
            ),
        )


def _last_per_key(target: Target, ops: list[Op]) -> list[Op]:
    """Upsert mode: the last record of a key in the batch wins, whether row or tombstone."""
    keys = target.route.key_columns
    last: dict[tuple[Any, ...], Op] = {}
    for op in ops:
        key = op.key if isinstance(op, Delete) else tuple(cells(_fields(op), keys))
        last.pop(key, None)  # re-insert so the dict keeps the order of the winners
        last[key] = op
    return list(last.values())


def _fields(record: Record) -> dict[str, Any]:
    fields = record.fields
    assert fields is not None  # noqa: S101 - set by _decode for every record op
    return fields
