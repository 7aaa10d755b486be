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
    return server
