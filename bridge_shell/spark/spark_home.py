"""A Spark home whose `python/lib/pyspark.zip` carries compiled bytecode.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on the PYTHONPATH of every Python process
it starts: the daemon of each executor and one per kind of driver-side call of a Python data
source (creating the writer, committing an epoch, looking sources up). The zip that PySpark ships
holds only sources, and Python never caches bytecode compiled from a zip, so each of those
processes compiles PySpark again: about 0.9 s of CPU each (measured: importing the streaming sink
runner takes 1.1 s from the shipped zip, 0.27 s from a compiled one). A Python data source pays it
three or four times on its first epoch, on the critical path.

The home built here is the installed one, linked entry by entry, except for that zip: the same
files plus each module's bytecode (hash-based and unchecked, so zipimport takes it as it is; a
Python whose magic number differs falls back to the sources). Built once per installation and
Python version, in a cache outside the work tree, and only for a pip-installed PySpark: a Spark
home the user chose (SPARK_HOME, spark-submit) is left as it is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from types import CodeType

_ZIP = Path("python") / "lib" / "pyspark.zip"


def installed_spark_home() -> Path | None:
    """The pip-installed PySpark's Spark home, if it has the zip this module replaces."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).parent
    return home if (home / _ZIP).is_file() and (home / "bin" / "spark-submit").is_file() else None


def precompiled_spark_home(cache: Path | None = None) -> Path | None:
    """The cached Spark home with a compiled pyspark.zip, built on first use; None if PySpark
    is not a pip installation with its own Spark home."""
    installed = installed_spark_home()
    if installed is None:
        return None
    shipped = installed / _ZIP
    stat = shipped.stat()
    key = hashlib.sha256(
        f"{installed}|{stat.st_size}|{stat.st_mtime_ns}|{sys.implementation.cache_tag}".encode()
    ).hexdigest()[:12]
    root = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bridge"
    home = root / f"spark-home-{key}"
    if (home / _ZIP).is_file():
        return home
    root.mkdir(parents=True, exist_ok=True)
    _prune(root)
    # Built aside and renamed into place: concurrent sessions (tests, a demo) never see half.
    building = Path(tempfile.mkdtemp(prefix=f"{home.name}.", dir=root))
    try:
        _link_entries(installed, building)
        _write_compiled_zip(shipped, building / _ZIP)
        building.chmod(0o755)  # mkdtemp's 0700 would hide it from other users (a Docker image)
        os.rename(building, home)
    except OSError:
        if not (home / _ZIP).is_file():
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return home


def _prune(root: Path) -> None:
    """Remove the homes of PySpark installations that are gone (a removed checkout or
    virtualenv): their links lead nowhere, and each holds a 26 MB zip. Homes being built
    (`spark-home-<key>.<random>`) are another process's."""
    for home in root.glob("spark-home-*"):
        built = "." not in home.name
        if built and home.is_dir() and not (home / "bin").exists():  # a dangling link: gone
            shutil.rmtree(home, ignore_errors=True)


def _link_entries(installed: Path, home: Path) -> None:
    """Every entry a link to the installed one, but for the directories down to the zip."""
    replaced = [Path(*_ZIP.parts[: i + 1]) for i in range(len(_ZIP.parts))]
    for directory in [Path(), *replaced[:-1]]:
        (home / directory).mkdir(exist_ok=True)
        for entry in (installed / directory).iterdir():
            inside = directory / entry.name
            if inside not in replaced:
                (home / inside).symlink_to(entry)


def _write_compiled_zip(shipped: Path, target: Path) -> None:
    with zipfile.ZipFile(shipped) as source, zipfile.ZipFile(target, "w") as compiled:
        for info in source.infolist():
            data = source.read(info)
            compiled.writestr(info, data)
            if info.filename.endswith(".py"):
                code = compile(data, info.filename, "exec", dont_inherit=True)
                compiled.writestr(info.filename[:-3] + ".pyc", unchecked_hash_pyc(code, data))


def unchecked_hash_pyc(code: CodeType, source: bytes) -> bytes:
    """A hash-based, unchecked .pyc of `code` (PEP 552): the interpreter's magic number, the
    flags (hash-based, do not check the source), the source's hash, the marshalled code."""
    flags = (0b01).to_bytes(4, "little")
    return (
        importlib.util.MAGIC_NUMBER
        + flags
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )
