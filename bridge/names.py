"""Names shared by the producer, the consumer and the tools: one place, no magic strings."""

from __future__ import annotations

from typing import Final

ENV_PREFIX: Final = "BRIDGE_"
ENV_NESTED_DELIMITER: Final = "__"
ENV_CONFIG_FILE: Final = "BRIDGE_CONFIG"
ENV_KAFKA_BOOTSTRAP: Final = "BRIDGE_KAFKA__BOOTSTRAP_SERVERS"
ENV_POSTGRES_DSN: Final = "BRIDGE_POSTGRES__DSN"

STACK_ENV_FILE: Final = "stack.env"
STACK_STATE_FILE: Final = "stack.json"
DEFAULT_STACK_DIR: Final = ".stack"

DEFAULT_STATE_SCHEMA: Final = "bridge"
POSTGRES_DATABASE: Final = "bridge"
POSTGRES_USER: Final = "bridge"
