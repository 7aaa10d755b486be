"""`bridge consume`: the long-running Kafka -> PostgreSQL consumer."""

from __future__ import annotations

import gc
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
    _tune_garbage_collector()
    service.run()


def _tune_garbage_collector() -> None:
    """Keep the collector off the per-record path.

    A batch holds thousands of short-lived containers (decoded values, rows) that reference
    counting frees at the batch's end; with the default threshold of 700 allocations the
    collector scans them over and over while the batch is built, and every full collection walks
    every module loaded at start-up. Frozen, the start-up objects are never scanned again; the
    higher threshold lets a batch's garbage die by reference count first. Cycles are still
    collected, only less often."""
    gc.freeze()
    gc.set_threshold(_YOUNG_COLLECTION_THRESHOLD, 20, 100)


_YOUNG_COLLECTION_THRESHOLD = 50_000
