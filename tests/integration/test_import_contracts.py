"""Each import-linter contract in pyproject.toml fails on the violation it exists to stop.

The packages are copied, one import that breaks exactly one rule is added to the copy, and
`lint-imports` runs on the copy for that contract alone. The untouched copy must pass first, so a
failure comes from the added import and nothing else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# In `make check`'s quick loop too.
pytestmark = pytest.mark.quick

_ROOT = Path(__file__).resolve().parents[2]
_PACKAGES = ("bridge", "bridge_shell", "consumers", "spark_jobs")
_LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# (contract id, module file in the copy, the import that breaks that contract alone)
_VIOLATIONS = [
    ("roots", "bridge/settings.py", "import consumers.decoding.records"),
    ("roots", "consumers/decoding/records.py", "import bridge_shell.tables"),
    ("roots", "spark_jobs/faults.py", "import bridge_shell.maven"),
    ("sides", "consumers/decoding/records.py", "import spark_jobs.faults"),
    ("consumer-layers", "consumers/decoding/records.py", "import consumers.service"),
    ("consumer-layers", "consumers/database/state.py", "import consumers.decoding.rows"),
    (
        "consumer-membership",
        "consumers/membership/leases.py",
        "import consumers.membership.kafka_health",
    ),
    ("consumer-batch", "consumers/batch/pipelined.py", "import consumers.batch.committer"),
    # The planner hands the committer data; it never calls up into the batch's owner.
    ("consumer-batch", "consumers/batch/planner.py", "import consumers.batch.lifecycle"),
    # The ledger judges; it never reaches up into the publication that asks it.
    ("consumer-epochs", "consumers/epochs/ledger.py", "import consumers.epochs.publisher"),
    # The epochs sit under the batch that holds, stages and publishes them.
    ("consumer-layers", "consumers/epochs/assembly.py", "import consumers.batch.lifecycle"),
    ("consumer-tables", "consumers/tables/table_follower.py", "import consumers.tables.routing"),
    ("consumer-tables", "consumers/tables/targets.py", "import consumers.tables.applier"),
    ("consumer-decoding", "consumers/decoding/records.py", "import consumers.decoding.rows"),
    (
        "consumer-database",
        "consumers/database/pg_errors.py",
        "import consumers.database.db_session",
    ),
    ("sink-layers", "spark_jobs/kafka_rows.py", "import spark_jobs.sink"),
    ("foundation-layers", "bridge/errors.py", "import bridge.settings"),
    ("shell-layers", "bridge_shell/stack/process.py", "import bridge_shell.cli"),
    ("acyclic", "bridge_shell/stack/tls.py", "import bridge_shell.stack.secure"),
    # The shell past the consumer's front door, to a module the front door itself exports from.
    ("consumer-front-door", "bridge_shell/cli/offsets.py", "import consumers.database.offsets"),
]


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    copy.mkdir()
    for package in _PACKAGES:
        shutil.copytree(
            _ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(_ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def _lint(copy: Path, contract: str) -> subprocess.CompletedProcess[str]:
    # The copy comes first on the path, ahead of the editable install of the checkout.
    env = {**os.environ, "PYTHONPATH": str(copy)}
    return subprocess.run(
        [str(_LINT_IMPORTS), "--no-cache", "--contract", contract],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("contract", "module", "line"), _VIOLATIONS, ids=[f"{c}:{m}" for c, m, _ in _VIOLATIONS]
)
def test_the_contract_fails_on_its_violation(
    tmp_path: Path, contract: str, module: str, line: str
) -> None:
    copy = _copy(tmp_path)
    clean = _lint(copy, contract)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    target = copy / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    broken = _lint(copy, contract)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "BROKEN" in broken.stdout
    # The report names the module that broke it (the cycle report by its name in the package).
    assert Path(module).stem in broken.stdout


def test_every_contract_is_exercised() -> None:
    """A contract added to pyproject.toml without a violation here would go untested."""
    import tomllib

    config = tomllib.loads((_ROOT / "pyproject.toml").read_text())
    ids = {contract["id"] for contract in config["tool"]["importlinter"]["contracts"]}
    assert ids == {contract for contract, _, _ in _VIOLATIONS}
