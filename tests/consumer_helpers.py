"""Running the consumer service in a test, and reading what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg import sql as pgsql

from bridge.names import DEAD_LETTERS_TABLE, OFFSETS_TABLE
from bridge.settings import BridgeSettings, load_settings
from bridge_shell.spark.producer_job import ProducerJob, Source
from consumers.service import ConsumerService
from tests.harness import Endpoints
from tests.kafka_helpers import read_messages, transactional_producer


def settings_for(
    stack: Endpoints,
    names: dict[str, str],
    *,
    consumer: dict[str, Any] | None = None,
    kafka_properties: dict[str, Any] | None = None,
    registry_url: str | None = None,
    **route: Any,
) -> BridgeSettings:
    """As the consumer's principal and role (of least rights, on a secured stack), or with
    `kafka_properties` instead of the principal's; with `registry_url`, the schema registry."""
    properties = stack.properties("consumer", resolved=False)
    registry: dict[str, Any] = {}
    if registry_url:
        client = dict(stack.registry_properties)
        registry = {"schema_registry": {"url": registry_url, "properties": client}}
    return load_settings(
        **registry,
        kafka={
            "bootstrap_servers": stack.bootstrap_servers,
            "properties": properties if kafka_properties is None else kafka_properties,
        },
        postgres={"dsn": stack.role_dsn("consumer")},
        consumer={
            "group_id": names["group"],
            "state_schema": names["schema"],
            "batch_max_wait_ms": 50,
            # A route with a topic_pattern names no topic.
            "routes": [
                {
                    **({} if "topic_pattern" in route else {"topic": names["topic"]}),
                    "table": f"public.{names['table']}",
                    **route,
                }
            ],
            **(consumer or {}),
        },
    )


def sql(stack: Endpoints, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        cursor = conn.execute(statement.encode())
        return cursor.fetchall() if cursor.description else []


def produce(
    stack: Endpoints,
    topic: str,
    records: list[tuple[Any, Any]],
    *,
    abort: bool = False,
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    producer = transactional_producer(stack.bootstrap_servers, config=stack.properties())
    try:
        producer.begin_transaction()
        for key, value in records:
            producer.produce(
                topic,
                key=_encoded(key),
                value=_encoded(value),
                headers=headers,
            )
        if abort:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    finally:
        # Closed here, even when the test fails: a client left behind goes on reconnecting
        # to the stack after it stops, a line a retry on stderr.
        producer.close()


def _encoded(data: Any) -> bytes | None:
    """A key or value as the record's bytes: bytes as they are, anything else as JSON."""
    if data is None or isinstance(data, bytes):
        return data
    return json.dumps(data).encode()


@contextmanager
def running(settings: BridgeSettings) -> Iterator[ConsumerService]:
    service = ConsumerService(settings)
    service.start()
    thread, failure = in_background(service)
    try:
        yield service
    finally:
        service.stop()
        thread.join(60)
        assert not thread.is_alive(), "the service did not stop"
        if failure:
            raise failure[0]


def in_background(service: ConsumerService) -> tuple[threading.Thread, list[BaseException]]:
    """The started `service` running on a thread of its own, and where the error it ends with
    is kept for the test's thread."""
    failure: list[BaseException] = []

    def loop() -> None:
        try:
            service.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread, failure


def drained(stack: Endpoints, names: dict[str, str], partitions: int, timeout: float = 60) -> None:
    """Until the group's stored offset of every partition is past the last committed record a
    read_committed reader finds there now: nothing is left for the consumer to apply, so a count
    taken after this is final, with no sleep to guess it by. (Not the log's end: a partition
    whose last transaction was aborted ends with records the consumer never sees.)"""
    last: dict[int, int] = {}
    for message in read_messages(
        stack.bootstrap_servers,
        names["topic"],
        partitions=partitions,
        config=stack.properties(),
    ):
        last[cast(int, message.partition())] = cast(int, message.offset())

    def applied() -> bool:
        with psycopg.connect(stack.dsn, autocommit=True) as conn:
            try:
                stored: dict[int, int] = dict(
                    conn.execute(
                        pgsql.SQL(
                            "SELECT partition, next_offset FROM {} WHERE group_id = %s "
                            "AND topic = %s"
                        ).format(pgsql.Identifier(names["schema"], OFFSETS_TABLE)),
                        (names["group"], names["topic"]),
                    ).fetchall()
                )
            except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                return False  # the consumer under test has not made its state tables yet
        return all(stored.get(partition, 0) > offset for partition, offset in last.items())

    eventually(applied, timeout)


def dead_letters(stack: Endpoints, names: dict[str, str], topic: str | None = None) -> int:
    """The dead letters committed so far (of `topic`, when given): the table, not the metric,
    which moves only after the batch's commit, so that a count taken right after `drained` is
    final. 0 before the consumer under test has made its state tables."""
    where = pgsql.SQL("") if topic is None else pgsql.SQL(" WHERE topic = %s")
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        try:
            row = conn.execute(
                pgsql.SQL("SELECT count(*) FROM {}{}").format(
                    pgsql.Identifier(names["schema"], DEAD_LETTERS_TABLE), where
                ),
                () if topic is None else (topic,),
            ).fetchone()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return 0
    return int(row[0]) if row else 0


def sample(service: ConsumerService, name: str, **labels: str) -> float:
    """A metric's value as Prometheus would scrape it from the service's registry (a counter's
    sample is `<name>_total`); 0 for a series not yet written."""
    return service.metrics.registry.get_sample_value(name, labels) or 0.0


def http_get(url: str) -> tuple[int, str]:
    """The status and body of a GET, an error status's body included."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback test
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def eventually(check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def plain_config(stack: Endpoints, names: dict[str, str], **consumer: Any) -> dict[str, Any]:
    """A consumer's configuration as its YAML file holds it, for the plain stack: one route from
    the test's topic into its table, `consumer` settings added."""
    return {
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "postgres": {"dsn": stack.dsn},
        "consumer": {
            "group_id": names["group"],
            "state_schema": names["schema"],
            "routes": [{"topic": names["topic"], "table": f"public.{names['table']}"}],
            **consumer,
        },
    }


@contextmanager
def consumer_process(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m consumers --config config` as a process of its own, whatever BRIDGE_* the
    caller's shell holds, writing to `log`; killed on the way out if it still runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    with (
        log.open("wb") as out,
        subprocess.Popen(
            [sys.executable, "-m", "consumers", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        ) as service,
    ):
        try:
            yield service
        finally:
            if service.poll() is None:
                service.kill()
                service.wait()


def json_lines(output: str) -> list[dict[str, Any]]:
    """Each line a process wrote, as the JSON object it must be."""
    records = []
    for line in filter(str.strip, output.splitlines()):
        assert line.startswith("{"), f"not a JSON line: {line!r}"
        records.append(json.loads(line))
    return records


def files_job(
    stack: Endpoints, topic: str, tmp_path: Path, lines: list[str], **options: Any
) -> ProducerJob:
    """The Spark producer job over one input file of `lines` (keyed by `id`), as the
    producer's principal, with the checkpoint in `tmp_path`."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.json").write_text("".join(f"{line}\n" for line in lines))
    producer = {k: str(v) for k, v in stack.properties("producer").items()}
    return ProducerJob(
        source=Source.FILES, input=tmp_path / "in", topic=topic, key_field="id",
        checkpoint=tmp_path / "checkpoint", bootstrap_servers=stack.bootstrap_servers,
        kafka_properties=producer, **options,
    )  # fmt: skip
