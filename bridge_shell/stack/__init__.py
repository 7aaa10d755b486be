"""A local stack of real processes: Apache Kafka in KRaft mode and PostgreSQL, on loopback."""

from __future__ import annotations

from bridge_shell.stack.local import LocalStack, StackState, StackStatus

__all__ = ["LocalStack", "StackState", "StackStatus"]
