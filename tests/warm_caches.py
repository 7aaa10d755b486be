"""The caches every Spark driver of a test run reads, built before the run's sessions start.

In `~/.cache/bridge`: the executors' Python environment, the precompiled Spark home, and the
class-data archive of a driver's classes (tests/jvm_archive.py). Every driver of every worker
only reads them: two builders of one cache entry would race. `make test` builds them here,
beside the lint (on a clean clone the archive alone is half a minute of one core, which the
sessions' start would otherwise spend alone); each session's controller calls `warm` again
(a read, once built) for the drivers' options.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests import jvm_archive


def warm() -> str | None:
    """The caches built if they are not; the drivers' JVM options that map the archive, or
    None when drivers run without it."""
    from bridge_shell.spark.executor_env import build_executor_env
    from bridge_shell.spark.spark_home import precompiled_spark_home

    build_executor_env()
    home = precompiled_spark_home()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bridge"
    return jvm_archive.driver_options(cache, home)


def main() -> None:
    # The tests' JVMs run C1 only (tests/conftest.py): the archive's dump does too.
    flags = os.environ.get("JAVA_TOOL_OPTIONS", "")
    if jvm_archive.C1_ONLY not in flags.split():
        os.environ["JAVA_TOOL_OPTIONS"] = f"{flags} {jvm_archive.C1_ONLY}".strip()
    if warm() is None and not os.environ.get(jvm_archive.ENV_OFF):
        print("the Spark driver archive could not be dumped: drivers run without it")


if __name__ == "__main__":
    main()
