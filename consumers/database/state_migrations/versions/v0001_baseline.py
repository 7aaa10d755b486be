"""Version 0001: the offsets table with its owner lease, the reset audit trail, the dead
letters, and the fenced advance function, as every release before versions made them.

Every statement is idempotent, so a database made by one of those releases (tables present,
no version table) is taken over as it is and only stamped.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
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

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    metadata = MetaData(schema=schema)
    Table(
        "offsets",
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
    Table(
        "offset_resets",
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("old_offset", BigInteger),
        Column("new_offset", BigInteger, nullable=False),
        Column("old_owner", Text),
        Column("new_owner_epoch", BigInteger, nullable=False),
        Column("target", Text, nullable=False),
        Column("forced", Boolean, nullable=False),
        Column("requested_by", Text, nullable=False),
        Column("reset_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
    Table(
        "dead_letters",
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
        UniqueConstraint("group_id", "topic", "partition", "offset"),
    )
    metadata.create_all(op.get_bind(), checkfirst=True)
    op.execute(_ADVANCE_FUNCTION.replace("{schema}", _quoted(schema)))


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


# Moves each partition to its new next offset where the lease still holds (same owner epoch, same
# expected offset) and returns the partitions it did not move; with p_strict it raises instead,
# aborting the transaction that holds it, and with it the batch's rows.
_ADVANCE_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}."advance_offsets"(
    p_group text, p_topics text[], p_partitions integer[], p_epochs bigint[],
    p_expected bigint[], p_next bigint[], p_strict boolean)
RETURNS TABLE (fenced_topic text, fenced_partition integer)
LANGUAGE plpgsql AS $advance$
BEGIN
    RETURN QUERY
    WITH moved AS (
        UPDATE {schema}."offsets" AS o
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
$advance$"""
