"""The consumer's own tables in PostgreSQL: offsets with an owner lease, and dead letters.

SQLAlchemy Core describes them; `ensure_state_tables` creates them idempotently, under an
advisory lock so that two instances starting together do not race on CREATE TABLE. Beside them
lives one function, the fenced offset advance, so that a batch sent as a single message can have
PostgreSQL itself refuse it when a lease no longer holds (see `consumers.flight`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.schema import CreateSchema

# Any constant works: it only has to be the same for every instance of bridge.
_DDL_LOCK_KEY = 0x62726964  # "brid"

OFFSETS_TABLE = "offsets"
DEAD_LETTERS_TABLE = "dead_letters"
OFFSET_RESETS_TABLE = "offset_resets"


@dataclass(frozen=True)
class StateTables:
    schema: str
    offsets: Table
    dead_letters: Table
    offset_resets: Table

    def qualified(self, table: Table) -> str:
        return f'"{self.schema}"."{table.name}"'


def state_tables(schema: str) -> StateTables:
    metadata = MetaData(schema=schema)
    offsets = Table(
        OFFSETS_TABLE,
        metadata,
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("next_offset", BigInteger, nullable=False),
        Column("owner", Text),
        Column("owner_epoch", BigInteger, nullable=False, server_default=text("0")),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        PrimaryKeyConstraint("group_id", "topic", "partition"),
    )
    dead_letters = Table(
        DEAD_LETTERS_TABLE,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("offset", BigInteger, nullable=False),
        Column("key", LargeBinary),
        Column("value", LargeBinary),
        Column("headers", JSONB),
        Column("error", Text, nullable=False),
        Column("failed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        # A record is dead-lettered at most once: its offset moves past it in the same transaction.
        UniqueConstraint("group_id", "topic", "partition", "offset"),
    )
    offset_resets = Table(
        OFFSET_RESETS_TABLE,
        metadata,
        # The audit trail of `bridge offsets reset --execute`: one row per partition moved.
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("old_offset", BigInteger),  # NULL: the partition had no stored offset
        Column("new_offset", BigInteger, nullable=False),
        Column("old_owner", Text),
        Column("new_owner_epoch", BigInteger, nullable=False),
        Column("target", Text, nullable=False),  # what --to said
        Column("forced", Boolean, nullable=False),
        Column("requested_by", Text, nullable=False),
        Column("reset_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
    return StateTables(
        schema=schema, offsets=offsets, dead_letters=dead_letters, offset_resets=offset_resets
    )


ADVANCE_OFFSETS_FUNCTION = "advance_offsets"


def _advance_offsets_ddl(tables: StateTables) -> str:
    """Moves each partition to its new next offset where the lease still holds (same owner
    epoch, same expected offset) and returns the partitions it did not move. With `p_strict`
    it raises instead, aborting the transaction that holds it, and with it the batch's rows."""
    return f"""
CREATE OR REPLACE FUNCTION "{tables.schema}".{ADVANCE_OFFSETS_FUNCTION}(
    p_group text, p_topics text[], p_partitions integer[], p_epochs bigint[],
    p_expected bigint[], p_next bigint[], p_strict boolean)
RETURNS TABLE (fenced_topic text, fenced_partition integer)
LANGUAGE plpgsql AS $advance$
BEGIN
    RETURN QUERY
    WITH moved AS (
        UPDATE {tables.qualified(tables.offsets)} AS o
        SET next_offset = x.n, updated_at = now()
        FROM unnest(p_topics, p_partitions, p_epochs, p_expected, p_next)
            AS x(t, p, e, expected, n)
        WHERE o.group_id = p_group AND o.topic = x.t AND o.partition = x.p
          AND o.owner_epoch = x.e AND o.next_offset = x.expected
        RETURNING o.topic, o.partition)
    SELECT x.t, x.p FROM unnest(p_topics, p_partitions) AS x(t, p)
    EXCEPT SELECT m.topic, m.partition FROM moved AS m;
    IF FOUND AND p_strict THEN
        RAISE EXCEPTION 'an offset lease of group % is no longer held', p_group
            USING HINT = 'another member took the partition over, or its offset was reset';
    END IF;
END
$advance$"""  # noqa: S608 - our own schema and table names


def ensure_state_tables(conn: Connection, tables: StateTables) -> None:
    """Create the schema, the tables and the advance function when missing; commits."""
    with conn.begin():
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK_KEY})
        conn.execute(CreateSchema(tables.schema, if_not_exists=True))
        tables.offsets.metadata.create_all(conn, checkfirst=True)
        conn.execute(text(_advance_offsets_ddl(tables)))
