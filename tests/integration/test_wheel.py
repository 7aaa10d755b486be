"""The package as a user gets it: the wheel built from this tree by the README's install block,
installed (not editable) into a clean virtualenv, and `bridge demo` run from it outside the
checkout, where nothing of the checkout can be imported or read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from pathlib import Path

import pytest

from bridge_shell.stack import LocalStack
from tests.integration.test_readme import block_with, commands, substituted

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_wheel_installs_into_a_clean_virtualenv_and_its_demo_passes(tmp_path: Path) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    # No BRIDGE_* setting, no virtualenv of ours: only what the user's shell would have.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = ""
    # The README's install block, line by line: built with the project's `build`, installed
    # with the clean virtualenv's pip, run from the clean virtualenv.
    build, install, show_version = commands(block_with("bash", "python -m build"))
    wheels = tmp_path / "dist"
    venv = tmp_path / "venv"
    _run(["python3", "-m", "venv", str(venv)], cwd=tmp_path, env=env, timeout=120)
    built = substituted(build, {"python ": f"{sys.executable} ", "dist": str(wheels)})
    _run(["bash", "-c", built], cwd=ROOT, env=env, timeout=600)
    assert len(list(wheels.glob(f"bridge-{version}-*.whl"))) == 1, list(wheels.iterdir())
    # The Avro reader is C: the wheel is one Python's and one platform's, as the README says.
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    named = f"bridge-{version}-{tag}-{tag}-{sysconfig.get_platform().replace('-', '_')}.whl"
    assert [w.name for w in wheels.iterdir()] == [named], list(wheels.iterdir())
    block = block_with("bash", "python -m build")
    assert "# dist/bridge-<version>-cp3X-cp3X-<platform>.whl" in block, block
    installed = substituted(install, {"pip ": f"{venv / 'bin' / 'pip'} ", "dist": str(wheels)})
    # Quiet, and without compiling every installed module first (half of pip's CPU here,
    # about 20 s): what is installed, and how it runs, is the same.
    _run(["bash", "-c", installed + " -q --no-compile"], cwd=tmp_path, env=env, timeout=900)
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    user = tmp_path / "elsewhere"
    user.mkdir()

    assert show_version == "bridge --version"
    assert _run(["bash", "-c", show_version], cwd=user, env=env, timeout=60).strip() == (
        f"bridge {version}"
    )
    where = _run([str(venv / "bin" / "python"), "-c",
                  "import bridge_shell, consumers, spark_jobs; "
                  "print(bridge_shell.__file__, consumers.__file__, spark_jobs.__file__)"],
                 cwd=user, env=env, timeout=60)  # fmt: skip
    assert all(path.startswith(str(venv)) for path in where.split()), where
    # PostgreSQL runs as its own user when the tests run as root: a stack directory it can enter.
    stack = Path(tempfile.mkdtemp(prefix="bridge-test-wheel-"))
    stack.chmod(0o755)
    try:
        demo = _run(["bridge", "demo", "--records", "2000", "--stack-dir", str(stack)],
                    cwd=user, env=env, timeout=900)  # fmt: skip
    finally:
        LocalStack(stack).down()  # the demo stops its stack; this is for a demo that failed
        shutil.rmtree(stack, ignore_errors=True)
    assert "exactly once: 2,000 orders sent, 2,000 rows" in demo, demo[-3000:]
    assert "0 missing, 0 duplicated, 0 dead letters" in demo, demo[-3000:]
