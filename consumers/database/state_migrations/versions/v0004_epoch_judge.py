"""Version 0004: the one judge of whole epochs, and staged plans that say what they were made for.

- `epoch_lacks(group, query, epoch, held_back, counted)`: what an epoch lacks to be whole, one
  row per lack; none when it is whole. Every path that settles an epoch asks it under the
  epoch's row lock: the publisher (`consumers.epochs.publisher`), the batch that publishes an
  epoch itself (`consumers.epochs.ledger.publish_in_batch`), and the operator's `bridge epochs
  publish|discard`. `held_back`: the topics whose records wait for the epoch (the group's
  routes decide; the epoch's parts may name others). `counted`: the records a batch holds of
  the epoch, `{"<spark partition>": {"<topic>": n}}`, judged instead of those staged.
- `epoch_chunks.fingerprint`: the route and release a chunk's plan was made for; a plan made for
  other ones is not run, and its records are planned again (`consumers.epochs.chunks`).
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# The rule, in the order a reader checks it: the driver's epoch record; every part it names (and
# any other part of the epoch the manifest holds: a replay with fewer tasks names only its own);
# record for record, each part's held-back topics against the records staged (or counted) of
# them; and no records of a part the manifest does not know.
_JUDGE = """
CREATE OR REPLACE FUNCTION "{schema}".epoch_lacks(
    p_group text, p_query text, p_epoch bigint, p_held_back text[], p_counted jsonb DEFAULT NULL
) RETURNS TABLE (lack text, spark_partition integer, topic text, have bigint, wrote bigint)
LANGUAGE sql STABLE AS $judge$
    WITH record AS (
        SELECT e.parts FROM "{schema}".epochs AS e
        WHERE e.group_id = p_group AND e.query = p_query AND e.epoch = p_epoch
          AND e.parts IS NOT NULL
    ), parts AS (
        SELECT p.spark_partition, p.records FROM "{schema}".epoch_parts AS p
        WHERE p.group_id = p_group AND p.query = p_query AND p.epoch = p_epoch
    ), written AS (
        SELECT parts.spark_partition, w.key AS topic, w.value::bigint AS wrote
        FROM parts, jsonb_each_text(parts.records) AS w
        WHERE w.key = ANY (p_held_back)
    ), have AS (
        SELECT s.spark_partition, s.topic, sum(s.records)::bigint AS have
        FROM "{schema}".epoch_staged AS s
        WHERE p_counted IS NULL
          AND s.group_id = p_group AND s.query = p_query AND s.epoch = p_epoch
        GROUP BY s.spark_partition, s.topic
        UNION ALL
        SELECT c.key::integer, t.key, t.value::bigint
        FROM jsonb_each(coalesce(p_counted, '{{}}'::jsonb)) AS c, jsonb_each_text(c.value) AS t
    )
    SELECT 'no epoch record', NULL::integer, NULL::text, NULL::bigint, NULL::bigint
    WHERE NOT EXISTS (SELECT FROM record)
    UNION ALL
    SELECT 'part missing', named.part, NULL::text, NULL::bigint, NULL::bigint
    FROM record, unnest(record.parts) AS named(part)
    WHERE named.part NOT IN (SELECT parts.spark_partition FROM parts)
    UNION ALL
    SELECT CASE WHEN coalesce(h.have, 0) < w.wrote THEN 'short' ELSE 'overstaged' END,
           w.spark_partition, w.topic, coalesce(h.have, 0), w.wrote
    FROM record, written AS w
    LEFT JOIN have AS h ON h.spark_partition = w.spark_partition AND h.topic = w.topic
    WHERE coalesce(h.have, 0) <> w.wrote
    UNION ALL
    SELECT DISTINCT 'stray part', h.spark_partition, NULL::text, NULL::bigint, NULL::bigint
    FROM record, have AS h
    WHERE h.spark_partition NOT IN (SELECT parts.spark_partition FROM parts)
$judge$
"""


def upgrade(schema: str) -> None:
    # Idempotent, as every migration here: two members may meet it at once (under a lock), and
    # a migration cut short is run again.
    op.execute(_JUDGE.format(schema=schema))
    op.execute(f'ALTER TABLE "{schema}".epoch_chunks ADD COLUMN IF NOT EXISTS fingerprint text')


def downgrade(schema: str) -> None:
    raise NotImplementedError("bridge's state tables are only ever migrated forward")
