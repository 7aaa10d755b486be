"""`bridge consume`: the long-running Kafka -> PostgreSQL consumer."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from bridge import logs
from bridge.names import DEFAULT_STACK_DIR, STACK_ENV_FILE
from bridge.settings import load_settings

ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", envvar="BRIDGE_CONFIG", show_envvar=True, help="The YAML file."),
]
StackDir = Annotated[
    Path,
    typer.Option(
        "--stack-dir",
        envvar="BRIDGE_STACK_DIR",
        show_envvar=True,
        help="A local stack whose stack.env fills in Kafka and PostgreSQL addresses.",
    ),
]


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
