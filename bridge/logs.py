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


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
