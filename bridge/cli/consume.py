"""`bridge consume`: the long-running Kafka -> PostgreSQL consumer."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

from bridge import logs
from bridge.cli.options import ConfigFile, StackDir
from bridge.names import DEFAULT_STACK_DIR, STACK_ENV_FILE
from bridge.settings import load_settings


def consume(config: ConfigFile = None, stack_dir: StackDir = Path(DEFAULT_STACK_DIR)) -> None:
    """Apply committed Kafka records to PostgreSQL, exactly once, until SIGTERM or SIGINT."""
    from consumers.service import ConsumerService

    logs.configure()
    settings = load_settings(config, env_file=stack_dir / STACK_ENV_FILE)
    service = ConsumerService(settings)

    def request_stop(signum: int, frame: FrameType | None) -> None:
        service.stop()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    service.start()
    service.run()
