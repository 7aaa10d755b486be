"""Protobuf schema text compiled to descriptors by protoc, the reference compiler, in a process
of its own: the consumer compiles the `.proto` a registry serves (outside input), the sink the
one it derives from a DataFrame's schema or the one a user gives.

The schema's text and its references' (by the name its `import` gives) go to protoc
(`grpcio-tools`), bounded in size, time and memory: a hostile schema can fail its own
compilation and nothing else. A well-known import (`google/protobuf/timestamp.proto` and the
others) that no reference names is protoc's own copy, as Confluent's registry treats them as
built in. Every failure is a `ProtoError` naming what and where, with protoc's own words.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from bridge.errors import BridgeError

MAX_SCHEMA_CHARS = 1024**2  # a schema's text with its references'; a real one is kilobytes
MAX_REFERENCES = 100
MAIN_FILE = "bridge_schema.proto"  # the schema's own file name, beside its references' names
_COMPILE_TIMEOUT_S = 20
_COMPILE_MEMORY = 1024**3  # protoc's address space
_IMPORT_NAME = re.compile(r"[A-Za-z0-9_./-]{1,255}")


class ProtoError(BridgeError):
    """A Protobuf schema or value bridge cannot read; the message says what and where."""


def compile_schema(text: str, references: Mapping[str, str]) -> bytes:
    """The FileDescriptorSet (serialized, imports included) of `text`, whose imports are
    `references` (import name to text) or protoc's well-known types; ProtoError with protoc's
    own words when it does not compile."""
    size = len(text) + sum(len(name) + len(body) for name, body in references.items())
    if size > MAX_SCHEMA_CHARS:
        raise ProtoError(f"schema: {size} characters with its references, more than "
                         f"{MAX_SCHEMA_CHARS}")  # fmt: skip
    if len(references) > MAX_REFERENCES:
        raise ProtoError(f"schema: {len(references)} references, more than {MAX_REFERENCES}")
    for name in references:
        path = PurePosixPath(name)
        if not _IMPORT_NAME.fullmatch(name) or path.is_absolute() or ".." in path.parts:
            raise ProtoError(f"schema: reference {name[:260]!r} is not an import path")
    with tempfile.TemporaryDirectory(prefix="bridge-proto-") as scratch:
        root = Path(scratch) / "in"
        for name, body in {**references, MAIN_FILE: text}.items():
            try:
                encoded = body.encode("utf-8")  # JSON's text may hold a lone surrogate
            except UnicodeEncodeError as exc:  # its message would carry the character
                raise ProtoError(f"schema: {name} is not text protoc can read (a lone "
                                 f"surrogate at character {exc.start})") from None  # fmt: skip
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(encoded)
        out = Path(scratch) / "set.pb"
        arguments = ["protoc", f"-I{root}", f"-I{_WELL_KNOWN_DIR}", "--include_imports",
                     f"--descriptor_set_out={out}", str(root / MAIN_FILE)]  # fmt: skip
        try:
            done = subprocess.run(  # noqa: S603 - our interpreter; the schema only as files
                [sys.executable, "-c", _PROTOC, str(_COMPILE_MEMORY), *arguments],
                capture_output=True, encoding="utf-8", errors="replace", check=False,
                timeout=_COMPILE_TIMEOUT_S,
                env={"PATH": os.environ.get("PATH", "")},
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise ProtoError(f"schema: protoc took more than {_COMPILE_TIMEOUT_S} s") from None
        if done.returncode != 0 or not out.exists():
            said = (done.stderr or done.stdout).replace(str(root) + "/", "").strip()
            raise ProtoError(f"schema does not compile: {said[:1000] or done.returncode}")
        return out.read_bytes()


# The child bounds its own memory before protoc runs in it (a preexec_fn is unsafe in the
# consumer, which has threads).
_PROTOC = (
    "import resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "from grpc_tools import protoc\n"
    "sys.exit(protoc.main(sys.argv[2:]))\n"
)


def _well_known_dir() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


_WELL_KNOWN_DIR = _well_known_dir()
