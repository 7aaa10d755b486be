"""Version 0007: the task attempts each partition's records came from, beside its offset.

`offsets.runs`: per (Spark query, Spark partition) that wrote to the partition, the last epoch
and attempt id (`bridge.attempt`) whose records the group applied, written in each batch's
transaction with the offset. A second committed attempt of an epoch (a query restarted from its
checkpoint once its markers expired) is told by it and left out on routes applied per
partition (`consumers.batch.replays`). NULL for rows written before this version: their first
batch after it stores them.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    # Idempotent, as every migration here: two members may meet it at once (under a lock), and
    # a migration cut short is run again.
    op.execute(f'ALTER TABLE "{schema}".offsets ADD COLUMN IF NOT EXISTS runs jsonb')


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")
