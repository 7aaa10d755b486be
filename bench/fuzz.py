"""The C Avro reader under AddressSanitizer and UndefinedBehaviorSanitizer, fuzzed for longer;
or, with `--protobuf`, the Protobuf reader.

`python -m bench.fuzz --examples 20000` (also `make fuzz`) builds `consumers/decoding/_avro_body.c`
with `-fsanitize=address,undefined` into a copy of the `consumers` package in a scratch directory,
then runs the reader's tests against that build: the differential fuzz against fastavro
(tests/unit/test_avro_fuzz.py, with `--examples` per property and fresh random examples each run),
the hostile-schema reproducers and the reader's own tests. Python allocates with malloc
(PYTHONMALLOC=malloc) so that ASan sees every object the reader touches; any sanitizer report ends
the run. Writes `bench/results/fuzz-<time>.json`: examples, seconds, tests passed, and every
sanitizer report found (none, when all is well).

`python -m bench.fuzz --protobuf --examples 20000` does the same for the Protobuf reader: its
differential fuzz against the protobuf runtime (tests/unit/test_proto_fuzz.py), the C reader of
plain fields (`consumers/decoding/_proto_body.c`) built under the sanitizers, and its row tests;
to `bench/results/fuzz-protobuf-<time>.json`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from bench.common import scratch_dir, write_results

ROOT = Path(__file__).parents[1]
TESTS = ["tests/unit/test_avro_fuzz.py", "tests/unit/test_avro_hostile.py",
         "tests/unit/test_avro_body.py"]  # fmt: skip
PROTOBUF_TESTS = ["tests/unit/test_proto_fuzz.py", "tests/unit/test_proto_rows.py"]
SANITIZE = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
_REPORT = re.compile(r"(ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer)[^\n]*")


def build(scratch: Path) -> Path:
    """The package with its reader built under the sanitizers; returns the path to put first."""
    tree = scratch / "site"
    shutil.copytree(ROOT / "consumers", tree / "consumers",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))  # fmt: skip
    env = {**os.environ, "CFLAGS": f"{SANITIZE} -O1 -g", "LDFLAGS": SANITIZE}
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tree),
         "--build-temp", str(scratch / "build"), "--force"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for module in ("_avro_body", "_proto_body"):
        built = tree / "consumers" / "decoding" / f"{module}{suffix}"
        assert built.exists(), f"the sanitized build of {module} is missing"
    return tree


def runtime(library: str) -> str:
    path = subprocess.run(["gcc", f"-print-file-name={library}"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    if not Path(path).is_file():
        raise SystemExit(f"{library} not found: install gcc's sanitizer runtimes (libasan8)")
    return path


def sanitized_env(tree: Path, examples: int) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "LD_PRELOAD": f"{runtime('libasan.so')} {runtime('libubsan.so')}",
        "PYTHONMALLOC": "malloc",
        # CPython's own allocations are not ours to judge: leaks off; the rest aborts.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "BRIDGE_FUZZ_EXAMPLES": str(examples),
        "BRIDGE_FUZZ_RANDOM": "1",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000, help="examples per property")
    parser.add_argument("--protobuf", action="store_true", help="the Protobuf reader instead")
    args = parser.parse_args()
    if args.protobuf:
        fuzz("protobuf", "_proto_body", PROTOBUF_TESTS, args.examples)
    else:
        fuzz("avro", "_avro_body", TESTS, args.examples)


def fuzz(reader: str, module: str, tests: list[str], examples: int) -> None:
    """`tests` against the sanitized build of `consumers.decoding.<module>`, `examples` fresh
    examples a property; the figures to bench/results/fuzz[-protobuf]-*.json."""
    with scratch_dir("bridge-fuzz-") as scratch:
        tree = build(scratch)
        env = sanitized_env(tree, examples)
        where = subprocess.run(
            [sys.executable, "-c", f"import consumers.decoding.{module} as m; print(m.__file__)"],
            env=env, capture_output=True, text=True, check=True, cwd=scratch,
        ).stdout.strip()  # fmt: skip
        assert where.startswith(str(tree)), f"the tests would read {where}, not the sanitized build"
        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "--import-mode=append", "--timeout=0", "--hypothesis-show-statistics", *tests],
            cwd=ROOT, env=env, capture_output=True, text=True,
        )  # fmt: skip
        seconds = time.monotonic() - started
    output = run.stdout + run.stderr
    reports = sorted(set(m.group(0) for m in _REPORT.finditer(output)))
    passed = re.search(r"(\d+) passed", output)
    figures = {
        "reader": reader,
        "examples_per_property": examples,
        "seconds": round(seconds, 1),
        "exit_code": run.returncode,
        "tests_passed": int(passed.group(1)) if passed else 0,
        "sanitizer_reports": reports,
        "tail": output[-4000:] if run.returncode else "",
    }
    path = write_results("fuzz" if reader == "avro" else f"fuzz-{reader}", figures)
    print(output[-3000:])
    print(f"{examples} examples per property ({reader}) under ASan+UBSan: {seconds:.0f} s, "
          f"exit {run.returncode}, {len(reports)} sanitizer report(s); {path}")  # fmt: skip
    if run.returncode or reports:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
