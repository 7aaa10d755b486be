"""The layer contracts in pyproject.toml are exhaustive: every module and sub-package of each
root package sits in a layer of its package's contract (and a consumer sub-package's modules in
that sub-package's own), so a new module cannot slip in unplaced. Each contract failing on a
violation is tests/integration/test_import_contracts.py's part."""

from __future__ import annotations

import importlib
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
    "consumers.epochs": "consumer-epochs",
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


def test_every_module_of_the_consumer_is_behind_its_front_door() -> None:
    """A new module of `consumers` is forbidden to the shell until the front door exports it."""
    config = tomllib.loads((_ROOT / "pyproject.toml").read_text())
    (door,) = [c for c in config["tool"]["importlinter"]["contracts"]
               if c["id"] == "consumer-front-door"]  # fmt: skip
    assert door["source_modules"] == ["bridge_shell"]
    assert sorted(door["forbidden_modules"]) == sorted(_children("consumers"))


def test_the_front_door_gives_every_name_it_lists() -> None:
    import consumers

    assert sorted(consumers.__all__) == sorted(consumers._EXPORTS)
    for name in consumers.__all__:
        module, attribute = consumers._EXPORTS[name]
        assert getattr(consumers, name) is getattr(importlib.import_module(module), attribute)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        consumers.nothing_here  # noqa: B018 - the attribute's lookup is what is tested


@pytest.mark.parametrize(
    "package",
    [*[p for p in _PLACED_BY if p.startswith("consumers.")], "bridge_shell", "bridge_shell.spark",
     "bridge_shell.stack"],
)  # fmt: skip
def test_a_package_docstring_names_every_module_it_owns(package: str) -> None:
    """A newcomer finds the room by its name: each module is named in its package's
    docstring, in backquotes (a sub-package with its slash, `cli/`, or without)."""
    doc = importlib.import_module(package).__doc__ or ""
    names = [child.rsplit(".", 1)[1] for child in _children(package)]
    missing = [n for n in names if f"`{n}`" not in doc and f"`{n}/`" not in doc]
    assert missing == [], f"{package}'s docstring does not name {missing}"
