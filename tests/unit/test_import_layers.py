"""The layer contracts in pyproject.toml are exhaustive: every module and sub-package of each
root package sits in a layer of its package's contract (and a consumer sub-package's modules in
that sub-package's own), so a new module cannot slip in unplaced. Each contract failing on a
violation is tests/integration/test_import_contracts.py's part."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
# Each package whose children a contract must place, and the id of that contract.
_PLACED_BY = {
    "consumers": "consumer-layers",
    "consumers.membership": "consumer-membership",
    "consumers.batch": "consumer-batch",
    "consumers.tables": "consumer-tables",
    "consumers.decoding": "consumer-decoding",
    "consumers.database": "consumer-database",
    "spark_jobs": "sink-layers",
    "bridge": "foundation-layers",
    "bridge_shell": "shell-layers",
}


def _contracts() -> dict[str, set[str]]:
    config = tomllib.loads((_ROOT / "pyproject.toml").read_text())
    named: dict[str, set[str]] = {}
    for contract in config["tool"]["importlinter"]["contracts"]:
        entries = contract.get("layers", []) + contract.get("modules", [])
        named[contract["id"]] = {m for entry in entries for m in re.split(r"[|:]", entry) if m}
        named[contract["id"]] = {m.strip() for m in named[contract["id"]]}
    return named


def _children(package: str) -> list[str]:
    """The modules and sub-packages directly inside `package`, in Python source."""
    folder = _ROOT.joinpath(*package.split("."))
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(("_", ".")) and path.name != "__main__.py":
            continue
        if path.suffix == ".py" or (path / "__init__.py").exists():
            found.append(f"{package}.{path.stem}")
    return found


@pytest.mark.parametrize("package", list(_PLACED_BY))
def test_every_module_of_a_package_is_in_its_contracts_layers(package: str) -> None:
    named = _contracts()[_PLACED_BY[package]]
    assert [child for child in _children(package) if child not in named] == []
