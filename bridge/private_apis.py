"""The only place bridge reaches into another library's private names, each for a reason.

A private name can move or vanish in any release of its library. Each one is reached here
alone, by a function that imports it when first asked (so that importing this module costs
nothing where that library is absent, as psycopg is on Spark's executors), and that fails
loudly, naming the library's version and this module, when a release moved it.
`tests/unit/test_private_apis.py` asks for every one and checks what it does, so an upgrade
that moves one fails there first.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import psycopg
    from psycopg.abc import Transformer


class PrivateApiMoved(ImportError):
    """A release of a library no longer has a private name bridge relies on."""


def _private(distribution: str, module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        version = importlib.metadata.version(distribution)
        raise PrivateApiMoved(
            f"{module}.{name} is not in {distribution} {version}: bridge/private_apis.py "
            "must follow where this release keeps it, or do without it"
        ) from exc


def psycopg_wait_timeout() -> type[psycopg.OperationalError]:
    """What psycopg's `Connection.wait` raises when its `timeout` passes. psycopg turns it into
    a plain OperationalError only on some paths; the consumer bounds every wait for the server
    with that timeout and must tell this apart from a lost connection's error."""
    return cast(
        "type[psycopg.OperationalError]", _private("psycopg", "psycopg.errors", "_WaitTimeout")
    )


RowFormatter = Callable[[Sequence[Any], "Transformer", bytearray], None]


def psycopg_row_text_formatter() -> RowFormatter:
    """psycopg's COPY text row formatter, a C loop in its binary build: the consumer formats a
    batch's COPY data while the last batch commits, at the speed psycopg's own COPY does."""
    return cast(RowFormatter, _private("psycopg", "psycopg._copy_base", "format_row_text"))


def detach_accumulator_server(spark_context: Any) -> Any:
    """Takes PySpark's accumulator server off `spark_context` and returns it (or None), so that
    `SparkContext.stop` does not wait for the server's next one-second poll; the caller shuts it
    down. PySpark keeps it in the private attribute `_accumulatorServer`."""
    if not hasattr(spark_context, "_accumulatorServer"):
        version = importlib.metadata.version("pyspark")
        raise PrivateApiMoved(
            f"SparkContext._accumulatorServer is not in pyspark {version}: "
            "bridge/private_apis.py must follow where this release keeps it"
        )
    server = spark_context._accumulatorServer
    spark_context._accumulatorServer = None  # stop() then leaves it alone
    if server is not None:
        # Its request handler reads the JVM's end of the socket until `server_shutdown`; the
        # JVM closes it in `stop()`, before the caller shuts the server down: set the flag
        # first, and take the EOFError a read may still meet for what it is (the JVM gone),
        # instead of socketserver printing its traceback.
        server.server_shutdown = True
        server.handle_error = _jvm_gone
    return server


def _jvm_gone(request: Any, client_address: Any) -> None:
    """The detached accumulator server's `handle_error`: nothing to say."""


def quiet_accumulator_eof(spark_context: Any) -> None:
    """Makes PySpark's accumulator server of `spark_context` take its connection's end for what
    it is. The JVM writes accumulator updates over a connection it opens again when it finds it
    closed; when a stopping query closes it (seen on a graceful stop of `bridge produce`), the
    server's handler meets EOFError mid-read and socketserver prints its traceback with
    "Exception occurred during processing of request". That error, and a reset connection, are
    now said at DEBUG; any other still goes to socketserver's own `handle_error`. PySpark keeps
    the server in the private attribute `_accumulatorServer`."""
    if not hasattr(spark_context, "_accumulatorServer"):
        version = importlib.metadata.version("pyspark")
        raise PrivateApiMoved(
            f"SparkContext._accumulatorServer is not in pyspark {version}: "
            "bridge/private_apis.py must follow where this release keeps it"
        )
    server = spark_context._accumulatorServer
    if server is None:
        return
    report = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, EOFError | ConnectionResetError):
            logging.getLogger("bridge.spark").debug(
                "the JVM closed its accumulator connection: %r", error
            )
            return
        report(request, client_address)

    server.handle_error = handle_error


def stop_console_progress_bar(spark_context: Any) -> bool:
    """Stops the console progress bar of `spark_context`'s JVM, if it has one (PySpark's shell
    mode turns it on: a plain `python job.py` too); True when there was one. Spark keeps it in
    `SparkContext.progressBar`, private to Spark in Scala (public in the bytecode, so Py4J
    reaches it); `ConsoleProgressBar.stop` ends its refresh timer."""
    try:
        found = spark_context._jsc.sc().progressBar()
        if found.isEmpty():
            return False
        found.get().stop()
    except Exception as exc:  # Py4J's error: the member moved
        version = importlib.metadata.version("pyspark")
        raise PrivateApiMoved(
            f"SparkContext.progressBar is not in Spark {version}: bridge/private_apis.py must "
            "follow where this release keeps it"
        ) from exc
    return True
