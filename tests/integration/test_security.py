"""Misconfigured security on the secured stack (pytest --secure): each mistake a user can make
is refused with an error that says what to fix, and writes nothing."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from bridge import acls
from bridge.errors import PermissionMissing
from bridge.kafka_admin import KafkaAdmin, TopicError, create_topic
from bridge_shell.spark.producer_job import ProducerJob, Source, run
from bridge_shell.stack.tls import CertificateAuthority
from consumers.membership.kafka_health import KafkaAccessDenied, KafkaRefused, KafkaUnavailable
from consumers.service import ConsumerService
from spark_jobs.epoch_transaction import EpochTransaction, EpochWriteError, TaskCoordinates
from spark_jobs.sink_options import SinkOptions
from tests.consumer_helpers import in_background, produce, settings_for, sql
from tests.harness import Endpoints
from tests.kafka_helpers import read_all

pytestmark = pytest.mark.secured

# The shortest bound the settings allow: a client that cannot get in gives up this soon.
GIVE_UP_MS = 5_000


@pytest.fixture(autouse=True)
def _secured_only(stack: Endpoints) -> None:
    if not stack.secure:
        pytest.skip("needs the secured stack: runs under pytest --secure")


@pytest.fixture
def applied(stack: Endpoints, names: dict[str, str]) -> dict[str, str]:
    """A topic with records, and a table and state schema the consumer's role may write."""
    create_topic(stack.bootstrap_servers, names["topic"], config=stack.properties())
    sql(stack, f"CREATE TABLE public.{names['table']} (id int)")
    stack.let_consumer_write(f"public.{names['table']}", schema=names["schema"])
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(10)])
    return names


def run_until_it_ends(service: ConsumerService, timeout: float = 60) -> BaseException:
    """Run the started `service` until it raises; the error it ended with."""
    thread, failure = in_background(service)
    thread.join(timeout)
    if thread.is_alive():
        service.stop()
        thread.join(30)
        pytest.fail(f"the consumer kept running {timeout:.0f}s without a word")
    assert failure, "the consumer stopped without an error"
    return failure[0]


def consumer_error(
    stack: Endpoints, names: dict[str, str], kafka_properties: dict[str, Any]
) -> BaseException:
    settings = settings_for(stack, names, kafka_properties=kafka_properties,
                            consumer={"kafka_unavailable_timeout_ms": GIVE_UP_MS})  # fmt: skip
    service = ConsumerService(settings)
    service.start()
    try:
        return run_until_it_ends(service)
    finally:
        service.close()


def count(stack: Endpoints, names: dict[str, str]) -> int:
    return int(sql(stack, f"SELECT count(*) FROM public.{names['table']}")[0][0])


def test_a_wrong_password_ends_the_consumer_at_once_naming_the_settings(
    stack: Endpoints, applied: dict[str, str]
) -> None:
    wrong = {**stack.properties("consumer"), "sasl.password": "not-the-password"}
    error = consumer_error(stack, applied, wrong)
    assert isinstance(error, KafkaRefused), repr(error)
    assert "User:bridge-consumer" in str(error) and "sasl.password" in str(error)
    assert "Authentication failed" in str(error)
    assert "not-the-password" not in str(error)
    assert count(stack, applied) == 0


def test_a_plaintext_client_against_the_tls_listener_is_told_to_set_the_protocol(
    stack: Endpoints, applied: dict[str, str]
) -> None:
    error = consumer_error(stack, applied, {})
    assert isinstance(error, KafkaUnavailable), repr(error)
    assert "security.protocol" in str(error) and "PLAINTEXT" in str(error)
    assert count(stack, applied) == 0


def test_a_broker_certificate_from_another_ca_is_refused(
    stack: Endpoints, applied: dict[str, str], tmp_path: Path
) -> None:
    stranger = CertificateAuthority(tmp_path / "other-ca")
    stranger.ensure()
    untrusting = {**stack.properties("consumer"), "ssl.ca.location": str(stranger.ca.cert)}
    error = consumer_error(stack, applied, untrusting)
    assert isinstance(error, KafkaRefused), repr(error)
    assert "certificate verify failed" in str(error) and "ssl.ca.location" in str(error)
    assert count(stack, applied) == 0


@pytest.fixture
def principal(stack: Endpoints) -> Iterator[tuple[str, dict[str, str]]]:
    """A new SCRAM user with no rights yet, and its client settings."""
    user, password = f"bridge-test-{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(16)
    acls.add_scram_user(stack.client(), user, password, timeout=30)
    yield user, {**stack.properties("admin"), "sasl.username": user, "sasl.password": password}


def test_a_consumer_without_its_group_acl_ends_naming_the_right(
    stack: Endpoints, applied: dict[str, str], principal: tuple[str, dict[str, str]]
) -> None:
    user, properties = principal
    # Every right of a consumer, on another group than its own.
    acls.apply(stack.client(), user, acls.grants("consumer", group="another-group"), timeout=30)
    error = consumer_error(stack, applied, properties)
    assert isinstance(error, KafkaAccessDenied), repr(error)
    assert f"User:{user}" in str(error) and f"Read on group {applied['group']}" in str(error)
    assert count(stack, applied) == 0


def test_a_missing_table_grant_is_refused_at_start_naming_the_grant(
    stack: Endpoints, names: dict[str, str]
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], config=stack.properties())
    sql(stack, f"CREATE TABLE public.{names['table']} (id int PRIMARY KEY, body text)")
    stack.let_consumer_write(f"public.{names['table']}", schema=names["schema"])  # insert only
    settings = settings_for(stack, names, mode="upsert", key_columns=["id"])
    with pytest.raises(PermissionMissing) as refused:
        ConsumerService(settings).start()
    assert f'GRANT SELECT, UPDATE, DELETE ON "public"."{names["table"]}"' in str(refused.value)
    assert "bridge_consumer" in str(refused.value)


def test_a_producer_without_its_transactional_id_acl_fails_naming_it_and_writes_nothing(
    spark: Any,
    stack: Endpoints,
    topic_name: str,
    tmp_path: Path,
    principal: tuple[str, dict[str, str]],
) -> None:
    user, properties = principal
    prefix = f"denied-{uuid.uuid4().hex[:8]}"
    # Every right of a producer, with transactional ids of another prefix than its own.
    acls.apply(stack.client(), user, acls.grants("producer", transactional_ids="other"), timeout=30)
    message = producer_failure(spark, stack, topic_name, tmp_path, properties, prefix=prefix)
    assert "Transactional Id authorization failed" in message, message[-3000:]
    assert f"Write and Describe on transactional id {prefix}-" in message, message[-3000:]
    assert properties["sasl.password"] not in message
    assert_nothing_written(stack, topic_name)


def test_a_producer_with_a_wrong_password_fails_saying_so_and_writes_nothing(
    spark: Any, stack: Endpoints, topic_name: str, tmp_path: Path
) -> None:
    wrong = {**stack.properties("producer"), "sasl.password": "not-the-password"}
    # A short transaction timeout bounds each attempt's wait for its coordinator.
    message = producer_failure(spark, stack, topic_name, tmp_path, wrong, timeout_ms=5_000)
    assert "the brokers refused this client" in message, message[-3000:]
    assert "Authentication failed" in message and "sasl.password" in message
    assert "not-the-password" not in message
    assert_nothing_written(stack, topic_name)


def test_a_write_task_refused_on_connecting_fails_at_once_naming_the_settings(
    stack: Endpoints, topic_name: str
) -> None:
    """A job whose sink topics its driver already knows (a query running on, its password
    changed) is refused in its write tasks: each ends at the refusal, not at its transaction
    timeout (each of Spark's four attempts of a wrong password's job took 11 s before)."""
    wrong = {**stack.properties("producer"), "sasl.password": "not-the-password"}
    options = SinkOptions.parse(
        {**{f"kafka.{name}": value for name, value in wrong.items()}, "topic": topic_name,
         "kafka.bootstrap.servers": stack.bootstrap_servers, "transaction.timeout.ms": "60000"}
    )  # fmt: skip
    where = TaskCoordinates(query_id="q", prefix="refused", partition=0, epoch=0, attempt=0)
    started = time.monotonic()
    with pytest.raises(EpochWriteError) as refused, EpochTransaction(options, where) as task:
        task.write(lambda: iter([]))
    assert time.monotonic() - started < 30  # not the transaction's 60 s
    message = str(refused.value)
    assert "connecting failed; the brokers refused this client" in message, message
    assert "Authentication failed" in message and "sasl.password" in message
    assert "not-the-password" not in message


def test_the_operator_tools_with_a_wrong_password_say_so_instead_of_timing_out(
    stack: Endpoints,
) -> None:
    """`bridge offsets` and `bridge txn` ask through KafkaAdmin, the sink creates its marker
    topic with it: a refused login ends the request at once, saying why, and is not retried."""
    wrong = stack.client("tools", **{"sasl.password": "not-the-password"})
    started = time.monotonic()
    with pytest.raises(TopicError) as listing:
        KafkaAdmin(wrong, timeout=120).group_ids("bridge-")
    producer = {**stack.properties("producer"), "sasl.password": "not-the-password"}
    with pytest.raises(TopicError) as creating:
        create_topic(stack.bootstrap_servers, f"never-{uuid.uuid4().hex[:8]}", timeout=120,
                     config=producer)  # fmt: skip
    assert time.monotonic() - started < 60  # not the requests' 120 s each
    for refused in (listing.value, creating.value):
        assert "the brokers refused this client" in str(refused), str(refused)
        assert "Authentication failed" in str(refused) and "sasl.password" in str(refused)
        assert "not-the-password" not in str(refused)
        assert not refused.retriable


def producer_failure(
    spark: Any,
    stack: Endpoints,
    topic: str,
    tmp_path: Path,
    properties: dict[str, str],
    *,
    prefix: str | None = None,
    timeout_ms: int | None = None,
) -> str:
    """The error a files job of 100 rows into `topic`, as `properties`' principal, ends with."""
    create_topic(stack.bootstrap_servers, topic, partitions=2, config=stack.properties())
    (tmp_path / "in").mkdir()
    lines = [json.dumps({"id": i}) for i in range(100)]
    (tmp_path / "in" / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(StreamingQueryException) as failed:
        run(
            ProducerJob(
                source=Source.FILES,
                input=tmp_path / "in",
                topic=topic,
                checkpoint=tmp_path / "checkpoint",
                bootstrap_servers=stack.bootstrap_servers,
                kafka_properties=properties,
                transactional_id_prefix=prefix,
                transaction_timeout_ms=timeout_ms,
                key_field="id",
            ),
            spark,
        )
    return str(failed.value)


def assert_nothing_written(stack: Endpoints, topic: str) -> None:
    everything = read_all(stack.bootstrap_servers, topic, partitions=2,
                          isolation="read_uncommitted", config=stack.properties())  # fmt: skip
    assert everything == []
