"""What a cluster's executors need to run the sink, packed once and shipped with the job.

On a cluster the sink runs in Python workers that executors start on other machines. Spark ships
PySpark itself (each worker's Spark home has it). The rest goes in one archive:
- our packages `bridge` and `spark_jobs`;
- the libraries the sink imports there: confluent-kafka (with its bundled librdkafka), pyarrow
  (the Arrow batches the writer receives), tenacity, and python-json-logger (its log lines).

Spark unpacks the archive into each executor's working directory (`spark.archives`, as
`bridge-env`), and the Python workers find it on their path (`spark.executorEnv.PYTHONPATH`).
So an executor needs nothing installed but Java and a Python of the driver's minor version on
the same platform (the libraries carry compiled code).

The archive is made from the distributions installed beside the driver, not downloaded: the
executors run exactly the versions the driver runs. It is built once per content and cached.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ARCHIVE_ALIAS = "bridge-env"  # the directory name each executor unpacks the archive as
EXECUTOR_DISTRIBUTIONS = ("confluent-kafka", "pyarrow", "tenacity", "python-json-logger")
OUR_PACKAGES = ("bridge", "spark_jobs")
# Not needed to run the sink. The libraries' bytecode is kept (the executors' Python is the
# driver's version), ours is left out (it may be older than its source).
_SKIPPED_DIRS = frozenset({"tests", "include"})
_OURS_SKIPPED_DIRS = frozenset({"__pycache__"})
# pyarrow's parts that the sink never loads (its Arrow batches need pyarrow.lib and what that
# links): Flight and S3 are only loaded by their own modules, and the unversioned copies of
# libarrow_python are for building extensions. A third of pyarrow's bytes.
_SKIPPED_FILES = re.compile(r"^pyarrow/(.*flight.*|.*s3.*|libarrow_python\.so(\.\d+\.\d+\.\d+)?)$")


@dataclass(frozen=True, kw_only=True)
class ExecutorEnv:
    """A built environment: `directory` for the driver's own Python processes, `archive` for
    the executors (the same files)."""

    directory: Path
    archive: Path

    def spark_conf(self, python: str) -> dict[str, str]:
        """The settings that ship the archive and point the executors' Python workers at it.
        `python`: the interpreter the executors run (PYSPARK_PYTHON)."""
        return {
            "spark.archives": f"{self.archive}#{ARCHIVE_ALIAS}",
            "spark.executorEnv.PYTHONPATH": ARCHIVE_ALIAS,
            "spark.pyspark.python": python,
        }


def default_executor_python() -> str:
    """The interpreter this Python (or its virtualenv) was made from: on a cluster of
    machines built alike it is at the same path, and it has the driver's minor version."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return str(Path(base).resolve())


def build_executor_env(cache: Path | None = None) -> ExecutorEnv:
    """The environment for the code installed here, built on first use, then taken from the
    cache (`~/.cache/bridge/executor-env-<content hash>.tar`, and beside it the driver's
    directory of links, `executor-env-<content hash>-<installation hash>`)."""
    members = _members()
    key = _content_key(members)
    root = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bridge"
    # The driver's copy only links to the files here, so it belongs to this installation: two
    # checkouts of the same code share the archive, but links into one of them would dangle
    # once it is removed, and the other's driver would import a half-empty package.
    directory = root / f"executor-env-{key}-{_installation_key(members)}"
    archive = root / f"executor-env-{key}.tar"
    if not _links_resolve(directory, members):
        root.mkdir(parents=True, exist_ok=True)
        _prune(root, keep=key)
        if directory.exists():  # its files were removed or replaced under it: useless to all
            shutil.rmtree(directory)
        _write_directory(members, directory, link=True)
    if not archive.is_file():
        _write_archive(members, archive)
    for used in (directory, archive):  # what a job used lately is never pruned
        os.utime(used)
    return ExecutorEnv(directory=directory, archive=archive)


def _installation_key(members: dict[str, Path]) -> str:
    where = "\0".join(sorted(str(path) for path in members.values()))
    return hashlib.sha256(where.encode()).hexdigest()[:8]


def _links_resolve(directory: Path, members: dict[str, Path]) -> bool:
    """Whether every member is in `directory` and leads to a file (a dangling link does not)."""
    return directory.is_dir() and all((directory / inside).is_file() for inside in members)


def _prune(root: Path, *, keep: str) -> None:
    """Remove the environments of older code (each change of our sources makes a new one) that
    no job has started with for a week: a streaming job runs for long, and Spark serves the
    archive again to each executor that replaces a lost one."""
    week_ago = time.time() - 7 * 86_400
    for entry in root.glob("executor-env-*"):
        if keep not in entry.name and entry.stat().st_mtime < week_ago:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def write_executor_env(target: Path) -> ExecutorEnv:
    """The environment as `<target>.tar` and `<target>/` (for spark-submit: run it where
    the driver's own Python processes find `bridge-env/` in their working directory)."""
    members = _members()
    directory = target
    archive = target.with_name(target.name + ".tar")
    _write_directory(members, directory)
    _write_archive(members, archive)
    return ExecutorEnv(directory=directory, archive=archive)


# -- what goes in ------------------------------------------------------------------------------


def _members() -> dict[str, Path]:
    """Each file of the environment: its path inside the archive -> its path here."""
    members: dict[str, Path] = {}
    for name in EXECUTOR_DISTRIBUTIONS:
        dist = importlib.metadata.distribution(name)
        for file in dist.files or ():
            inside = PurePosixPath(file.as_posix())
            # Scripts and data outside site-packages (`../../bin/...`) are not importable.
            if ".." in inside.parts or _SKIPPED_DIRS.intersection(inside.parts[:-1]):
                continue
            if _SKIPPED_FILES.match(str(inside)):
                continue
            located = Path(str(dist.locate_file(file)))
            if located.is_file():
                members[str(inside)] = located
    for package in OUR_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"{package} is not importable here")
        source = Path(spec.origin).parent
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source)
            if path.suffix not in {".py", ".typed"} or not path.is_file():
                continue
            if not _OURS_SKIPPED_DIRS.intersection(relative.parts):
                members[str(PurePosixPath(package, *relative.parts))] = path
    return members


def _content_key(members: dict[str, Path]) -> str:
    digest = hashlib.sha256(f"{sys.implementation.cache_tag}|{platform.machine()}".encode())
    for name in EXECUTOR_DISTRIBUTIONS:
        digest.update(f"|{name}=={importlib.metadata.version(name)}".encode())
    for package in OUR_PACKAGES:  # our sources change without a version: hash their content
        for inside, path in sorted(members.items()):
            if inside.startswith(f"{package}/"):
                digest.update(inside.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


# -- how it is written ---------------------------------------------------------------------------


def _write_directory(members: dict[str, Path], directory: Path, *, link: bool = False) -> None:
    # Built aside and renamed into place: a concurrent run never sees half of it.
    directory.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"{directory.name}.", dir=directory.parent))
    try:
        for inside, path in members.items():
            target = building / inside
            target.parent.mkdir(parents=True, exist_ok=True)
            if link:
                target.symlink_to(path)
            else:
                shutil.copy2(path, target)
        building.chmod(0o755)
        if directory.exists():
            if link:  # the cache's: a concurrent job built the same content, and may use it
                return
            shutil.rmtree(directory)
        try:
            os.rename(building, directory)
        except OSError:
            if not (link and directory.is_dir()):  # else: built by a concurrent job meanwhile
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _write_archive(members: dict[str, Path], archive: Path) -> None:
    handle, scratch = tempfile.mkstemp(prefix=f"{archive.name}.", dir=archive.parent)
    os.close(handle)
    try:
        # Not compressed: Spark unpacks the archive once on the driver and once in every
        # executor, and gunzip took 1.4 s of CPU each time (the tar alone 0.4 s) for 66 MB
        # instead of 180. Across a network, a file system that compresses does it better.
        with tarfile.open(scratch, "w") as tar:
            for inside, path in sorted(members.items()):
                info = tar.gettarinfo(str(path), arcname=inside)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with path.open("rb") as data:
                    tar.addfile(info, data)
        os.chmod(scratch, 0o644)
        os.replace(scratch, archive)
    finally:
        Path(scratch).unlink(missing_ok=True)
