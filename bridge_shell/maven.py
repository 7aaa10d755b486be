"""Jars from Maven Central, resolved once per pom into a cache outside the work tree.

The cache directory is keyed by the pom's content, so fresh clones reuse it and a changed pom
resolves anew. Used for the Kafka broker (bridge_shell/stack/kafka-pom.xml) and Spark's Kafka
connector (spark_jobs/jars/pom.xml). Both poms are package data: an installed wheel has them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

from bridge.errors import MissingToolError, StackError

_COMPLETE = ".complete"


def packaged_pom(package: str, *parts: str) -> Path:
    """A pom shipped inside a package, as a file Maven can read (`-f`), in a checkout and in an
    installed wheel alike."""
    return Path(str(files(package).joinpath(*parts)))


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise MissingToolError(
            "java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)"
        )
    return found


def cached_jars_dir(pom: Path, name: str, override_env: str) -> Path:
    """`$override_env` if set, else `~/.cache/bridge/<name>-<hash of the pom>`."""
    if os.environ.get(override_env):
        return Path(os.environ[override_env])
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "bridge" / f"{name}-{digest}"


def resolve_jars(pom: Path, jars_dir: Path, *, override_env: str) -> Path:
    """Copy the runtime dependencies of `pom` into `jars_dir`, once; return the directory."""
    if (jars_dir / _COMPLETE).exists():
        return jars_dir
    if not pom.is_file():
        raise StackError(f"no pom at {pom}: set {override_env} to a directory of the jars")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingToolError("mvn", "install Apache Maven (Debian: apt-get install maven)")
    java_binary()
    jars_dir.parent.mkdir(parents=True, exist_ok=True)
    # Copy into a scratch directory and rename, so an interrupted download is never taken as done.
    scratch = Path(tempfile.mkdtemp(prefix=jars_dir.name + ".", dir=jars_dir.parent))
    argv = [
        mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
        f"-DoutputDirectory={scratch}", "-DincludeScope=runtime",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        tail = (result.stdout + result.stderr).strip()[-2000:]
        raise StackError(f"Maven could not resolve the jars of {pom}:\n{tail}")
    (scratch / _COMPLETE).touch()
    try:
        scratch.rename(jars_dir)
    except OSError:
        # Another process finished first; its copy is as good as ours.
        shutil.rmtree(scratch, ignore_errors=True)
    return jars_dir


ENV_SPARK_KAFKA_JARS = "BRIDGE_SPARK_KAFKA_JARS"


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka connector (source and built-in sink), resolved from Maven Central once."""
    pom = packaged_pom("spark_jobs", "jars", "pom.xml")
    jars_dir = resolve_jars(
        pom,
        cached_jars_dir(pom, "spark-kafka-jars", ENV_SPARK_KAFKA_JARS),
        override_env=ENV_SPARK_KAFKA_JARS,
    )
    return sorted(str(jar) for jar in jars_dir.glob("*.jar"))
