"""Whole epochs in tests: the sink's side of the protocol written by hand, and a reader that
watches the tables for part of an epoch.

`HandSink` writes what `bridge-kafka` with `epochs=whole` writes (`spark_jobs.epoch_transaction`,
`spark_jobs.manifest_writer`): each task's records with their provenance headers and its part in
one Kafka transaction (naming the records' offsets, from their delivery reports, unless told to
write parts as a sink before them did), then the epoch's record in another. A test can stop
between any two of those, which Spark's scheduler does not let it choose. The Spark tests drive
the real sink.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from bridge.delivered_offsets import DeliveredOffsets
from bridge.epoch_manifest import Epoch, Part, key_of
from bridge.names import (
    EPOCH_STAGED_TABLE,
    EPOCHS_TABLE,
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
    PROVENANCE_WHOLE,
    WHOLE_EPOCHS,
)
from tests.harness import Endpoints
from tests.kafka_helpers import transactional_producer


class HandSink:
    """One streaming query's writes, as bridge's sink makes them with whole epochs."""

    def __init__(
        self, stack: Endpoints, *, manifest_topic: str, query: str, name_offsets: bool = True
    ) -> None:
        self._stack = stack
        self.manifest_topic = manifest_topic
        self.query = query
        self.name_offsets = name_offsets  # False: parts as sinks before offsets wrote them

    def task(
        self,
        epoch: int,
        spark_partition: int,
        records: Sequence[tuple[str, int, bytes | None, bytes | None]],
        *,
        abort: bool = False,
        timestamp_ms: int = 0,
    ) -> None:
        """One write task: `records` as (topic, Kafka partition, key, value), and its part, in
        one transaction (aborted with `abort`, as a task that failed); stamped `timestamp_ms`
        when given (a task of some time ago), else now, as the sink's producer stamps them."""
        delivered = DeliveredOffsets()
        producer = transactional_producer(
            self._stack.bootstrap_servers,
            config={**self._stack.properties(), "on_delivery": delivered},
        )
        headers: list[tuple[str, str | bytes | None]] = [
            (PROVENANCE_QUERY, self.query.encode()),
            (PROVENANCE_PARTITION, str(spark_partition).encode()),
            (PROVENANCE_EPOCH, str(epoch).encode()),
            (PROVENANCE_WHOLE, WHOLE_EPOCHS),
        ]
        try:
            producer.begin_transaction()
            for topic, partition, key, value in records:
                producer.produce(topic, value, key, partition, headers=headers,
                                 timestamp=timestamp_ms)  # fmt: skip
            written = Counter(topic for topic, _, _, _ in records)
            offsets = None
            if self.name_offsets and producer.flush(30) == 0:
                offsets = delivered.ranges(dict(written))
            part = Part(query=self.query, epoch=epoch, partition=spark_partition,
                        records=written, offsets=offsets or {})  # fmt: skip
            producer.produce(self.manifest_topic, part.encode(), key_of(self.query), 0,
                             timestamp=timestamp_ms)  # fmt: skip
            if abort:
                producer.flush(30)
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
        finally:
            producer.close()

    def commit(self, epoch: int, parts: list[int]) -> None:
        """The driver's commit hook: the epoch's record, naming the tasks that wrote a part."""
        producer = transactional_producer(
            self._stack.bootstrap_servers, config=self._stack.properties()
        )
        try:
            producer.begin_transaction()
            record = Epoch(query=self.query, epoch=epoch, parts=tuple(parts))
            producer.produce(self.manifest_topic, record.encode(), key_of(self.query), 0)
            producer.commit_transaction(30)
        finally:
            producer.close()


@dataclass
class Reader:
    """Polls the tables in one snapshot for how many rows of each epoch are visible, and keeps
    every sight of an epoch neither absent nor whole."""

    dsn: str
    tables: list[str]  # each with an `epoch_no` column
    expected: Mapping[int, int]  # rows of each epoch, once whole
    partial: list[tuple[int, int]] = field(default_factory=list)  # (epoch, rows seen)
    polls: int = 0

    def poll(self, conn: psycopg.Connection[Any]) -> None:
        union = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT epoch_no FROM {}").format(sql.Identifier(*t.split(".")))
            for t in self.tables
        )
        for epoch, rows in conn.execute(
            sql.SQL("SELECT epoch_no, count(*) FROM ({}) AS r GROUP BY epoch_no").format(union)
        ):
            if rows != self.expected.get(epoch, rows):
                self.partial.append((epoch, rows))
        self.polls += 1


@contextmanager
def reading(reader: Reader, every_s: float = 0.01, *, reconnect: bool = False) -> Iterator[Reader]:
    """`reader` polling on a thread of its own for as long as the block runs; with
    `reconnect`, through a lost server (a failover), connecting again until the block ends."""
    with polling(reader.dsn, reader.poll, every_s, reconnect=reconnect):
        yield reader


@contextmanager
def polling(
    dsn: str,
    poll: Callable[[psycopg.Connection[Any]], None],
    every_s: float = 0.01,
    *,
    reconnect: bool = False,
) -> Iterator[None]:
    """`poll` called on a thread of its own, with a connection of its own, for as long as the
    block runs; what it raises is raised in the test's thread at the end."""
    stop = threading.Event()
    failure: list[BaseException] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                    while not stop.is_set():
                        poll(conn)
                        stop.wait(every_s)
            except psycopg.OperationalError as exc:
                if not reconnect:
                    failure.append(exc)
                    return
                stop.wait(0.1)  # the server is gone, or not yet promoted: try again
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                failure.append(exc)
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
    if failure:
        raise failure[0]


def ledger_count(dsn: str, schema: str, statement: str, *args: Any) -> int:
    """A count from the ledger; 0 while the consumer has not made its state tables."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            row = conn.execute(
                sql.SQL(statement).format(
                    staged=sql.Identifier(schema, EPOCH_STAGED_TABLE),
                    epochs=sql.Identifier(schema, EPOCHS_TABLE),
                ),
                args,
            ).fetchone()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return 0
    return int(row[0] or 0) if row else 0


def staged(dsn: str, schema: str, query: str, epoch: int) -> int:
    return ledger_count(
        dsn, schema, "SELECT sum(records) FROM {staged} WHERE query = %s AND epoch = %s",
        query, epoch,
    )  # fmt: skip


def published(dsn: str, schema: str, query: str) -> int:
    return ledger_count(
        dsn, schema, "SELECT count(*) FROM {epochs} WHERE query = %s AND outcome = 'published'",
        query,
    )  # fmt: skip
