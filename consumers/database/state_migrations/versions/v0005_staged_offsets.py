"""Version 0005: where each staged run of records begins in its Kafka partition.

`epoch_staged.first_offset`: the lowest offset of the records each row counts, so that an epoch
is never published ahead of another epoch's records that come before its own in a partition
they share (of another query: epochs of one query publish in epoch order already), which
would let an earlier record of a key overwrite a later one (`consumers.epochs.ledger`:
`comes_first`, and the in-batch guard, `publish_in_batch`). NULL for the rows staged before
this version: their order is not known, and they hold nothing back.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    # Idempotent, as every migration here: two members may meet it at once (under a lock), and
    # a migration cut short is run again.
    op.execute(f'ALTER TABLE "{schema}".epoch_staged ADD COLUMN IF NOT EXISTS first_offset bigint')
    op.execute(
        f'CREATE INDEX IF NOT EXISTS epoch_staged_of_partition ON "{schema}".epoch_staged '
        "(group_id, topic, partition)"
    )


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")
