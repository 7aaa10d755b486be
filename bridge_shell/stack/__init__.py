"""A local stack of real processes on loopback (`local`): Apache Kafka in KRaft mode, one
node or a cluster (`kafka`), PostgreSQL with an optional streaming standby (`postgres`), the
schema registry (`registry`), a Spark standalone cluster (`spark`); the processes' start and
stop (`process`); the secured variant's CA and certificates (`tls`), principals and ACLs
(`secure`), and the credentials docker-compose's secured overlay uses
(`compose_credentials`)."""

from __future__ import annotations

from bridge_shell.stack.local import LocalStack, StackState, StackStatus

__all__ = ["LocalStack", "StackState", "StackStatus"]
