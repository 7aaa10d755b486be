"""The offsets table's one home: its shape (`schema`) and every statement on it (`store`).

`(group, topic, partition) -> next_offset`, with an owner lease (`owner`, `owner_epoch`) and
`updated_at`; no module outside this package spells its columns.
"""

from consumers.database.offsets.schema import define_tables
from consumers.database.offsets.store import (
    Lease,
    OffsetStore,
    PartitionKey,
    ResetMove,
    Run,
    Runs,
    StoredPosition,
    StoredRow,
    application_name,
    applied_position,
    stored_positions,
)

__all__ = [
    "Lease",
    "OffsetStore",
    "PartitionKey",
    "ResetMove",
    "Run",
    "Runs",
    "StoredPosition",
    "StoredRow",
    "application_name",
    "applied_position",
    "define_tables",
    "stored_positions",
]
