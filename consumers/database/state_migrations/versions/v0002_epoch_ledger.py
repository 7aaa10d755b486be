"""Version 0002: the ledger of whole epochs (`consumers.epochs.ledger`): the epochs a
group knows, the manifest's parts, the chunks of records staged until their epoch is whole,
their counts per Kafka partition, and the audit trail of the operators' actions on epochs."""

from __future__ import annotations

from alembic import op
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    metadata = MetaData(schema=schema)
    epochs = Table(
        "epochs",
        metadata,
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("parts", ARRAY(Integer)),
        Column("seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("manifest_at", DateTime(timezone=True)),
        Column("forced", Boolean, nullable=False, server_default=text("false")),
        Column("outcome", Text),
        Column("settled_at", DateTime(timezone=True)),
        PrimaryKeyConstraint("group_id", "query", "epoch"),
    )
    Index("epochs_open", epochs.c.group_id, postgresql_where=epochs.c.outcome.is_(None))
    Table(
        "epoch_parts",
        metadata,
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("spark_partition", Integer, nullable=False),
        Column("records", JSONB, nullable=False),
        PrimaryKeyConstraint("group_id", "query", "epoch", "spark_partition"),
    )
    chunks = Table(
        "epoch_chunks",
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("topic", Text, nullable=False),
        Column("records", Integer, nullable=False),
        Column("rows", Integer),
        Column("raw", LargeBinary, nullable=False),
        Column("plan", LargeBinary),
        Column("stamps", LargeBinary, nullable=False),
    )
    Index("epoch_chunks_of_epoch", chunks.c.group_id, chunks.c.query, chunks.c.epoch, chunks.c.id)
    Table(
        "epoch_staged",
        metadata,
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("spark_partition", Integer, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("records", BigInteger, nullable=False),
        Column(
            "first_staged_at", DateTime(timezone=True), nullable=False, server_default=func.now()
        ),
        PrimaryKeyConstraint("group_id", "query", "epoch", "spark_partition", "topic", "partition"),
    )
    Table(
        "epoch_actions",
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("action", Text, nullable=False),
        Column("missing", Text, nullable=False),
        Column("records", BigInteger, nullable=False),
        Column("requested_by", Text, nullable=False),
        Column("acted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
    metadata.create_all(op.get_bind(), checkfirst=True)
    # A chunk's bytes are written once and read once: stored out of line, uncompressed, which
    # spares the compression's CPU (they are mostly JSON a batch's size, read back whole).
    for column in ("raw", "plan"):
        op.execute(
            f'ALTER TABLE "{schema}".epoch_chunks ALTER COLUMN {column} SET STORAGE EXTERNAL'
        )


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")
