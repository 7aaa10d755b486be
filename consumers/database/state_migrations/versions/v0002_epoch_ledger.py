"""Version 0002: the ledger of whole epochs (`consumers.database.epoch_ledger`): the epochs a
group knows, the manifest's parts, the records staged until their epoch is whole, their counts
per Kafka partition, and the audit trail of the operators' actions on epochs."""

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
    SmallInteger,
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
    records = Table(
        "epoch_records",
        metadata,
        Column("group_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("offset", BigInteger, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("spark_partition", Integer, nullable=False),
        Column("key", LargeBinary),
        Column("value", LargeBinary),
        Column("headers", JSONB),
        Column("timestamp_type", SmallInteger, nullable=False),
        Column("timestamp_ms", BigInteger, nullable=False),
        PrimaryKeyConstraint("group_id", "topic", "partition", "offset"),
    )
    Index("epoch_records_of_epoch", records.c.group_id, records.c.query, records.c.epoch)
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


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")
