"""What `bridge txn` shows and does: the committed epoch of each Spark partition of a producer,
read from its epoch markers, and the abort of a lingering transaction by fencing its id."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, Producer

from bridge.kafka_admin import KafkaAdmin, TopicError
from bridge.kafka_client_log import ClientLog
from bridge.names import MARKER_GROUP_INFIX
from spark_jobs.epoch_markers import Marker, partition_of_marker_group
from spark_jobs.epoch_transaction import TaskCoordinates
from spark_jobs.sink_options import ID_POOL_SIZE, IdNaming


@dataclass(frozen=True, kw_only=True)
class PartitionEpoch:
    partition: int
    epoch: int | None  # None: no epoch committed, or the marker could not be read
    details: Mapping[str, object] = field(default_factory=dict)
    problem: str | None = None  # why the marker could not be read (an open transaction, ...)


def committed_epochs(admin: KafkaAdmin, prefix: str, marker_topic: str) -> list[PartitionEpoch]:
    """One entry per Spark partition that has a marker group; read with a stable fetch, so an
    epoch still in an open transaction is not reported as committed."""
    found = []
    for group in admin.group_ids(prefix + MARKER_GROUP_INFIX):
        partition = partition_of_marker_group(prefix, group)
        if partition is None:
            continue
        try:
            committed = admin.stable_committed(group, [(marker_topic, 0)])
        except TopicError as exc:
            found.append(PartitionEpoch(partition=partition, epoch=None, problem=str(exc)))
            continue
        marker = Marker.from_committed(committed[0]) if committed else None
        found.append(
            PartitionEpoch(
                partition=partition,
                epoch=marker.epoch if marker else None,
                details=marker.details if marker else {},
            )
        )
    return sorted(found, key=lambda p: p.partition)


def transactional_ids(
    prefix: str, partitions: list[int], epoch: int | None, naming: IdNaming
) -> list[str]:
    """The ids the sink's tasks of `partitions` use for `epoch` under `naming`; with no epoch,
    under `pooled`, every id of each partition's pool."""
    if naming is IdNaming.PER_EPOCH and epoch is None:
        raise ValueError("per-epoch ids need the epoch")
    epochs = range(ID_POOL_SIZE) if naming is IdNaming.POOLED and epoch is None else [epoch or 0]
    return [
        TaskCoordinates(
            query_id="", prefix=prefix, partition=p, epoch=e, attempt=0
        ).transactional_id(naming)
        for p in partitions
        for e in epochs
    ]


def fence(client_config: Mapping[str, str | int | float], transactional_id: str) -> None:
    """Take over `transactional_id`: the broker aborts its open transaction, if any, and fences
    every earlier holder, which then fails on its next call instead of committing."""
    log = ClientLog()
    producer = Producer(
        {**client_config, "transactional.id": transactional_id, "logger": log.logger}
    )
    try:
        producer.init_transactions(60)
    except KafkaException as exc:
        cause = f"{exc.args[0].str()}{log.cause(producer)}"
        raise TopicError(f"cannot fence {transactional_id!r}: {cause}") from exc
    finally:
        producer.flush(5)
