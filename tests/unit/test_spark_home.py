"""The compiled Spark home: the same files, plus bytecode zipimport takes as it is."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from bridge_shell.spark.spark_home import _link_entries, _write_compiled_zip, precompiled_spark_home


def _fake_home(root: Path) -> Path:
    home = root / "installed"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (home / "jars").mkdir()
    lib = home / "python" / "lib"
    lib.mkdir(parents=True)
    (home / "python" / "pyspark").mkdir()
    (lib / "py4j-src.zip").write_bytes(b"")
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as shipped:
        shipped.writestr("fakespark/__init__.py", "ANSWER = 42\n")
        shipped.writestr("fakespark/data.txt", "not code")
    return home


def test_the_compiled_zip_keeps_every_file_and_adds_bytecode_that_is_used(tmp_path: Path) -> None:
    home = _fake_home(tmp_path)
    compiled = tmp_path / "compiled.zip"
    _write_compiled_zip(home / "python" / "lib" / "pyspark.zip", compiled)

    names = set(zipfile.ZipFile(compiled).namelist())
    assert names == {"fakespark/__init__.py", "fakespark/__init__.pyc", "fakespark/data.txt"}
    probe = "import fakespark; print(fakespark.ANSWER, fakespark.__file__)"
    shown = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(compiled)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown[0] == "42"
    assert shown[1].endswith("__init__.pyc")  # the bytecode, not a compilation of the source


def test_the_home_links_everything_but_the_zip(tmp_path: Path) -> None:
    installed = _fake_home(tmp_path)
    built = tmp_path / "built"
    built.mkdir()
    _link_entries(installed, built)

    assert (built / "bin").resolve() == (installed / "bin").resolve()
    assert (built / "python" / "pyspark").is_symlink()
    assert (built / "python" / "lib" / "py4j-src.zip").is_symlink()
    assert not (built / "python").is_symlink()
    assert not (built / "python" / "lib" / "pyspark.zip").exists()  # written, not linked


def test_the_real_home_is_built_once_and_reused(tmp_path: Path) -> None:
    first = precompiled_spark_home(tmp_path)
    assert first is not None
    zipped = first / "python" / "lib" / "pyspark.zip"
    stamp = zipped.stat().st_mtime_ns
    assert precompiled_spark_home(tmp_path) == first
    assert zipped.stat().st_mtime_ns == stamp
    assert (first / "bin" / "spark-submit").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no half-built leftovers
    assert first.stat().st_mode & 0o777 == 0o755  # readable by the users a process runs as


def test_homes_of_removed_installations_go_when_a_home_is_built(tmp_path: Path) -> None:
    gone = tmp_path / "spark-home-0123456789ab"  # its checkout removed: the links dangle
    gone.mkdir()
    (gone / "bin").symlink_to(tmp_path / "removed-checkout" / "bin")
    building = tmp_path / "spark-home-ba9876543210.x1y2"  # another process's, mid-build
    building.mkdir()

    home = precompiled_spark_home(tmp_path)
    assert home is not None
    assert not gone.exists()
    assert building.exists()
