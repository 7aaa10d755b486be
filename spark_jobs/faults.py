"""Fault injection for tests: off unless `BRIDGE_SINK_FAULTS` names a rules file.

The rules file is a JSON list; each rule picks a point in a write task, or in the driver's commit
hook (the `manifest-*` points, where `partition` and `attempt` do not apply), and what happens
there:

    {"point": "mid-produce" | "before-commit" | "after-commit" | "manifest-before-commit"
              | "manifest-after-commit",
     "prefix": "...", "partition": 0, "epoch": 3, "attempt": 0,   # filters; absent = any
     "after_rows": 500,                                          # mid-produce only
     "action": "fail" | "hang" | "exit" | "pause", "seconds": 10}   # seconds: pause only

A rule fires once across all processes: firing creates `<rules file>.<index>.fired` exclusively,
which is also how a test learns that the point was reached (useful with `hang`, after which the
test kills the driver from outside). The file holds the pid of the Python worker it fired in, so
that a test on a cluster finds the executor running the task.

`fail` raises in the task (Spark retries it), `exit` kills the Python worker abruptly, `hang`
sleeps until the process is killed, `pause` sleeps for `seconds` and goes on (a test breaks
something meanwhile: the broker, the link).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.errors import BridgeError

ENV_FAULTS = "BRIDGE_SINK_FAULTS"
POINTS = (
    "mid-produce",
    "before-commit",
    "after-commit",
    "manifest-before-commit",
    "manifest-after-commit",
)


class InjectedFault(BridgeError):
    """Raised by a `fail` rule; never raised unless a test asked for it. `point`: where."""

    def __init__(self, what: str, *, point: str) -> None:
        super().__init__(what)
        self.point = point


@dataclass(frozen=True)
class TaskFaults:
    """The rules that may fire in one write task, chosen once when the task starts."""

    rules_path: Path
    rules: tuple[tuple[int, dict[str, Any]], ...]

    @classmethod
    def for_task(
        cls, *, prefix: str, partition: int, epoch: int, attempt: int
    ) -> TaskFaults | None:
        path = os.environ.get(ENV_FAULTS)
        if not path or not Path(path).is_file():
            return None
        rules = json.loads(Path(path).read_text())
        me = {"prefix": prefix, "partition": partition, "epoch": epoch, "attempt": attempt}
        chosen = tuple(
            (i, rule)
            for i, rule in enumerate(rules)
            if all(rule.get(k) in (None, v) for k, v in me.items())
        )
        return cls(Path(path), chosen) if chosen else None

    @classmethod
    def for_driver(cls, *, prefix: str, epoch: int) -> TaskFaults | None:
        """The rules of the driver's commit hook for `epoch`."""
        path = os.environ.get(ENV_FAULTS)
        if not path or not Path(path).is_file():
            return None
        rules = json.loads(Path(path).read_text())
        me = {"prefix": prefix, "epoch": epoch}
        chosen = tuple(
            (i, rule)
            for i, rule in enumerate(rules)
            if rule["point"].startswith("manifest-")
            and all(rule.get(k) in (None, v) for k, v in me.items())
        )
        return cls(Path(path), chosen) if chosen else None

    def after_rows(self) -> int | None:
        counts = [r["after_rows"] for _, r in self.rules if r["point"] == "mid-produce"]
        return min(counts) if counts else None

    def reach(self, point: str) -> None:
        for index, rule in self.rules:
            if rule["point"] == point and self._claim(index):
                _act(rule, f"injected fault at {point} (rule {index})", point)

    def _claim(self, index: int) -> bool:
        try:
            fd = os.open(f"{self.rules_path}.{index}.fired", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
        finally:
            os.close(fd)
        return True


def _act(rule: dict[str, Any], what: str, point: str) -> None:
    action = rule["action"]
    if action == "pause":
        time.sleep(float(rule.get("seconds", 10)))
        return
    if action == "fail":
        raise InjectedFault(what, point=point)
    if action == "exit":
        os._exit(17)
    if action == "hang":
        while True:
            time.sleep(3600)
    raise ValueError(f"unknown fault action {action!r} ({what})")
