"""Running the `bridge` command line as a user does: its own process, output captured."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def run_bridge(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge_shell.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
    )
