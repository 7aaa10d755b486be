"""Version 0003: dead letters that can be replayed, and groups that can be deleted. Each dead
letter keeps its record's Kafka timestamp and how many times it was tried; `dead_letter_replays`
is the audit trail of `bridge dead-letters replay` (`consumers.dead_letter_replay`), and
`offset_deletions` that of `bridge offsets delete`."""

from __future__ import annotations

from alembic import op
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Integer,
    MetaData,
    Table,
    Text,
    func,
)

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    # Idempotent, as every migration here: two members may meet it at once (under a lock), and
    # a migration cut short is run again.
    op.execute(
        f'ALTER TABLE "{schema}".dead_letters '
        "ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 1, "
        "ADD COLUMN IF NOT EXISTS kafka_timestamp_ms bigint"
    )
    metadata = MetaData(schema=schema)
    Table(
        "dead_letter_replays",
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("offset", BigInteger, nullable=False),
        Column("outcome", Text, nullable=False),
        Column("error", Text),
        Column("attempt", Integer, nullable=False),
        Column("requested_by", Text, nullable=False),
        Column("replayed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
    Table(
        "offset_deletions",
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("old_offset", BigInteger, nullable=False),
        Column("old_owner", Text),
        Column("forced", Boolean, nullable=False),
        Column("requested_by", Text, nullable=False),
        Column("deleted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
    metadata.create_all(op.get_bind(), checkfirst=True)


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")
