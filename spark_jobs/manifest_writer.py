"""The driver's half of the epoch manifest: the epoch's record, once every task succeeded.

Spark calls the sink's `commit(messages, batchId)` once per epoch, on the driver, after every
write task of it succeeded and before it logs the epoch as done in the checkpoint. There the
epoch's record (`bridge.epoch_manifest.Epoch`) is written in a Kafka transaction of its own,
under the transactional id `<prefix>-epochs`: a newer driver's first transaction fences a
zombie's, and one killed inside its transaction leaves nothing a read_committed reader sees.

A driver killed before the hook or inside it replays the epoch from its checkpoint: the tasks
skip (their markers say they committed), and the hook writes the record. One killed after it
writes the same record again on replay; readers take the first.

The producer is kept per Python worker, which Spark reuses across epochs: its
`init_transactions` (a round trip to the coordinator, and the fencing) is paid once. Any error
drops it, and the epoch's record is tried again with a new one (whose `init_transactions` aborts
what the old one left open) until the transaction timeout; then the hook raises, the query stops,
and a restart replays the epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, Producer
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from bridge.epoch_manifest import Epoch, key_of
from bridge.names import DEFAULT_TRANSACTIONAL_ID_HEAD
from spark_jobs.epoch_transaction import RDKAFKA_LOG, EpochOutcome
from spark_jobs.faults import TaskFaults
from spark_jobs.sink_options import SinkOptions

log = logging.getLogger("bridge.sink")

# (bootstrap servers, transactional id) -> a producer whose init_transactions has run.
_producers: dict[tuple[str, str], Producer] = {}


def epoch_record(epoch: int, outcomes: Sequence[EpochOutcome | None]) -> Epoch | None:
    """The record of `epoch` from its tasks' outcomes: every task that wrote a part, this time
    or before (skipped: its marker says so). None when no task reported, so the query is not
    known (an epoch of no tasks: nothing to wait for)."""
    reported = [outcome for outcome in outcomes if outcome is not None]
    if not reported:
        return None
    parts = sorted(outcome.partition for outcome in reported if not outcome.empty)
    return Epoch(query=reported[0].query_id, epoch=epoch, parts=tuple(parts))


def write_epoch(options: SinkOptions, epoch: int, outcomes: Sequence[EpochOutcome | None]) -> None:
    """Write the epoch's record to the manifest topic in a transaction, or raise."""
    record = epoch_record(epoch, outcomes)
    if record is None:
        log.warning("epoch %d: no task reported; no manifest record is written", epoch)
        return
    prefix = options.prefix or DEFAULT_TRANSACTIONAL_ID_HEAD + record.query
    transactional_id = f"{prefix}-epochs"
    faults = TaskFaults.for_driver(prefix=prefix, epoch=epoch)
    timeout = options.transaction_timeout_ms / 1000
    started = time.monotonic()

    def attempt() -> None:
        producer = _producer(options, transactional_id, timeout)
        try:
            producer.begin_transaction()
            producer.produce(options.epochs_topic, record.encode(), key_of(record.query), 0)
            if faults is not None:
                faults.reach("manifest-before-commit")
            producer.commit_transaction(timeout)
        except KafkaException:
            _drop(options, transactional_id)
            raise

    for tried in Retrying(
        retry=retry_if_exception_type(KafkaException),
        stop=stop_after_delay(timeout),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        before_sleep=lambda state: log.warning(
            "epoch %d: the manifest record failed, trying again: %s",
            epoch,
            state.outcome.exception() if state.outcome else None,
        ),
        reraise=True,
    ):
        with tried:
            attempt()
    if faults is not None:
        faults.reach("manifest-after-commit")
    log.info(
        "epoch %d: manifest record written (%d parts) in %.0f ms",
        epoch,
        len(record.parts),
        (time.monotonic() - started) * 1000,
    )


def _producer(options: SinkOptions, transactional_id: str, timeout: float) -> Producer:
    key = (options.bootstrap_servers, transactional_id)
    producer = _producers.get(key)
    if producer is None:
        config: dict[str, Any] = {**options.kafka, "linger.ms": 0}
        config["transactional.id"] = transactional_id
        config["transaction.timeout.ms"] = options.transaction_timeout_ms
        config["logger"] = RDKAFKA_LOG  # librdkafka's lines as log records, not raw on stderr
        producer = Producer(config)
        producer.init_transactions(timeout)
        _producers[key] = producer
    return producer


def _drop(options: SinkOptions, transactional_id: str) -> None:
    """Forget a producer after an error: the next attempt starts a new one, whose
    init_transactions aborts whatever this one left open."""
    producer = _producers.pop((options.bootstrap_servers, transactional_id), None)
    if producer is not None:
        producer.flush(0)
