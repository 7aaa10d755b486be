"""The Kafka rights each of bridge's principals needs, and nothing more.

One table, used three ways: the secured local stack grants it, the tests take single rights
away from it to check the errors, and the README prints it for users to grant on their cluster.
Resource names are patterns: the stack grants on `*` (any topic, group, transactional id),
since it serves whatever a user runs on it; a production cluster names them (see README).

Why each right:
- producer: Write+Describe on its topic (Produce, metadata); Write+Describe on its
  transactional ids (InitProducerId, AddPartitionsToTxn, EndTxn; since KIP-679 this also
  covers idempotent writes, so no cluster-wide IdempotentWrite); Read on the marker groups and
  Read+Describe on the marker topic (AddOffsetsToTxn, TxnOffsetCommit carry the epoch marker;
  OffsetFetch reads it back); Create on the marker topic (the sink creates it on first use);
  Read on a source topic only for `--source kafka`.
- consumer: Read+Describe on its topics; Read on its group (join, heartbeat, and the offset
  mirror when enabled). Its positions live in PostgreSQL, so nothing else.
- tools (`offsets`, `txn`, `status`): Describe on topics and groups (log ranges, owners, the
  marker groups' stable offsets); Read on topics (the first committed record at an offset);
  Describe+Write on transactional ids (`txn show`, and `txn abort`, which fences an id).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from bridge.kafka_admin import TopicError
from bridge.names import DEFAULT_EPOCHS_TOPIC, DEFAULT_MARKER_TOPIC

Role = Literal["producer", "consumer", "tools"]
ROLES: Final[tuple[Role, ...]] = ("producer", "consumer", "tools")
ANY: Final = "*"


@dataclass(frozen=True)
class Grant:
    """`operation` on `resource` `name` (a literal name, or `*` for any)."""

    resource: Literal["topic", "group", "transactional_id", "cluster"]
    name: str
    operation: Literal["read", "write", "create", "describe", "describe_configs"]
    why: str


def grants(
    role: Role,
    *,
    topic: str = ANY,
    group: str = ANY,
    transactional_ids: str = ANY,
    marker_topic: str = DEFAULT_MARKER_TOPIC,
    source_topic: str | None = ANY,
    epochs_topic: str | None = DEFAULT_EPOCHS_TOPIC,
) -> tuple[Grant, ...]:
    """The rights of `role`. `source_topic` None: the producer reads no Kafka source.
    `epochs_topic`: the epoch manifest's, which the sink writes (`epochs=whole`, the default)
    and the consumer reads (`epochs: whole`, the default); None for a pipeline that sets
    `per-partition` on both."""
    if role == "producer":
        found = [
            Grant("topic", topic, "write", "produce the records"),
            Grant("topic", topic, "describe", "the topic's partitions and leaders"),
            Grant("transactional_id", transactional_ids, "write", "begin and commit a transaction"),
            Grant("transactional_id", transactional_ids, "describe", "find its coordinator"),
            Grant("group", group, "read", "the epoch marker joins the transaction"),
            Grant("group", group, "describe", "read the epoch marker back"),
            Grant("topic", marker_topic, "read", "the marker's offset commit"),
            Grant("topic", marker_topic, "describe", "the marker's offset fetch"),
            Grant("topic", marker_topic, "create", "the sink creates the marker topic once"),
        ]
        if source_topic is not None:
            found.append(Grant("topic", source_topic, "read", "--source kafka only"))
        if epochs_topic is not None:
            found += [
                Grant("topic", epochs_topic, "write", "the epoch manifest (epochs=whole)"),
                Grant("topic", epochs_topic, "describe", "the manifest topic's partition"),
                Grant("topic", epochs_topic, "create", "the sink creates the manifest topic"),
                Grant("topic", epochs_topic, "describe_configs", "the sink checks its retention"),
            ]
        return tuple(dict.fromkeys(found))
    if role == "consumer":
        found = [
            Grant("topic", topic, "read", "fetch the records"),
            Grant("topic", topic, "describe", "the topic's partitions and log ranges"),
            Grant("group", group, "read", "join the group; mirror offsets when enabled"),
        ]
        if epochs_topic is not None:
            found += [
                Grant("topic", epochs_topic, "read", "the epoch manifest (epochs: whole)"),
                Grant("topic", epochs_topic, "describe", "the manifest topic's partition"),
            ]
        return tuple(found)
    return (
        Grant("topic", topic, "describe", "log ranges and last stable offsets"),
        Grant("topic", topic, "read", "the first committed record at an offset"),
        Grant("group", group, "describe", "owners, and the marker groups' stable offsets"),
        Grant("transactional_id", transactional_ids, "describe", "`txn show`"),
        Grant("transactional_id", transactional_ids, "write", "`txn abort` fences an id"),
    )


_RESOURCE_TYPES: Final = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional_id": ResourceType.TRANSACTIONAL_ID,
    "cluster": ResourceType.BROKER,
}
_OPERATIONS: Final = {
    "read": AclOperation.READ,
    "write": AclOperation.WRITE,
    "create": AclOperation.CREATE,
    "describe": AclOperation.DESCRIBE,
    "describe_configs": AclOperation.DESCRIBE_CONFIGS,
}


def apply(
    admin_config: Mapping[str, str | int | float],
    user: str,
    wanted: Iterable[Grant],
    *,
    timeout: float,
) -> None:
    """Allow `wanted` to `User:<user>`, from any host; a grant that exists already is kept."""
    bindings = [
        AclBinding(
            _RESOURCE_TYPES[grant.resource],
            "kafka-cluster" if grant.resource == "cluster" else grant.name,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            _OPERATIONS[grant.operation],
            AclPermissionType.ALLOW,
        )
        for grant in wanted
    ]
    admin = AdminClient(dict(admin_config))
    for binding, future in admin.create_acls(bindings, request_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            raise TopicError(f"cannot grant {binding}: {exc.args[0].str()}") from exc


def add_scram_user(
    admin_config: Mapping[str, str | int | float], user: str, password: str, *, timeout: float
) -> None:
    """Create or change the SCRAM-SHA-512 credential of `user` (a running cluster's way; the
    stack's own users are made when the storage is formatted)."""
    admin = AdminClient(dict(admin_config))
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
        try:
            future.result(timeout)
        except KafkaException as exc:
            raise TopicError(f"cannot set the credential of {user!r}: {exc.args[0].str()}") from exc


def table_rights(mode: str, *, deletes: bool) -> tuple[str, ...]:
    """What the consumer's role needs on a target table in PostgreSQL: INSERT (but for update
    mode); for an upsert also SELECT (ON CONFLICT reads the conflicting row) and UPDATE; for
    update mode UPDATE and SELECT (it reads the keys); DELETE where a route has key columns,
    by which a tombstone deletes (a delete by key reads the key: SELECT too), and so does
    replace mode."""
    rights = [] if mode == "update" else ["INSERT"]
    if mode in ("upsert", "update"):
        rights += ["SELECT", "UPDATE"]
    if deletes or mode == "replace":
        rights += ["SELECT", "DELETE"]
    return tuple(dict.fromkeys(rights))
