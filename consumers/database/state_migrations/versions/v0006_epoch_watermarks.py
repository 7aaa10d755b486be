"""Version 0006: a watermark per (group, query) of the epochs settled, so settled rows can go.

`epoch_watermarks.settled_through`: the highest settled epoch of the query below which the group
holds no open epoch. Epochs of a query publish in order, and the manifest (one partition, read
in order) names an epoch's parts before the next epoch's, so no epoch at or below it can open
again: its parts and records seen again are a replay's (a driver restarted after its markers
expired, an offsets reset). Set here from the rows kept so far, and moved in every transaction
that settles an epoch (`consumers.epochs.ledger`).
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_FROM_KEPT_ROWS = """
INSERT INTO "{schema}".epoch_watermarks (group_id, query, settled_through)
SELECT s.group_id, s.query, max(s.epoch) FROM "{schema}".epochs AS s
WHERE s.outcome IS NOT NULL AND NOT EXISTS (
    SELECT FROM "{schema}".epochs AS o
    WHERE o.group_id = s.group_id AND o.query = s.query AND o.outcome IS NULL AND o.epoch < s.epoch
)
GROUP BY s.group_id, s.query
ON CONFLICT DO NOTHING
"""


def upgrade(schema: str) -> None:
    # Idempotent, as every migration here: two members may meet it at once (under a lock), and
    # a migration cut short is run again.
    op.execute(
        f'CREATE TABLE IF NOT EXISTS "{schema}".epoch_watermarks ('
        "group_id text NOT NULL, query text NOT NULL, settled_through bigint NOT NULL, "
        "moved_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (group_id, query))"
    )
    # Each (group, query): its highest settled epoch with no open one below it.
    op.execute(_FROM_KEPT_ROWS.format(schema=schema))


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")
