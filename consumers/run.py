"""The consumer as a process: settings, structured logs, signals, the collector, the loop.

`bridge consume` and `python -m consumers` both end here; SIGTERM and SIGINT finish the batch
in hand and leave the group.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from bridge import logs
from bridge.errors import BridgeError
from bridge.names import DEFAULT_STACK_DIR, ENV_CONFIG_FILE, ENV_STACK_DIR, STACK_ENV_FILE
from bridge.settings import ConsumerSettings, load_settings, stack_env_files

_YOUNG_COLLECTION_THRESHOLD = 50_000
_TRACKED_PER_RECORD = 5  # containers the collector tracks per record of a batch, about
EXIT_UNEXPECTED = 1  # an error nothing handles; 2 is a refusal (configuration, permissions)
log = logging.getLogger("bridge.consumer")


def run_consumer(config: Path | None, stack_dir: Path) -> None:
    """Apply committed Kafka records to PostgreSQL, exactly once, until SIGTERM or SIGINT."""
    from consumers.service import ConsumerService

    logs.configure()
    settings = load_settings(config, env_file=stack_env_files(stack_dir, "consumer"))
    service = ConsumerService(settings)

    stopped_by: list[int] = []

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopped_by.append(signum)  # logged once the loop has ended, not from the handler
        service.stop()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        service.start()
        _tune_garbage_collector(settings.consumer_to_run())
        service.run()
        if stopped_by:
            log.info(
                "stopped on %s: the batch in hand settled, the member left its group",
                signal.Signals(stopped_by[0]).name,
            )
    except BridgeError:  # a refusal with its own message: the caller prints it, exit 2
        raise
    except Exception as exc:
        # A bug or a fault nothing here handles: one JSON line with what the member held, and
        # a non-zero exit for the supervisor, which starts it again from the stored offsets.
        log.critical(
            "the consumer stopped on an unexpected error: %s: %s",
            type(exc).__name__,
            exc,
            exc_info=True,
            extra=service.context(),
        )
        raise SystemExit(EXIT_UNEXPECTED) from None


def _tune_garbage_collector(config: ConsumerSettings) -> None:
    """Keep the collector off the per-record path.

    A batch holds thousands of short-lived containers (decoded values, rows) that reference
    counting frees at the batch's end; with the default threshold of 700 allocations the
    collector scans them over and over while the batch is built, and every full collection walks
    every module loaded at start-up. Frozen, the start-up objects are never scanned again; the
    higher threshold lets a batch's garbage die by reference count first. Cycles are still
    collected, only less often.

    The threshold grows with the records a member keeps alive at once: two batches (one in
    flight, one being planned), and, with whole epochs, the records held back for their epoch
    and the larger batch that completes it. Below that, every batch ran young collections over
    records still in use (57 of them, 0.5 s of 4.9, for bench/epochs.py's 1M records)."""
    alive = 2 * config.batch_max_records
    if config.whole_epochs:
        alive += config.epochs_hold_records + config.batch_max_records
    gc.freeze()
    gc.set_threshold(max(_YOUNG_COLLECTION_THRESHOLD, _TRACKED_PER_RECORD * alive), 20, 100)


def main(argv: list[str] | None = None) -> None:
    """`python -m consumers --config FILE [--stack-dir DIR]`, as `bridge consume`."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.command(help=run_consumer.__doc__)
    def consume(
        config: Annotated[
            Path | None,
            typer.Option("--config", help=f"The YAML file (or ${ENV_CONFIG_FILE})."),
        ] = None,
        stack_dir: Annotated[
            Path,
            typer.Option(
                "--stack-dir",
                envvar=ENV_STACK_DIR,
                help=f"A local stack whose {STACK_ENV_FILE} fills in addresses.",
            ),
        ] = Path(DEFAULT_STACK_DIR),
    ) -> None:
        try:
            run_consumer(config, stack_dir)
        except BridgeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None

    app(args=argv, prog_name="python -m consumers")
