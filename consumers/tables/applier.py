"""Applies one route's records to its table inside the caller's transaction.

Bad records never stop the flow: a record that cannot be decoded, that PostgreSQL refuses
(SQLSTATE class 22 data exception, 23 integrity violation, 54000 a value too big for an index,
428C9 a value for a column the table generates) or that psycopg will not send (text holding
NUL), is written to the dead-letter table in the same transaction. A refused batch is split in
halves, each under a savepoint, until the offending rows are isolated; everything else is
applied.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple, TypeVar, cast

import psycopg
from psycopg import sql

from bridge.names import UPSERT_STAGE_PREFIX
from consumers.database.dead_letters import write_dead_letters
from consumers.database.pg_errors import RECORD_FAULTS
from consumers.database.state import StateTables
from consumers.decoding.change_events import Unwrapped
from consumers.decoding.records import (
    Record,
    RecordError,
    RecordStopped,
    offset_of,
)
from consumers.decoding.rows import UNSET, Row, projector, row_cursor, runs
from consumers.tables.targets import Target


class Delete(NamedTuple):
    record: Record
    key: tuple[Any, ...]


# A record to insert or upsert is a plain (record, row) pair, which `zip` makes without a Python
# step per record; a tombstone is a Delete. Either way the record comes first.
Put = tuple[Record, Row]
Op = Put | Delete
OpT = TypeVar("OpT", Put, Delete)
AnyOp = TypeVar("AnyOp", bound=Op)
_row_of: Callable[[Put], Row] = itemgetter(1)


class Step(NamedTuple):
    """One statement of a batch's writes; a COPY FROM STDIN carries its rows, in its columns,
    and once formatted ahead of sending (`consumers.batch.pipelined.formatted`) their COPY text."""

    statement: sql.Composed
    rows: list[Row] | None = None
    data: bytes | None = None
    # The rows this statement writes are counted: those it leaves are the records skipped.
    counted: bool = False


class _Decoded(NamedTuple):
    ops: list[Op]
    deletes: bool  # whether any op is a Delete


class DeadLetterNote(NamedTuple):
    """Where a dead letter came from and why, for the service's log once it is committed."""

    topic: str
    partition: int
    offset: int
    error: str


@dataclass
class ApplyCounts:
    applied: int = 0
    deleted: int = 0
    dead: int = 0
    # Records a mode does not write, by design: in insert_if_absent a key already there (or
    # earlier in the batch), in update a key that is not there.
    skipped: int = 0
    dead_letters: list[DeadLetterNote] = field(default_factory=list)


def _every_row(target: Target, values: list[Unwrapped]) -> bool:
    """Whether every value is one to decode: no tombstone (nor delete), nothing refused."""
    if None in values:
        return False
    return not target.unwraps or all(map(isinstance, values, repeat(bytes)))


class Applier:
    def __init__(self, *, tables: StateTables, group_id: str) -> None:
        self._group = group_id
        self._dead_letters = tables.qualified(tables.dead_letters)
        self._noted: list[DeadLetterNote] = []  # the dead letters of the `apply` under way

    def apply(
        self,
        conn: psycopg.Connection,
        target: Target,
        records: Sequence[Record],
        staged: set[str],
    ) -> ApplyCounts:
        """Write `records` in the caller's transaction; `staged` names the upsert staging tables
        this transaction has already used (see `_merge_steps`)."""
        counts = ApplyCounts()
        self._noted = counts.dead_letters
        decoded = self._decode(conn, target, records, counts)
        mode = target.route.mode
        if mode == "insert_if_absent":
            self._apply_if_absent(conn, target, decoded, counts, staged)
        elif mode != "insert":  # upsert, replace, update: each key's records as one change
            changes = _change_per_key(target, decoded.ops, deletes=decoded.deletes)
            counts.skipped += changes.skipped
            self._apply_upserts(conn, target, changes.deletes, changes.puts, counts, staged)
        elif decoded.deletes:

            def copy_run(run: list[Put]) -> None:
                counts.applied += self._isolate(
                    conn, target, run, lambda r: self._copy(conn, target, r)
                )

            self._apply_in_order(conn, target, decoded.ops, counts, copy_run)
        elif decoded.ops:
            counts.applied += self._isolate(
                conn, target, decoded.ops, lambda run: self._copy(conn, target, run)
            )
        return counts

    @staticmethod
    def plan(target: Target, records: Sequence[Record], staged: set[str]) -> list[Step] | None:
        """The statements that write `records`, when every one of them is a row (no tombstone,
        nothing to dead-letter), or None: `apply` then goes statement by statement. `staged`
        names the upsert staging tables the transaction's earlier statements use."""
        if target.route.mode in ("insert_if_absent", "update"):
            return None  # statement by statement, which counts the records they skip
        values = target.values(records)
        if not _every_row(target, values):
            return None
        raws = cast(list[bytes], values)
        carried = target.carried_rows(raws)
        if carried is not None:  # as most batches: their rows as they were decoded
            columns, decoded = carried
            if target.carried_key is None:
                return [_copy(target.identifier, columns, decoded)]
            winners = _last_row_per_key(decoded, target.carried_key)
            if winners is not None:
                return _merge_steps(target, [(columns, winners)], staged)
        rows = target.rows(raws, records)
        if rows is None:
            return None
        puts: list[Put] = list(zip(records, rows, strict=True))
        if target.route.mode != "insert":
            winners = _change_per_key(target, puts, deletes=False).puts
            return _merge_steps(target, _column_runs(target, winners), staged)
        return _copy_steps(target.identifier, target, puts)

    # -- decoding -----------------------------------------------------------------------------

    def _decode(
        self,
        conn: psycopg.Connection,
        target: Target,
        records: Sequence[Record],
        counts: ApplyCounts,
    ) -> _Decoded:
        """Decode every record into an op; a record that cannot be one is dead-lettered here."""
        values = target.values(records)
        if _every_row(target, values):  # no tombstone: the whole batch decodes in C loops
            rows = target.rows(cast(list[bytes], values), records)
            if rows is not None:
                return _Decoded(list(zip(records, rows, strict=True)), deletes=False)
        # Record by record, to tell which records are tombstones or are not rows, and why.
        ops: list[Op] = []
        deletes = False
        keys = target.route.key_columns
        to_row = target.row
        for record, raw in zip(records, values, strict=True):
            try:
                if isinstance(raw, RecordError):
                    raise raw
                if raw is None:
                    if not keys:
                        raise RecordError(
                            "tombstone (or a change event's delete), but the route has no "
                            "key_columns to delete by"
                        )
                    if target.route.key_source == "kafka":
                        raise RecordError(
                            "tombstone, but the route's key is each record's own Kafka "
                            "coordinates (key_source kafka): it names no row to delete"
                        )
                    ops.append(Delete(record, target.keys.read(record.key())))
                    deletes = True
                    continue
                ops.append((record, to_row(raw, record)))
            except RecordError as exc:
                self._reject(conn, target, record, str(exc))
                counts.dead += 1
        return _Decoded(ops, deletes)

    # -- writing ------------------------------------------------------------------------------

    def _apply_in_order(
        self,
        conn: psycopg.Connection,
        target: Target,
        ops: list[Op],
        counts: ApplyCounts,
        write_run: Callable[[list[Put]], None],
    ) -> None:
        """Runs of rows go to `write_run`; a tombstone in between is applied at its place."""
        run: list[Put] = []
        for op in [*ops, None]:
            if op is not None and not isinstance(op, Delete):
                run.append(op)
                continue
            if run:
                write_run(run)
                run = []
            if isinstance(op, Delete):
                counts.deleted += self._isolate(
                    conn, target, [op], lambda ds: self._delete(conn, target, ds)
                )

    def _apply_upserts(
        self,
        conn: psycopg.Connection,
        target: Target,
        deletes: list[Delete],
        puts: list[Put],
        counts: ApplyCounts,
        staged: set[str],
    ) -> None:
        """The deletes first: a key whose tombstone came before its last records is deleted,
        then written afresh from those records alone."""
        if deletes:
            counts.deleted += self._isolate(
                conn, target, deletes, lambda ds: self._delete(conn, target, ds)
            )
        if puts:
            self._merge(conn, target, puts, counts, staged)

    def _apply_if_absent(
        self,
        conn: psycopg.Connection,
        target: Target,
        decoded: _Decoded,
        counts: ApplyCounts,
        staged: set[str],
    ) -> None:
        """insert_if_absent: the first record of a key wins, in the batch and against the table.
        A tombstone deletes at its place, so a key's record after it is written again."""

        def write_run(run: list[Put]) -> None:
            firsts = _first_per_key(target, run)
            counts.skipped += len(run) - len(firsts)
            self._merge(conn, target, firsts, counts, staged)

        self._apply_in_order(conn, target, decoded.ops, counts, write_run)

    def _merge(
        self,
        conn: psycopg.Connection,
        target: Target,
        puts: list[Put],
        counts: ApplyCounts,
        staged: set[str],
    ) -> None:
        """Write `puts` through the staging table by the route's mode; what the mode's statement
        leaves unwritten (a key present for insert_if_absent, absent for update) is skipped."""
        # Only these modes' statements leave records unwritten; their row counts tell how many.
        counted = target.route.mode in ("insert_if_absent", "update")
        skipped: list[int] = []  # of the writes that went through, not of those split again

        def write(run: list[Put]) -> None:
            wrote = run_steps(conn, _merge_steps(target, _column_runs(target, run), staged))
            if counted:
                skipped.append(len(run) - wrote)

        written = self._isolate(conn, target, puts, write) - sum(skipped)
        counts.skipped += sum(skipped)
        counts.applied += written

    def _isolate(
        self,
        conn: psycopg.Connection,
        target: Target,
        ops: list[OpT],
        write: Callable[[list[OpT]], None],
    ) -> int:
        """Write `ops` under a savepoint; when PostgreSQL refuses a record, split and retry, and
        dead-letter each single op it still refuses. Returns how many ops were written."""
        try:
            with conn.transaction():
                write(ops)
            return len(ops)
        except psycopg.Error as exc:
            if not _refused_by_a_record(exc):
                raise
            if len(ops) == 1:
                self._reject(conn, target, ops[0][0], _describe(exc))
                return 0
            middle = len(ops) // 2
            return self._isolate(conn, target, ops[:middle], write) + self._isolate(
                conn, target, ops[middle:], write
            )

    @staticmethod
    def _copy(conn: psycopg.Connection, target: Target, puts: list[Put]) -> None:
        run_steps(conn, _copy_steps(target.identifier, target, puts))

    @staticmethod
    def _delete(conn: psycopg.Connection, target: Target, deletes: list[Delete]) -> None:
        condition = sql.SQL(" AND ").join(
            sql.SQL("{} = %s").format(sql.Identifier(c)) for c in target.route.key_columns
        )
        statement = sql.SQL("DELETE FROM {} WHERE ").format(target.identifier) + condition
        with conn.cursor() as cursor:
            cursor.executemany(statement, [op.key for op in deletes])

    def _reject(self, conn: psycopg.Connection, target: Target, record: Record, error: str) -> None:
        """A record that cannot be written: dead-lettered, or with `on_record_error: stop`
        raised, which rolls back the caller's transaction (the committer cuts the batch there)."""
        if target.route.on_record_error == "stop":
            raise RecordStopped(record, error)
        self._dead_letter(conn, record, error)

    def dead_letters_ends(
        self, conn: psycopg.Connection, keys: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """For each of `keys` holding dead letters of this group, the offset after its last."""
        if not keys:
            return {}
        rows = conn.execute(
            sql.SQL(
                'SELECT topic, partition, max("offset") + 1 FROM {} WHERE group_id = %s '
                "AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[])) "
                "GROUP BY topic, partition"
            ).format(self._dead_letters),
            (self._group, [k[0] for k in keys], [k[1] for k in keys]),
        ).fetchall()
        return {(topic, partition): end for topic, partition, end in rows}

    def replayed(self, key: tuple[str, int], first: int, last: int) -> Step:
        """The statement that clears the dead letters of offsets `first`..`last` of `key`, which
        a batch applies again: each record lands once, in its table or as a dead letter again
        (with the error it has now)."""
        return Step(
            sql.SQL(
                'DELETE FROM {} WHERE group_id = {} AND topic = {} AND partition = {} AND "offset" '
                "BETWEEN {} AND {}"
            ).format(
                self._dead_letters,
                sql.Literal(self._group),
                sql.Literal(key[0]),
                sql.Literal(key[1]),
                sql.Literal(first),
                sql.Literal(last),
            )
        )

    def _dead_letter(self, conn: psycopg.Connection, record: Record, error: str) -> None:
        self._noted.append(self.dead_letter(conn, record, error))

    def dead_letter(self, conn: psycopg.Connection, record: Record, error: str) -> DeadLetterNote:
        """Write `record` to the dead letters with `error`, in the caller's transaction."""
        write_dead_letters(conn, self._dead_letters, self._group, [(record, error)])
        return DeadLetterNote(
            str(record.topic()), cast(int, record.partition()), offset_of(record), error
        )


class EveryStage(set[str]):
    """`staged` for plans run one after another in one transaction, each made on its own
    (whole epochs: planned at staging, run at publication): each empties the staging table it
    uses before filling it."""

    def __contains__(self, name: object) -> bool:
        return True


def run_steps(conn: psycopg.Connection, steps: list[Step]) -> int:
    """Execute the steps one by one, each awaited. Returns how many rows the counted ones
    wrote."""
    counted = 0
    for step in steps:
        if step.rows is None:
            cursor = conn.execute(step.statement)
            counted += cursor.rowcount if step.counted else 0
            continue
        with row_cursor(conn).copy(step.statement) as copy:
            if step.data is not None:  # formatted ahead (`Step.data`)
                copy.write(step.data)
                continue
            # Rows go to psycopg's C formatting as they are, without a Python loop per row.
            deque(map(copy.write_row, step.rows), maxlen=0)
    return counted


def _column_runs(target: Target, puts: list[Put]) -> list[tuple[list[str], list[Row]]]:
    """The rows in runs that carry the same columns: each run's column names, and its rows
    holding just those columns."""
    rows = list(map(_row_of, puts))
    width = len(target.columns)
    column_runs = []
    for positions, run in runs(rows, target.tracked, width):
        project = projector(positions, width)
        column_runs.append(
            (target.names(positions), run if project is None else list(map(project, run)))
        )
    return column_runs


def _copy(table: sql.Composable, columns: list[str], rows: list[Row]) -> Step:
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    return Step(sql.SQL("COPY {} ({}) FROM STDIN").format(table, names), rows)


def _copy_steps(table: sql.Composable, target: Target, puts: list[Put]) -> list[Step]:
    """A COPY into `table` per run of rows, each naming the columns its rows carry."""
    return [_copy(table, columns, rows) for columns, rows in _column_runs(target, puts)]


def stage_name(target: Target) -> str:
    """The staging table of one upsert target: named after the table, and told apart from a
    table of the same name in another schema by a digest of the qualified name. The digest
    covers the columns too: a table that gained a column (auto_evolve) gets a new staging
    table shaped like it, not the session's old one."""
    named = "\0".join((target.qualified, *target.columns))
    digest = hashlib.sha1(named.encode(), usedforsecurity=False).hexdigest()[:8]
    return f"{UPSERT_STAGE_PREFIX}{target.name[:40]}_{digest}"


def _merge_steps(
    target: Target, column_runs: list[tuple[list[str], list[Row]]], staged: set[str]
) -> list[Step]:
    """A keyed mode's writes through a staging table (`_from_stage`): each run of rows names
    the columns it carries, so a column a record lacks takes its default in a new row and, in
    upsert and update modes, stays as it is in an old one.

    The staging table lives as long as the session (made per transaction, ON COMMIT DROP, its
    creation and drop cost each batch a dozen catalog writes), and ON COMMIT DELETE ROWS
    empties it at each commit by truncating its file, without a catalog change. So the first
    use in a transaction finds it empty (a rollback leaves it as the last commit did, empty)
    and reads it with a plain scan. A later use in the same transaction (another run of
    columns, another route into the table, or the halves of a batch split to find a refused
    record, where a savepoint's rollback keeps the first half's rows) empties it first:
    otherwise the rows already applied would be applied again. `staged` is where the
    transaction keeps count."""
    stage_id = stage_name(target)
    stage = sql.Identifier(stage_id)
    table = target.identifier
    steps = []
    for columns, rows in column_runs:
        # Made here every time, cheap when it exists: a savepoint rolled back may have undone
        # its creation.
        steps.append(
            Step(
                sql.SQL(
                    "CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) "
                    "ON COMMIT DELETE ROWS"
                ).format(stage, table)
            )
        )
        if stage_id in staged:
            steps.append(Step(sql.SQL("DELETE FROM {}").format(stage)))
        staged.add(stage_id)
        steps += [_copy(stage, columns, rows), *_from_stage(target, stage, columns)]
    return steps


def _from_stage(target: Target, stage: sql.Identifier, columns: list[str]) -> list[Step]:
    """The statements that move the staged rows (of `columns`) into the table, by mode."""
    table = target.identifier
    mode = target.route.mode
    keys = target.route.key_columns
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    # COPY writes a value a record carries for a GENERATED ALWAYS identity column; the
    # statements below do the same rather than refuse it (428C9).
    insert = sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {} ").format(
        table, names, names, stage
    )
    key_list = sql.SQL(", ").join(map(sql.Identifier, keys))
    same_key = sql.SQL(" AND ").join(
        sql.SQL("t.{0} = s.{0}").format(sql.Identifier(k)) for k in keys
    )
    if mode == "replace":
        # The key's row goes and the record's comes, in this transaction: never absent after it.
        delete = sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE ").format(table, stage)
        return [Step(delete + same_key), Step(insert)]
    if mode == "insert_if_absent":
        return [
            Step(insert + sql.SQL("ON CONFLICT ({}) DO NOTHING").format(key_list), counted=True)
        ]
    # An update sets every column the records carry; a run of keys alone sets them to
    # themselves, so that the rows found are counted all the same.
    updates = [c for c in columns if c not in keys] or list(keys)
    assignments = sql.SQL(", ").join(
        sql.SQL("{0} = s.{0}").format(sql.Identifier(c)) for c in updates
    )
    if mode == "update":
        return [
            Step(
                sql.SQL("UPDATE {} AS t SET ").format(table)
                + assignments
                + sql.SQL(" FROM {} AS s WHERE ").format(stage)
                + same_key,
                counted=True,
            )
        ]
    action = (
        sql.SQL("DO UPDATE SET ")
        + sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
            for c in columns
            if c not in keys
        )
        if any(c not in keys for c in columns)
        else sql.SQL("DO NOTHING")
    )
    return [Step(insert + sql.SQL("ON CONFLICT ({}) ").format(key_list) + action)]


def _first_per_key(target: Target, puts: list[Put]) -> list[Put]:
    """insert_if_absent: the first record of each key in `puts`, in their order."""
    if target.distinct_keys(list(map(_row_of, puts))):
        return puts
    first: dict[tuple[Any, ...], Put] = {}
    for put in puts:
        first.setdefault(target.key(put[1]), put)
    return list(first.values())


def _refused_by_a_record(exc: psycopg.Error) -> bool:
    return isinstance(exc, RECORD_FAULTS)


def _describe(exc: psycopg.Error) -> str:
    if exc.sqlstate is None:
        return f"refused before sending: {exc}"
    return f"{exc.sqlstate}: {exc.diag.message_primary}"


def _last_row_per_key(rows: list[Row], key: Callable[[Row], Any]) -> list[Row] | None:
    """Upsert mode, rows without a tombstone among them: the last row of each key, in C loops;
    None when a key holds a nested value (unhashable), for `_change_per_key` to compare."""
    try:
        last = dict(zip(map(key, rows), range(len(rows)), strict=True))  # each key's last place
    except TypeError:
        return None
    if len(last) == len(rows):
        return rows  # no key twice, as in most batches
    return list(map(rows.__getitem__, sorted(last.values())))


class _Changes(NamedTuple):
    """A batch's records of a keyed mode as one change per key, in the order of their last
    records: the keys deleted first, and the row each key is written with."""

    deletes: list[Delete]
    puts: list[Put]
    skipped: int  # update mode: records of a key deleted earlier in the batch, which no row takes


def _change_per_key(target: Target, ops: list[AnyOp], *, deletes: bool) -> _Changes:
    """What applying `ops` one by one, in offset order, does to each key, as one change:

    - a record after another of its key sets the columns it carries and leaves the others as
      the earlier one set them (upsert and update: a column a record lacks stays as it was);
      in replace mode the later record is the whole row;
    - a tombstone drops what came before it: the key is deleted, and a record after it starts
      the row afresh (its absent columns take their defaults), or in update mode finds no row.
    """
    if not deletes and target.distinct_keys(list(map(_row_of, cast(list[Put], ops)))):
        return _Changes([], cast(list[Put], ops), 0)  # no key twice, as in most batches
    mode = target.route.mode
    deleted: dict[tuple[Any, ...], Delete] = {}
    rows: dict[tuple[Any, ...], Put] = {}
    skipped = 0
    for op in ops:
        if isinstance(op, Delete):
            rows.pop(op.key, None)
            deleted[op.key] = op
            continue
        record, row = op
        key = target.key(row)
        if mode == "update" and key in deleted:
            skipped += 1  # the row is gone by the time this record comes
            continue
        before = rows.pop(key, None)  # re-inserted, so that the order is that of the last records
        if before is not None and mode != "replace":
            row = tuple(b if r is UNSET else r for b, r in zip(before[1], row, strict=True))
        rows[key] = (record, row)
    return _Changes(list(deleted.values()), list(rows.values()), skipped)
