"""Structured logs: one JSON object a line, with the fields passed through `extra=`.

python-json-logger does the formatting; only the names of the standard fields are ours.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter


class _BridgeJsonFormatter(JsonFormatter):
    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        log_data["level"] = str(log_data.get("level", "")).lower()
        return log_data


def formatter() -> logging.Formatter:
    return _BridgeJsonFormatter(
        "{asctime}{levelname}{name}{message}",
        style="{",
        datefmt="%Y-%m-%dT%H:%M:%S",
        rename_fields={
            "asctime": "time",
            "levelname": "level",
            "name": "logger",
            "exc_info": "error",
        },
        json_default=str,
    )


# Libraries that narrate routine work at INFO: Alembic's migration context on every start, an
# HTTP request line for every schema fetched from the registry (confluent-kafka's registry
# client runs on httpx2, a fork of httpx with loggers of its own), py4j's connections to the
# Spark driver's JVM (a line each epoch, and on every stop). Their warnings still show.
_QUIET_AT_INFO = ("alembic", "httpx", "httpcore", "httpx2", "httpcore2", "py4j")


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for name in _QUIET_AT_INFO:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
