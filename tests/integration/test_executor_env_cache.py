"""The executor environment's cache on a machine with two checkouts of the same code: they share
the archive, each driver links into its own installation, and links that dangle are rebuilt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bridge_shell.spark import executor_env
from bridge_shell.spark.executor_env import build_executor_env

_FILES = {"bridge/__init__.py": "VERSION = 1\n", "tenacity/__init__.py": "class Retrying: ...\n"}


def _installation(root: Path) -> dict[str, Path]:
    members = {}
    for inside, text in _FILES.items():
        path = root / "site-packages" / inside
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        members[inside] = path
    return members


def _use(monkeypatch: pytest.MonkeyPatch, members: dict[str, Path]) -> None:
    monkeypatch.setattr(executor_env, "_members", lambda: members)


def test_two_checkouts_share_the_archive_and_keep_their_own_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first, second = _installation(tmp_path / "first"), _installation(tmp_path / "second")
    _use(monkeypatch, first)
    built_first = build_executor_env(cache)
    _use(monkeypatch, second)
    built_second = build_executor_env(cache)

    assert built_first.archive == built_second.archive
    assert built_first.directory != built_second.directory
    shutil.rmtree(tmp_path / "first")  # one checkout removed: the other's driver still imports
    again = build_executor_env(cache)
    assert again.directory == built_second.directory
    assert (again.directory / "tenacity" / "__init__.py").read_text() == _FILES[
        "tenacity/__init__.py"
    ]


def test_a_directory_whose_links_dangle_is_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    members = _installation(tmp_path / "checkout")
    _use(monkeypatch, members)
    built = build_executor_env(cache)
    link = built.directory / "tenacity" / "__init__.py"
    link.unlink()
    link.symlink_to(tmp_path / "gone" / "__init__.py")  # as after its target was removed

    rebuilt = build_executor_env(cache)
    assert rebuilt.directory == built.directory
    assert (rebuilt.directory / "tenacity" / "__init__.py").read_text() == _FILES[
        "tenacity/__init__.py"
    ]
