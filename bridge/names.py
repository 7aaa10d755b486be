"""Names shared by the producer, the consumer and the tools: one place, no magic strings."""

from __future__ import annotations

from typing import Final

ENV_PREFIX: Final = "BRIDGE_"
ENV_NESTED_DELIMITER: Final = "__"
ENV_CONFIG_FILE: Final = "BRIDGE_CONFIG"
ENV_KAFKA_BOOTSTRAP: Final = "BRIDGE_KAFKA__BOOTSTRAP_SERVERS"
ENV_POSTGRES_DSN: Final = "BRIDGE_POSTGRES__DSN"
ENV_KAFKA_PROPERTIES: Final = "BRIDGE_KAFKA__PROPERTIES"
ENV_SPARK_MASTER: Final = "BRIDGE_SPARK__MASTER"
ENV_SCHEMA_REGISTRY_URL: Final = "BRIDGE_SCHEMA_REGISTRY__URL"
ENV_SCHEMA_REGISTRY_PROPERTIES: Final = "BRIDGE_SCHEMA_REGISTRY__PROPERTIES"
ENV_STACK_DIR: Final = "BRIDGE_STACK_DIR"

STACK_ENV_FILE: Final = "stack.env"
STACK_STATE_FILE: Final = "stack.json"
DEFAULT_STACK_DIR: Final = ".stack"

DEFAULT_STATE_SCHEMA: Final = "bridge"
POSTGRES_DATABASE: Final = "bridge"
POSTGRES_USER: Final = "bridge"

# The consumer's own objects in PostgreSQL, inside its state schema.
OFFSETS_TABLE: Final = "offsets"
DEAD_LETTERS_TABLE: Final = "dead_letters"
DEAD_LETTER_REPLAYS_TABLE: Final = "dead_letter_replays"
OFFSET_RESETS_TABLE: Final = "offset_resets"
OFFSET_DELETIONS_TABLE: Final = "offset_deletions"
# Whole epochs (consumers.epochs.ledger): the ledger of a group's epochs, the manifest's
# parts, the chunks of records staged until their epoch is whole, their counts, and the
# operators' actions.
EPOCHS_TABLE: Final = "epochs"
EPOCH_PARTS_TABLE: Final = "epoch_parts"
EPOCH_CHUNKS_TABLE: Final = "epoch_chunks"
# The one judge of whether an epoch is whole: a function in the state schema (migration 0004).
EPOCH_JUDGE_FUNCTION: Final = "epoch_lacks"
EPOCH_STAGED_TABLE: Final = "epoch_staged"
EPOCH_ACTIONS_TABLE: Final = "epoch_actions"
# Per (group, query), the epoch through which every epoch the group knows is settled
# (migration 0006): what tells a replayed epoch once its settled rows are pruned.
EPOCH_WATERMARKS_TABLE: Final = "epoch_watermarks"
# Per (group, query), the topics of its whole routes the query's manifest names (migration
# 0008): which queries share a topic, and which topics no sink writes.
EPOCH_TOPICS_TABLE: Final = "epoch_topics"
# Alembic's version table for the tables above: which version of their shape the schema holds.
STATE_VERSION_TABLE: Final = "state_version"
ADVANCE_OFFSETS_FUNCTION: Final = "advance_offsets"
# The session name of a group's members, which lets a member end a stalled member's session.
CONSUMER_APPLICATION_PREFIX: Final = "bridge-consumer:"
UPSERT_STAGE_PREFIX: Final = "bridge_stage_"  # a temporary table per upsert target

# Kafka: the sink's format name, its defaults, and the provenance headers of every record.
SINK_FORMAT: Final = "bridge-kafka"
DEFAULT_TRANSACTIONAL_ID_HEAD: Final = "bridge-"
DEFAULT_MARKER_TOPIC: Final = "bridge-epoch-markers"
DEFAULT_EPOCHS_TOPIC: Final = "bridge-epochs"  # the epoch manifest (bridge.epoch_manifest)
MARKER_GROUP_INFIX: Final = ".marker.p"
PROVENANCE_QUERY: Final = "bridge.query"
PROVENANCE_PARTITION: Final = "bridge.partition"
PROVENANCE_EPOCH: Final = "bridge.epoch"
# A random id of the task attempt that wrote the record: two committed attempts of one
# (query, partition, epoch) (a replay once the markers expired) differ in it.
PROVENANCE_ATTEMPT: Final = "bridge.attempt"
# Beside the provenance, on a record of a sink that writes the epoch manifest (`epochs=whole`):
# its epoch is published whole. A record with provenance and without it (a sink with
# `epochs=per-partition`, or of a release before whole epochs) is applied per partition.
PROVENANCE_WHOLE: Final = "bridge.epochs"
WHOLE_EPOCHS: Final = b"whole"

# Prometheus metrics of the consumer (counters gain `_total` when exported).
METRIC_RECORDS_APPLIED: Final = "bridge_consumer_records_applied"
METRIC_RECORDS_READ: Final = "bridge_consumer_records_read"
METRIC_DEAD_LETTERS: Final = "bridge_consumer_dead_letters"
METRIC_BATCHES: Final = "bridge_consumer_batches"
METRIC_BATCH_SECONDS: Final = "bridge_consumer_batch_duration_seconds"
METRIC_LATENCY_SECONDS: Final = "bridge_consumer_end_to_end_latency_seconds"
METRIC_LAG: Final = "bridge_consumer_lag"
METRIC_PARTITIONS: Final = "bridge_consumer_partitions"
METRIC_DATABASE_RECONNECTS: Final = "bridge_consumer_database_reconnects"
METRIC_REGISTRY_UNAVAILABLE: Final = "bridge_consumer_schema_registry_unavailable"
METRIC_TABLE_MISMATCH: Final = "bridge_consumer_table_schema_mismatch"
METRIC_IGNORED_FIELDS: Final = "bridge_consumer_ignored_fields"
METRIC_DATABASE_REFUSALS: Final = "bridge_consumer_database_refusals"
METRIC_INFO: Final = "bridge_consumer_info"
METRIC_EPOCHS_PUBLISHED: Final = "bridge_consumer_epochs_published"
METRIC_RECORDS_STAGED: Final = "bridge_consumer_records_staged"
METRIC_OLDEST_INCOMPLETE_EPOCH: Final = "bridge_consumer_oldest_incomplete_epoch_seconds"
METRIC_EPOCHS_OWNER: Final = "bridge_consumer_epochs_owner"
METRIC_EPOCH_RECORDS_HELD: Final = "bridge_consumer_epoch_records_held"

# Prometheus metrics of the producer job's driver.
METRIC_PRODUCER_EPOCHS: Final = "bridge_producer_epochs"
METRIC_PRODUCER_ROWS: Final = "bridge_producer_rows_written"
METRIC_PRODUCER_PARTITIONS_SKIPPED: Final = "bridge_producer_partitions_skipped"
METRIC_PRODUCER_EPOCH_ROWS: Final = "bridge_producer_epoch_rows"
METRIC_PRODUCER_EPOCH_BYTES: Final = "bridge_producer_epoch_bytes"
METRIC_PRODUCER_TXN_OVERHEAD_SECONDS: Final = "bridge_producer_transaction_overhead_seconds"
METRIC_PRODUCER_BATCH_SECONDS: Final = "bridge_producer_batch_duration_seconds"
METRIC_PRODUCER_INPUT_RATE: Final = "bridge_producer_input_rows_per_second"
METRIC_PRODUCER_PROCESSING_RATE: Final = "bridge_producer_processed_rows_per_second"
METRIC_PRODUCER_LAST_EPOCH: Final = "bridge_producer_last_committed_epoch"
METRIC_PRODUCER_QUERY_ACTIVE: Final = "bridge_producer_query_active"
