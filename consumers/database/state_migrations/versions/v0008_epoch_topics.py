"""Version 0008: the topics each Spark query's manifest names, per group.

`epoch_topics`: a row per (group, query, topic) for every topic of the group's whole routes that
a part of the query names with records, written by the member that stages the manifest, in its
batch's transaction (`consumers.epochs.staging`), its `seen_at` moved at most hourly, and pruned
once unseen for the manifest's retention. What every member of the group reads to tell which
queries share a topic (they are one unit, read by one member) and which topics no sink writes
(shared by all the members, as per-partition routes are).
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    # Idempotent, as every migration here: two members may meet it at once (under a lock), and
    # a migration cut short is run again.
    op.execute(
        f'CREATE TABLE IF NOT EXISTS "{schema}".epoch_topics ('
        "group_id text NOT NULL, query text NOT NULL, topic text NOT NULL, "
        "seen_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (group_id, query, topic))"
    )


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")
