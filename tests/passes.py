"""`make test`'s two passes side by side: every test on the plain stack, and beside it the tests
marked `secured` again on the secured stack (pytest --secure) on a worker of its own.

One after the other they took 20-22 minutes and then 2.3 more, though the plain pass leaves
about a quarter of the two cores idle (its fault tests mostly wait); the secured pass, about 8
minutes on one worker, fits in that. The two sessions share the heavy-test slots
(tests/heavy_slots.py: at most two heavy tests at once in both), take their ports from ranges
apart (tests/conftest.py), and read the caches built before either starts
(tests/warm_caches.py). The secured pass's report is held until it ends and printed after the
plain pass's, so that the two never interleave; the exit status is the first failure's.

    python -m tests.passes --pytest "<pytest command line>" PATH...
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import warm_caches
from tests.heavy_slots import ENV_DIR

# Apart from the plain pass's default (20000-31999), below the kernel's ephemeral ports.
_SECURED_PORTS = "8000-19999"
_SECURED_WORKERS = "1"
# A pytest stopped by Ctrl-C stops its stacks first; it gets this long before it is killed.
_STOP_BOUND_S = 120.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.passes", description=__doc__)
    parser.add_argument("--pytest", required=True, help="the pytest command line, quoted")
    parser.add_argument("paths", nargs="+", help="what the plain pass runs")
    args = parser.parse_args(argv)
    plain_pass, secured_pass = commands(shlex.split(args.pytest), args.paths)
    warm_caches.main()  # a read when `make test` built them beside the lint
    with tempfile.TemporaryDirectory(prefix="bridge-test-passes-") as shared:
        env = {**os.environ, ENV_DIR: shared}
        report = Path(shared) / "secured.log"
        with report.open("wb") as sink:
            secured = subprocess.Popen(
                secured_pass,
                env={**env, "BRIDGE_TEST_PORTS": _SECURED_PORTS},
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
            print("the tests marked `secured` run beside this pass on the secured stack; "
                  "their report follows this one's", flush=True)  # fmt: skip
            try:
                plain = subprocess.run(plain_pass, env=env, check=False).returncode
                secured_status = secured.wait()
            except KeyboardInterrupt:
                _stop(secured)
                raise
        print("\n== the tests marked `secured`, on the secured stack (pytest --secure)", flush=True)
        sys.stdout.buffer.write(report.read_bytes())
        sys.stdout.flush()
    return plain or secured_status


def commands(pytest: list[str], paths: list[str]) -> tuple[list[str], list[str]]:
    """The plain pass's command line (`paths` on the plain stack), and the secured pass's."""
    return [*pytest, *paths], [*pytest, "-n", _SECURED_WORKERS, "--secure", "tests/integration"]


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C reached it too (one process group): it is given its bound to stop its stacks."""
    try:
        process.wait(timeout=_STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
