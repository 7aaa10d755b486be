"""One write task = one Kafka transaction for one (Spark partition, epoch), fenced and replay-safe.

Order, and why:
0. Create the producer and the marker reader as the task starts (they connect while the input
   arrives), and wait for the connection (see `write`).
1. `init_transactions` with the id of (P, E): aborts any open transaction of an earlier holder of
   the id (a failed attempt, a dead driver's task, a speculative twin) and fences that holder.
2. Read the marker of P. Only now is it trustworthy: no earlier holder can still commit.
3. Marker epoch >= E: this epoch of P is already in Kafka (a replay after a driver crash), write
   nothing. Otherwise begin, produce every row, then (with `epochs=whole`) wait for their delivery
   reports and write the task's part of the epoch manifest (`bridge.epoch_manifest`), naming
   where the records landed, add the marker (P, E) to the transaction, commit.

Errors: retriable ones are retried within the transaction timeout; an abortable one aborts the
transaction and fails the task so that Spark re-runs it from its input; fatal ones (fenced, ...)
fail the task. No error is swallowed: each one reaches Spark with the task's coordinates.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from bridge.delivered_offsets import DeliveredOffsets
from bridge.epoch_manifest import Part, key_of
from bridge.errors import BridgeError
from bridge.kafka_refusal import RefusalWatch
from bridge.names import (
    PROVENANCE_ATTEMPT,
    PROVENANCE_EPOCH,
    PROVENANCE_PARTITION,
    PROVENANCE_QUERY,
    PROVENANCE_WHOLE,
    WHOLE_EPOCHS,
)
from spark_jobs.epoch_markers import MarkerReader, marker_position
from spark_jobs.faults import TaskFaults
from spark_jobs.kafka_rows import KafkaRow, RecordChunk
from spark_jobs.sink_options import ID_POOL_SIZE, Epochs, IdNaming, SinkOptions

log = logging.getLogger("bridge.sink")
RDKAFKA_LOG = logging.getLogger("bridge.sink.rdkafka")

T = TypeVar("T")
# The task's clients live for one task, so their first connections are on its critical path.
# librdkafka drops the bootstrap connection once it learns the broker's id, and holds the next
# connection attempt back for a while set by reconnect.backoff.ms ("still suppressed for 49ms"
# in its debug log with the default 100): measured, the producer connected in 54 ms and the
# marker read took 55 ms; with 10, 14 and 2 ms. After a failure, only the first retry comes
# sooner: the backoff still doubles up to reconnect.backoff.max.ms.
_TASK_CLIENT_DEFAULTS = {"reconnect.backoff.ms": "10"}
_CONNECT_WAIT_S = 10.0
_REFUSAL_CHECK_S = 0.25  # how often the wait for a first connection looks for a refusal

# librdkafka's send_offsets_to_transaction can block past its own timeout while the group
# coordinator is down (librdkafka issues #5456 and #5511, open), without end when the node that was
# both coordinators of a task is gone. So no blocking call of a write task may outlast its own
# timeout by more than this; one that does ends the Python worker, Spark retries the task, and the
# retry's init_transactions fences what the stuck attempt left open.
_STUCK_GRACE_S = 30.0
STUCK_EXIT_CODE = 70


def call_within(seconds: float, action: Callable[[], T], *, on_stuck: Callable[[], None]) -> T:
    """`action()`'s result or exception, if it ends within `seconds`; else `on_stuck()`, then
    TimeoutError (the action's thread is left behind: a C call cannot be interrupted)."""
    outcome: list[T] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="bridge-kafka-call", daemon=True).start()
    if not done.wait(seconds):
        on_stuck()
        raise TimeoutError(f"no answer in {seconds:.0f} s")
    if failure:
        raise failure[0]
    return outcome[0]


def _retriable(exc: BaseException) -> bool:
    if not isinstance(exc, KafkaException):
        return False
    error: KafkaError = exc.args[0]
    return bool(error.retriable()) and not error.fatal()


# The ACL a refusal names, for the error to say which right to grant.
_RIGHTS = {
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: (
        "Write and Describe on transactional id {transactional_id} (a prefixed ACL on the "
        "sink's transactional.id.prefix)"
    ),
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "Write and Describe on the topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: (
        "Read and Describe on the epoch marker's group (a prefixed ACL on the "
        "transactional.id.prefix)"
    ),
}


class EpochWriteError(BridgeError):
    """The transaction of one (partition, epoch) failed; Spark fails (and retries) the task.

    `fatal`: the producer is unusable (fenced by a newer holder of the id, or worse)."""

    def __init__(self, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass(frozen=True, kw_only=True)
class TaskCoordinates:
    query_id: str
    prefix: str
    partition: int
    epoch: int
    attempt: int
    # Random, one per write of the task: Spark's attempt number starts again at 0 in a
    # restarted driver, so it cannot tell a replay's write from the first one.
    attempt_id: str = field(default_factory=lambda: secrets.token_hex(4), compare=False)

    def transactional_id(self, naming: IdNaming) -> str:
        if naming is IdNaming.PER_PARTITION:
            return f"{self.prefix}-p{self.partition}"
        if naming is IdNaming.POOLED:
            return f"{self.prefix}-p{self.partition}-s{self.epoch % ID_POOL_SIZE}"
        return f"{self.prefix}-p{self.partition}-e{self.epoch}"

    def provenance(self, *, whole: bool = False) -> list[tuple[str, bytes]]:
        """The headers that trace a record to its task; `whole`: and say that the epoch is
        published whole, so that a consumer waits for the manifest only for such records."""
        marked = [(PROVENANCE_WHOLE, WHOLE_EPOCHS)] if whole else []
        return [
            (PROVENANCE_QUERY, self.query_id.encode()),
            (PROVENANCE_PARTITION, str(self.partition).encode()),
            (PROVENANCE_EPOCH, str(self.epoch).encode()),
            # A consumer applying per partition tells a second committed write of the epoch
            # by it (its markers expired before a replay): `consumers.batch.replays`.
            (PROVENANCE_ATTEMPT, self.attempt_id.encode()),
            *marked,
        ]

    def __str__(self) -> str:
        return f"partition {self.partition} epoch {self.epoch} attempt {self.attempt}"


@dataclass(frozen=True, kw_only=True)
class EpochOutcome:
    """What one write task did, for the driver's commit hook."""

    query_id: str = ""
    partition: int
    epoch: int
    attempt: int
    transactional_id: str
    rows: int
    skipped: bool  # the marker said this (partition, epoch) was already committed
    bytes: int = 0  # of keys and values written
    # Creating the producer and marker reader, and waiting for their connection.
    setup_seconds: float = 0.0
    init_seconds: float
    marker_seconds: float
    produce_seconds: float
    commit_seconds: float
    empty: bool = False  # no input: no transaction at all
    # Seen from the task: the wait for its first input batch (upstream work and the Arrow
    # transfer), and when the task's Python code began and ended (wall clock, for the driver).
    first_batch_seconds: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0

    @classmethod
    def of_empty_input(cls, where: TaskCoordinates) -> EpochOutcome:
        """An empty partition replays as empty (Spark's condition: a deterministic query), so it
        needs no transaction and no marker; skipping them saves three round trips per task."""
        return cls(
            query_id=where.query_id,
            partition=where.partition,
            epoch=where.epoch,
            attempt=where.attempt,
            transactional_id="",
            rows=0,
            skipped=False,
            init_seconds=0.0,
            marker_seconds=0.0,
            produce_seconds=0.0,
            commit_seconds=0.0,
            empty=True,
        )


class EpochTransaction:
    """Created as the task starts, so that the clients connect while its input arrives; closed
    (as a context manager) when the task ends, with or without a transaction."""

    def __init__(self, options: SinkOptions, where: TaskCoordinates) -> None:
        created = time.monotonic()
        self._options = options
        self._where = where
        self._transactional_id = where.transactional_id(options.naming)
        self._timeout = options.transaction_timeout_ms / 1000
        self._faults = TaskFaults.for_task(
            prefix=where.prefix, partition=where.partition, epoch=where.epoch, attempt=where.attempt
        )
        # Credentials or TLS the brokers refused: librdkafka says so only to its error callback,
        # while the call it blocks in ends in a bare timeout.
        self._refused = RefusalWatch()
        # With whole epochs, where each record landed, for the task's part of the manifest.
        self._delivered = DeliveredOffsets() if options.epochs is Epochs.WHOLE else None
        # librdkafka connects in the background from here on.
        self._producer = Producer(self._producer_config())
        self._markers = MarkerReader(
            {**_TASK_CLIENT_DEFAULTS, **options.kafka},
            prefix=where.prefix,
            partition=where.partition,
            marker_topic=options.marker_topic,
        )
        self._setup_seconds = time.monotonic() - created

    def __enter__(self) -> EpochTransaction:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Both clients closed now, not when the collector finds them: a task's failure keeps
        this object alive in its traceback, and a producer left open goes on connecting (and
        logging) in a Python worker that Spark reuses. The transaction is settled by then:
        committed, aborted, or fenced, when closing may only warn, which is not the task's
        outcome."""
        self._markers.close()
        with warnings.catch_warnings(), contextlib.suppress(Exception):
            warnings.simplefilter("ignore")
            self._producer.close()

    def write(self, rows: Callable[[], Iterator[RecordChunk]]) -> EpochOutcome:
        """Write the task's rows exactly once; `rows` is called only if they must be written."""
        producer = self._producer
        started = time.monotonic()
        self._connect(producer)
        connected_at = time.monotonic()
        self._call("init_transactions", lambda: producer.init_transactions(self._timeout))
        fenced_at = time.monotonic()
        marker = self._call(
            "read the epoch marker", lambda: self._markers.read(timeout=self._timeout)
        )
        read_at = time.monotonic()
        fencing = {
            "setup": self._setup_seconds + connected_at - started,
            "init": fenced_at - connected_at,
            "marker": read_at - fenced_at,
        }
        if marker is not None and marker.epoch >= self._where.epoch:
            log.info(
                "%s already committed (marker epoch %d): writing nothing",
                self._where,
                marker.epoch,
            )
            return self._outcome(0, 0, skipped=True, **fencing)
        producer.begin_transaction()
        try:
            count, size, topics = self._produce(producer, rows())
            if self._options.epochs is Epochs.WHOLE:
                self._produce_part(producer, topics)
            produced_at = time.monotonic()
            self._reach("before-commit")
            position = marker_position(
                self._options.marker_topic,
                self._where.epoch,
                {
                    "rows": count,
                    "query": self._where.query_id,
                    "attempt": self._where.attempt,
                },
            )
            self._call(
                "send_offsets_to_transaction",
                lambda: producer.send_offsets_to_transaction(
                    position, self._markers.group_metadata(), self._timeout
                ),
            )
            self._call("commit_transaction", lambda: producer.commit_transaction(self._timeout))
        except BaseException as exc:
            self._abort(producer, exc)
            raise
        committed_at = time.monotonic()
        self._reach("after-commit")
        return self._outcome(
            count,
            size,
            skipped=False,
            **fencing,
            produce=produced_at - read_at,
            commit=committed_at - produced_at,
        )

    def _connect(self, producer: Producer) -> None:
        """Wait until the producer has a broker connection. A first transactional call made
        before one is up waits for librdkafka's coordinator retry timer, 500 ms, in about half
        the tasks (measured: init_transactions took 57 or 507 ms on a fresh producer, 4 ms
        once connected). Only a speed-up: when no broker answers, `init_transactions` waits
        and retries within the transaction timeout, as it always has.

        A refusal of the credentials or TLS ends the wait, and the task, at once: waiting on
        for `init_transactions` to time out made each of Spark's attempts last the transaction
        timeout and more (measured: 44 s for a wrong password's four attempts of 5 s)."""
        deadline = time.monotonic() + min(_CONNECT_WAIT_S, self._timeout)
        while True:
            left = deadline - time.monotonic()
            try:
                producer.list_topics(timeout=max(0.0, min(_REFUSAL_CHECK_S, left)))
                return
            except KafkaException as exc:
                refused = self._refusal()
                if refused is not None:
                    raise EpochWriteError(
                        f"{self._where} (transactional.id {self._transactional_id}): connecting"
                        f" failed; the brokers refused this client: {refused}",
                        fatal=False,
                    ) from exc
                if left <= _REFUSAL_CHECK_S:
                    log.warning(
                        "%s: no broker answered yet (%s); initialising anyway", self._where, exc
                    )
                    return

    def _producer_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"linger.ms": 5, **_TASK_CLIENT_DEFAULTS}
        config.update(self._options.kafka)
        config["transactional.id"] = self._transactional_id
        config["transaction.timeout.ms"] = self._options.transaction_timeout_ms
        config["error_cb"] = self._refused
        if self._delivered is not None:
            config["on_delivery"] = self._delivered
        # librdkafka's own lines as log records of the task, not raw `%4|...` lines on stderr.
        config["logger"] = RDKAFKA_LOG
        return config

    def _refusal(self) -> str | None:
        """The brokers' refusal of this client's credentials or TLS, if any (the callback runs
        in a poll: this serves it)."""
        with contextlib.suppress(KafkaException):  # a fatal error raises from any poll
            self._producer.poll(0)
        return self._refused.refused

    def _produce_part(self, producer: Producer, topics: Counter[str]) -> None:
        """The task's part of the epoch manifest, in the transaction that carries its records.

        It names their offsets once every record's delivery report is in: the commit would wait
        for them anyway. Without them (a flush that timed out, a record undelivered: the commit
        fails then) the part names none, and readers find the epoch in each record's headers."""
        offsets = None
        if self._delivered is not None and _flushed(producer, self._timeout):
            offsets = self._delivered.ranges(dict(topics))
        part = Part(
            query=self._where.query_id,
            epoch=self._where.epoch,
            partition=self._where.partition,
            records=dict(topics),
            offsets=offsets or {},
        )
        record: KafkaRow = (self._options.epochs_topic, part.encode(), key_of(part.query), 0, [])
        self._produce_records(producer, [record], sum(topics.values()))

    def _produce(
        self, producer: Producer, chunks: Iterator[RecordChunk]
    ) -> tuple[int, int, Counter[str]]:
        """Every row into the open transaction: how many, their bytes of key and value, and
        how many went to each topic.

        The loop per record is as short as it can be: a task writes a million records an
        epoch. Counting, sizing and serving delivery reports go a chunk at a time."""
        fail_after = self._faults.after_rows() if self._faults else None
        count = size = 0
        topics: Counter[str] = Counter()
        for chunk in chunks:
            records: Iterable[KafkaRow] = chunk.records
            first = count
            if fail_after is not None and count <= fail_after < count + chunk.record_count:
                # Fault injection only: put what this attempt wrote so far in the log, so that
                # a test can see the abort hide it.
                records = iter(records)
                self._produce_records(producer, islice(records, fail_after - count), count)
                producer.flush(self._timeout)
                self._reach("mid-produce")
                first = fail_after
            self._produce_records(producer, records, first)
            count += chunk.record_count
            size += chunk.size
            topics.update(chunk.topics)  # complete now that its records were read
            producer.poll(0)  # delivery reports, so that librdkafka's queue never fills with them
        return count, size, topics

    def _produce_records(self, producer: Producer, records: Iterable[KafkaRow], first: int) -> None:
        produce = producer.produce
        for row, (topic, value, key, partition, headers) in enumerate(records, start=first):
            try:
                produce(topic, value, key, partition, headers=headers)
            except BufferError:
                # The local queue is full: let librdkafka deliver, then try again.
                self._produce_when_room(producer, row, (topic, value, key, partition, headers))
            except KafkaException as exc:
                raise self._produce_failure(row, topic, value, key, partition, exc) from exc

    def _produce_when_room(self, producer: Producer, row: int, record: KafkaRow) -> None:
        topic, value, key, partition, headers = record
        while True:
            producer.poll(0.05)
            try:
                producer.produce(topic, value, key, partition, headers=headers)
                return
            except BufferError:
                continue
            except KafkaException as exc:
                raise self._produce_failure(row, topic, value, key, partition, exc) from exc

    def _produce_failure(
        self, row: int, topic: str, value: Any, key: Any, partition: int, exc: KafkaException
    ) -> EpochWriteError:
        error: KafkaError = exc.args[0]
        what = f"produce to {topic}"
        if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            size = len(value or b"") + len(key or b"")
            what = (
                f"produce row {row} ({size} bytes of key and value) to {topic}"
                f"{'' if partition < 0 else f'[{partition}]'}: larger than "
                "message.max.bytes (kafka.message.max.bytes, and the topic's "
                "max.message.bytes on the broker); the retries will fail alike"
            )
        return self._failure(what, error)

    def _call(self, what: str, action: Callable[[], T]) -> T:
        """Run a transactional call, retrying retriable errors until the transaction timeout."""

        def retrying(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            log.warning("%s: %s failed, retrying: %s", self._where, what, error)

        def bounded() -> T:
            return call_within(self._timeout + _STUCK_GRACE_S, action, on_stuck=stuck)

        def stuck() -> None:
            self._end_stuck_worker(what)

        try:
            return Retrying(
                # A refused login does not mend by waiting: fail now, with the reason.
                retry=retry_if_exception(lambda e: _retriable(e) and self._refusal() is None),
                stop=stop_after_delay(self._timeout),
                wait=wait_exponential(multiplier=0.1, max=2.0),
                before_sleep=retrying,
                reraise=True,
            )(bounded)
        except KafkaException as exc:
            raise self._failure(what, exc.args[0]) from exc

    def _failure(self, what: str, error: KafkaError) -> EpochWriteError:
        kind = "fatal" if error.fatal() else "abortable" if error.txn_requires_abort() else ""
        right = _RIGHTS.get(error.code())
        hints = (
            f"; the producer's principal needs {right} (README, Security)".format(
                transactional_id=self._transactional_id
            )
            if right
            else ""
        )
        refused = self._refusal()
        if refused is not None:
            hints += f"; the brokers refused this client: {refused}"
        return EpochWriteError(
            f"{self._where} (transactional.id {self._transactional_id}): {what} failed:"
            f" {error.str()} {kind}".rstrip()
            + hints,
            # A produce after the producer failed fatally (fenced while its task was paused,
            # found when the part of the manifest follows the records) says only _FATAL.
            fatal=error.fatal() or error.code() in (KafkaError._FENCED, KafkaError._FATAL),
        )

    def _abort(self, producer: Producer, cause: BaseException) -> None:
        """Abort the open transaction so that its records never show and its id is free again.

        A fatal or fenced producer cannot abort; the broker aborts its transaction when the next
        holder initialises the id, or at the transaction timeout."""
        if isinstance(cause, EpochWriteError) and cause.fatal:
            return
        try:
            call_within(
                self._timeout + _STUCK_GRACE_S,
                lambda: producer.abort_transaction(self._timeout),
                on_stuck=lambda: self._end_stuck_worker("abort_transaction"),
            )
        except KafkaException as exc:
            log.error("%s: abort after %r failed too: %s", self._where, cause, exc)

    def _end_stuck_worker(self, what: str) -> None:
        """A call blocked past its own timeout: say so, and end this Python worker so that the
        task fails now rather than never; its retry fences this attempt's transaction."""
        log.error(
            "%s: %s has not returned %.0f s after its own timeout of %.0f s (librdkafka "
            "issues #5456, #5511: a coordinator that went away); ending this Python worker "
            "(exit %d) so that Spark retries the task, and the retry fences this attempt",
            self._where, what, _STUCK_GRACE_S, self._timeout, STUCK_EXIT_CODE,
        )  # fmt: skip
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(STUCK_EXIT_CODE)

    def _reach(self, point: str) -> None:
        if self._faults is not None:
            self._faults.reach(point)

    def _outcome(
        self,
        rows: int,
        size: int,
        *,
        skipped: bool,
        setup: float,
        init: float,
        marker: float,
        produce: float = 0.0,
        commit: float = 0.0,
    ) -> EpochOutcome:
        return EpochOutcome(
            query_id=self._where.query_id,
            partition=self._where.partition,
            epoch=self._where.epoch,
            attempt=self._where.attempt,
            transactional_id=self._transactional_id,
            rows=rows,
            skipped=skipped,
            bytes=size,
            setup_seconds=setup,
            init_seconds=init,
            marker_seconds=marker,
            produce_seconds=produce,
            commit_seconds=commit,
        )


def _flushed(producer: Producer, timeout_s: float) -> bool:
    """Whether every record's delivery report is in. A fenced or failed producer's flush may
    raise (confluent-kafka's flush then returns NULL without an exception: a SystemError): the
    part names no offsets, and the produce or commit after it fails the task as it should."""
    try:
        return producer.flush(timeout_s) == 0
    except (KafkaException, SystemError):
        return False
