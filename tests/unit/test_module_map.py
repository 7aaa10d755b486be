"""docs/architecture.md names every module of the four packages, so the map stays true."""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
_PACKAGES = ("bridge", "bridge_shell", "consumers", "spark_jobs")


def _module_map() -> str:
    text = (_ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## Module map")
    return text[start : text.index("\n## ", start + 1)]


def test_every_module_is_in_the_map() -> None:
    table = _module_map()
    missing = []
    for package in _PACKAGES:
        for path in sorted((_ROOT / package).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            relative = path.relative_to(_ROOT)
            # A row names the module itself, or the sub-package it belongs to as a whole.
            named = f"`{relative}`" in table or f"{path.name}`" in table
            sub_packages = relative.parents[:-2]  # below the root package
            whole_package = any(f"`{package}/`" in table for package in sub_packages)
            if not (named or whole_package):
                missing.append(str(relative))
    assert missing == []
