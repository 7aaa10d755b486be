"""The executors' environment: bridge's packer against venv-pack, the tool Spark's Python
packaging docs name.

    python -m bench.executor_env [--rounds 3]

For each, in alternated rounds: the time to build the archive from this installation (a fresh
cache each round), its size, and the time an executor takes to unpack it (`tar -x`, as Spark's
own unpacking does, into an empty directory), and whether it holds bridge's own code, without
which an executor cannot run the sink. Figures go to bench/results/executor-env-*.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from bench.common import scratch_dir, write_results
from bridge_shell.spark.executor_env import build_executor_env

_VENV_PACK = Path(sys.executable).with_name("venv-pack")


def _ours(scratch: Path) -> Path:
    return build_executor_env(cache=scratch / "cache").archive


def _venv_pack(scratch: Path, *, compressed: bool) -> Path:
    # Its default is gzip; an uncompressed tar, as ours is, is its fastest to build and unpack.
    archive = scratch / ("venv.tar.gz" if compressed else "venv.tar")
    subprocess.run(
        [str(_VENV_PACK), "-p", sys.prefix, "-o", str(archive), "-q"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return archive


def _holds_our_code(archive: Path) -> bool:
    # bridge installed in development mode (pip install -e) is only a path to the checkout in
    # site-packages: a packer of the virtualenv does not see its files.
    with tarfile.open(archive) as tar:
        return any(
            name.endswith("spark_jobs/sink.py") or name == "spark_jobs/sink.py"
            for name in tar.getnames()
        )


def _round(tool: str, scratch: Path) -> dict[str, Any]:
    work = scratch / tool
    work.mkdir()
    started = time.perf_counter()
    compressed = tool == "venv-pack"
    archive = _ours(work) if tool == "bridge" else _venv_pack(work, compressed=compressed)
    built = time.perf_counter() - started
    unpacked = work / "unpacked"
    unpacked.mkdir()
    started = time.perf_counter()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(unpacked)], check=True)
    unpack = time.perf_counter() - started
    figures = {
        "build_s": round(built, 2),
        "bytes": archive.stat().st_size,
        "unpack_s": round(unpack, 2),
        "holds_bridge_code": _holds_our_code(archive),
    }
    shutil.rmtree(work)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    if not _VENV_PACK.exists():
        sys.exit(f"{_VENV_PACK} is missing: install the dev extras (pip install -e '.[dev]')")
    runs: dict[str, list[dict[str, Any]]] = {"bridge": [], "venv-pack": [], "venv-pack-tar": []}
    with scratch_dir("bridge-bench-executor-env-") as scratch:
        for index in range(rounds):
            order = list(runs) if index % 2 == 0 else list(reversed(runs))
            for tool in order:
                runs[tool].append(_round(tool, scratch))
                print(f"round {index} {tool}: {runs[tool][-1]}", flush=True)
    summary = {
        tool: {
            "build_s_median": statistics.median(r["build_s"] for r in results),
            "megabytes": round(results[-1]["bytes"] / 1e6, 1),
            "unpack_s_median": statistics.median(r["unpack_s"] for r in results),
            "holds_bridge_code": all(r["holds_bridge_code"] for r in results),
        }
        for tool, results in runs.items()
    }
    ours = summary["bridge"]
    ratios = {}
    for tool in ("venv-pack", "venv-pack-tar"):
        theirs = summary[tool]
        ratios[tool] = {
            "size": round(theirs["megabytes"] / ours["megabytes"], 1),
            "build": round(theirs["build_s_median"] / ours["build_s_median"], 1),
            "unpack": round(theirs["unpack_s_median"] / ours["unpack_s_median"], 1),
        }
    for tool, figures in summary.items():
        print(f"{tool:14} {figures}")
    for tool, ratio in ratios.items():
        print(f"{tool} / bridge: size {ratio['size']}x, build {ratio['build']}x, "
              f"unpack {ratio['unpack']}x")  # fmt: skip
    path = write_results(
        "executor-env", {"rounds": runs, "summary": summary, "over_bridge": ratios}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
