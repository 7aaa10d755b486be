"""Where the producer job reads and checkpoints: a local path, or any Hadoop file system URI.

Spark hands a location with a scheme (`s3a://`, `hdfs://`, `abfss://`, `gs://`) to Hadoop as it
is; only a local path is made absolute here (so that it does not depend on the executors'
working directories), and only a local path can be checked before Spark starts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import urlsplit

PROGRESS_FILE = "bridge-sink-progress.json"


def local_path(location: str | Path) -> Path | None:
    """The local path `location` names (a plain path or a `file:` URI); None for any other
    Hadoop file system."""
    if isinstance(location, Path):
        return location
    scheme = urlsplit(location).scheme
    if not scheme:
        return Path(location)
    if scheme == "file":
        return Path(urlsplit(location).path)
    return None


def spark_location(location: str | Path) -> str:
    """`location` as Spark gets it: a local path absolute, a URI unchanged."""
    local = local_path(location)
    return str(local.resolve()) if local is not None else str(location)


def progress_path(checkpoint: str | Path) -> Path:
    """Where the sink's per-epoch counters go, on the driver's machine: beside Spark's own
    logs in a local checkpoint; for a remote checkpoint, in the driver's state directory under
    a name derived from the checkpoint, so that a restart of the same query finds them."""
    local = local_path(checkpoint)
    if local is not None:
        return local.resolve() / PROGRESS_FILE
    state = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    name = hashlib.sha256(str(checkpoint).rstrip("/").encode()).hexdigest()[:16]
    return state / "bridge" / "progress" / f"{name}.json"
