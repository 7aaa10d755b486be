"""The shape of the offsets table, its audit trail, and the fenced advance function.

Part of the offsets table's one home (`consumers.offsets`): created by `consumers.state`, read
and written only by `consumers.offsets.store`.
"""

from __future__ import annotations

from psycopg import sql
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    text,
)

from bridge.names import ADVANCE_OFFSETS_FUNCTION, OFFSET_RESETS_TABLE, OFFSETS_TABLE


def define_tables(metadata: MetaData) -> tuple[Table, Table]:
    """The offsets table and the audit trail of `bridge offsets reset --execute`."""
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
    resets = Table(
        OFFSET_RESETS_TABLE,
        metadata,
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
    return offsets, resets


def advance_function_ddl(schema: str) -> str:
    """Moves each partition to its new next offset where the lease still holds (same owner
    epoch, same expected offset) and returns the partitions it did not move. With `p_strict`
    it raises instead, aborting the transaction that holds it, and with it the batch's rows."""
    return (
        sql.SQL("""
CREATE OR REPLACE FUNCTION {function}(
    p_group text, p_topics text[], p_partitions integer[], p_epochs bigint[],
    p_expected bigint[], p_next bigint[], p_strict boolean)
RETURNS TABLE (fenced_topic text, fenced_partition integer)
LANGUAGE plpgsql AS $advance$
BEGIN
    RETURN QUERY
    WITH moved AS (
        UPDATE {table} AS o
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
$advance$""")
        .format(
            function=sql.Identifier(schema, ADVANCE_OFFSETS_FUNCTION),
            table=sql.Identifier(schema, OFFSETS_TABLE),
        )
        .as_string()
    )
