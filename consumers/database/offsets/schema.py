"""The shape of the offsets table and its audit trail, as this release reads and writes them.

Part of the offsets table's one home (`consumers.database.offsets`): created and migrated, with
the fenced advance function (`bridge.names.ADVANCE_OFFSETS_FUNCTION`), by
`consumers.database.state_migrations`; read and written only by
`consumers.database.offsets.store`.
"""

from __future__ import annotations

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
from sqlalchemy.dialects.postgresql import JSONB

from bridge.names import OFFSET_RESETS_TABLE, OFFSETS_TABLE


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
        # Per (query, Spark partition), the last task attempt whose records the partition
        # applied, at `next_offset` (migration 0007, `consumers.batch.replays`).
        Column("runs", JSONB),
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
