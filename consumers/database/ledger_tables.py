"""The tables of the ledger of whole epochs, in bridge's state schema, as this release reads and
writes them: defined here, below `consumers.database.state`, which creates them beside the
offsets, and used by `consumers.epochs`, which owns what they mean (`consumers.epochs.ledger`)."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql
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

from bridge.names import (
    EPOCH_ACTIONS_TABLE,
    EPOCH_CHUNKS_TABLE,
    EPOCH_JUDGE_FUNCTION,
    EPOCH_PARTS_TABLE,
    EPOCH_STAGED_TABLE,
    EPOCH_TOPICS_TABLE,
    EPOCH_WATERMARKS_TABLE,
    EPOCHS_TABLE,
)


def define_tables(metadata: MetaData) -> list[Table]:
    """The ledger's tables, as this release reads and writes them."""
    epochs = Table(
        EPOCHS_TABLE,
        metadata,
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("parts", ARRAY(Integer)),  # NULL until the driver's epoch record comes
        Column("seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("manifest_at", DateTime(timezone=True)),
        Column("forced", Boolean, nullable=False, server_default=text("false")),
        Column("outcome", Text),  # NULL while open; published, discarded
        Column("settled_at", DateTime(timezone=True)),
        PrimaryKeyConstraint("group_id", "query", "epoch"),
    )
    Index("epochs_open", epochs.c.group_id, postgresql_where=epochs.c.outcome.is_(None))
    parts = Table(
        EPOCH_PARTS_TABLE,
        metadata,
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("spark_partition", Integer, nullable=False),
        Column("records", JSONB, nullable=False),  # {topic: records}
        PrimaryKeyConstraint("group_id", "query", "epoch", "spark_partition"),
    )
    chunks = Table(
        EPOCH_CHUNKS_TABLE,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),  # staging order
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("topic", Text, nullable=False),
        Column("records", Integer, nullable=False),
        Column("rows", Integer),  # what the plan writes; NULL without one
        Column("raw", LargeBinary, nullable=False),  # consumers.epochs.chunks
        Column("plan", LargeBinary),
        # Timestamps (ms) of up to 100 of its records, for the latency once published.
        Column("stamps", LargeBinary, nullable=False),
        # The route and release its plan was made for (`consumers.epochs.chunks.fingerprint`).
        Column("fingerprint", Text),
    )
    Index("epoch_chunks_of_epoch", chunks.c.group_id, chunks.c.query, chunks.c.epoch, chunks.c.id)
    staged = Table(
        EPOCH_STAGED_TABLE,
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
        # The lowest offset of the records the row counts (migration 0005; NULL before it).
        Column("first_offset", BigInteger),
        PrimaryKeyConstraint("group_id", "query", "epoch", "spark_partition", "topic", "partition"),
    )
    Index("epoch_staged_of_partition", staged.c.group_id, staged.c.topic, staged.c.partition)
    actions = Table(
        EPOCH_ACTIONS_TABLE,
        metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("action", Text, nullable=False),  # publish, discard
        Column("missing", Text, nullable=False),  # what the epoch lacked when it was acted on
        Column("records", BigInteger, nullable=False),  # staged records it published or discarded
        Column("requested_by", Text, nullable=False),
        Column("acted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
    watermarks = Table(
        EPOCH_WATERMARKS_TABLE,
        metadata,
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        # Every epoch of the query at or below it that the group kept is settled, and no
        # epoch at or below it can open again: its parts and records are a replay's.
        Column("settled_through", BigInteger, nullable=False),
        Column("moved_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        PrimaryKeyConstraint("group_id", "query"),
    )
    topics = Table(
        EPOCH_TOPICS_TABLE,
        metadata,
        Column("group_id", Text, nullable=False),
        Column("query", Text, nullable=False),
        Column("topic", Text, nullable=False),  # of a whole route, named with records
        Column("seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        PrimaryKeyConstraint("group_id", "query", "topic"),
    )
    return [epochs, parts, chunks, staged, actions, watermarks, topics]


@dataclass(frozen=True)
class LedgerNames:
    """The ledger's tables in one state schema, for SQL."""

    schema: str

    def __getattr__(self, name: str) -> sql.Identifier:
        tables = {
            "epochs": EPOCHS_TABLE,
            "parts": EPOCH_PARTS_TABLE,
            "chunks": EPOCH_CHUNKS_TABLE,
            "staged": EPOCH_STAGED_TABLE,
            "actions": EPOCH_ACTIONS_TABLE,
            "watermarks": EPOCH_WATERMARKS_TABLE,
            "topics": EPOCH_TOPICS_TABLE,
            "judge": EPOCH_JUDGE_FUNCTION,  # a function: `consumers.epochs.ledger.judge`
        }
        if name not in tables:
            raise AttributeError(name)
        return sql.Identifier(self.schema, tables[name])
