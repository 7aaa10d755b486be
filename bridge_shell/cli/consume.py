"""`bridge consume`: the long-running Kafka -> PostgreSQL consumer."""

from __future__ import annotations

from pathlib import Path

from bridge.names import DEFAULT_STACK_DIR
from bridge_shell.cli.options import ConfigFile, StackDir


def consume(config: ConfigFile = None, stack_dir: StackDir = Path(DEFAULT_STACK_DIR)) -> None:
    """Apply committed Kafka records to PostgreSQL, exactly once, until SIGTERM or SIGINT."""
    from consumers.run import run_consumer

    run_consumer(config, stack_dir)
