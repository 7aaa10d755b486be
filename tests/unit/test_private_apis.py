"""Every private name of another library that bridge uses is reached through
bridge/private_apis.py, and each one is still where that module looks for it and does what
bridge uses it for: an upgrade that moves one fails here, naming it."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from psycopg.adapt import Transformer

from bridge import private_apis
from bridge.private_apis import PrivateApiMoved

_ROOT = Path(__file__).resolve().parents[2]
_OURS = {"bridge", "bridge_shell", "consumers", "spark_jobs", "tests", "bench"}
_ADAPTER = Path("bridge/private_apis.py")


def _private_imports(source: str, where: str) -> list[str]:
    """`import a._b`, `from a._b import c`, `from a import _c` of a library that is not ours."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            names = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            if module.split(".")[0] in _OURS:
                continue
            parts = module.split(".")
            private = [p for p in parts if p.startswith("_") and p != "__future__"]
            private += [n for n in names if n.startswith("_")]
            if private:
                found.append(f"{where}:{node.lineno}: {module} {names}")
    return found


def test_no_product_module_imports_a_private_module_but_the_adapter() -> None:
    found = []
    for package in ("bridge", "bridge_shell", "consumers", "spark_jobs"):
        for path in sorted((_ROOT / package).rglob("*.py")):
            if path.relative_to(_ROOT) != _ADAPTER:
                found += _private_imports(path.read_text(), str(path.relative_to(_ROOT)))
    assert found == []


def test_the_scan_sees_a_private_import() -> None:
    # The scan above would pass on anything if it could not see one.
    sample = "from psycopg._copy_base import format_row_text\nimport psycopg._cmodule\n"
    sample += "from psycopg.errors import _WaitTimeout\nfrom consumers._x import y\n"
    assert len(_private_imports(sample, "sample")) == 3


def test_psycopg_wait_timeout_is_the_error_of_a_bounded_wait() -> None:
    timeout = private_apis.psycopg_wait_timeout()
    assert issubclass(timeout, psycopg.OperationalError)
    assert timeout is not psycopg.OperationalError


def test_psycopg_row_text_formatter_formats_copy_text_as_psycopg_does() -> None:
    format_row = private_apis.psycopg_row_text_formatter()
    out = bytearray()
    format_row((1, "a\tb", None), Transformer(), out)
    assert bytes(out) == b"1\ta\\tb\t\\N\n"


def test_detach_accumulator_server_takes_the_server_off_the_context() -> None:
    server = SimpleNamespace(server_shutdown=False)
    context = SimpleNamespace(_accumulatorServer=server)
    assert private_apis.detach_accumulator_server(context) is server
    assert context._accumulatorServer is None
    # Its handler stops reading, and the JVM's closed socket prints no traceback.
    assert server.server_shutdown is True
    assert server.handle_error(None, ("127.0.0.1", 1)) is None


def test_the_accumulator_server_says_nothing_of_the_jvm_closing_its_connection() -> None:
    reported: list[object] = []
    server = SimpleNamespace(handle_error=lambda request, address: reported.append(request))
    private_apis.quiet_accumulator_eof(SimpleNamespace(_accumulatorServer=server))
    for error, request in ((EOFError(), "eof"), (ConnectionResetError(), "reset"),
                           (ValueError("bad token"), "other")):  # fmt: skip
        try:
            raise error
        except Exception:  # noqa: BLE001 - socketserver calls handle_error inside its except
            server.handle_error(request, ("127.0.0.1", 1))
    assert reported == ["other"]
    with pytest.raises(PrivateApiMoved, match=r"SparkContext\._accumulatorServer"):
        private_apis.quiet_accumulator_eof(SimpleNamespace())


def test_a_context_without_a_progress_bar_member_fails_naming_the_adapter() -> None:
    with pytest.raises(PrivateApiMoved, match=r"SparkContext\.progressBar is not in Spark"):
        private_apis.stop_console_progress_bar(SimpleNamespace())


def test_a_moved_name_fails_naming_the_library_version_and_the_adapter() -> None:
    with pytest.raises(PrivateApiMoved, match=r"psycopg\.errors\._Gone is not in psycopg 3\.") as e:
        private_apis._private("psycopg", "psycopg.errors", "_Gone")
    assert "bridge/private_apis.py" in str(e.value)
    with pytest.raises(PrivateApiMoved, match=r"SparkContext\._accumulatorServer"):
        private_apis.detach_accumulator_server(SimpleNamespace())
