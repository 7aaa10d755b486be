"""The sink's pure parts: options, input schema, ids, markers, counters, fault rules."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from bridge.acls import table_rights
from bridge.errors import ConfigError
from bridge_shell.spark.spark_session import REDACTION_REGEX
from spark_jobs.epoch_markers import (
    Marker,
    marker_group,
    marker_position,
    partition_of_marker_group,
)
from spark_jobs.epoch_transaction import EpochOutcome, TaskCoordinates, call_within
from spark_jobs.faults import ENV_FAULTS, InjectedFault, TaskFaults
from spark_jobs.kafka_rows import RecordChunk, RowError, check_schema, record_chunks
from spark_jobs.progress import EpochSummary, SinkCounters
from spark_jobs.sink_options import ID_POOL_SIZE, IdNaming, SinkOptions
from spark_jobs.spark_kafka_options import java_client_options
from spark_jobs.txn_admin import transactional_ids

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "orders"}


def refused(options: dict[str, str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as raised:
        SinkOptions.parse(options)
    return dict(raised.value.problems)


def test_options_pass_kafka_properties_through_and_default_the_rest() -> None:
    options = SinkOptions.parse({**BASE, "kafka.Linger.MS": "20", "checkpointLocation": "/c"})
    assert options.kafka == {"bootstrap.servers": "127.0.0.1:9092", "linger.ms": "20"}
    assert options.naming is IdNaming.POOLED
    assert options.prefix is None and options.transaction_timeout_ms == 60_000
    assert options.epochs_retention_ms == 7 * 24 * 3600 * 1000  # Kafka's own default
    assert SinkOptions.parse({**BASE, "epochs.retention.ms": "-1"}).epochs_retention_ms == -1


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"kafka.transactional.id": "x"}, "kafka.transactional.id"),
        ({"kafka.transaction.timeout.ms": "1"}, "kafka.transaction.timeout.ms"),
        ({"transaction.timeout.ms": "900001"}, "transaction.timeout.ms"),
        ({"transaction.timeout.ms": "soon"}, "transaction.timeout.ms"),
        ({"transactional.id.naming": "per-query"}, "transactional.id.naming"),
        ({"transactional.id.prefix": "has space"}, "transactional.id.prefix"),
        ({"topik": "orders"}, "topik"),
        ({"epochs": "all"}, "epochs"),
        ({"epochs.topic": "has space"}, "epochs.topic"),
        ({"epochs.topic": "orders"}, "epochs.topic"),  # the records' own topic
        ({"epochs.retention.ms": "a week"}, "epochs.retention.ms"),
        ({"epochs.retention.ms": "60000"}, "epochs.retention.ms"),  # under an hour
        ({"epochs.retention.ms": "-2"}, "epochs.retention.ms"),
    ],
)
def test_bad_options_are_refused_by_name(extra: dict[str, str], key: str) -> None:
    assert key in refused({**BASE, **extra})


def test_the_options_spark_passes_for_the_query_itself_are_taken() -> None:
    """`.queryName(...)` and `checkpointLocation` reach the sink as options; an unknown option
    of ours is still refused."""
    spark_own = {"queryName": "orders", "checkpointLocation": "/c", "path": "/p"}
    SinkOptions.parse({**BASE, **spark_own})
    assert "querynames" in refused({**BASE, **spark_own, "queryNames": "typo"})


def test_missing_bootstrap_is_refused() -> None:
    assert "kafka.bootstrap.servers" in refused({"topic": "orders"})


def schema(*fields: StructField) -> StructType:
    return StructType(list(fields))


def test_schema_needs_a_value_and_a_topic() -> None:
    with pytest.raises(ConfigError) as raised:
        check_schema(schema(StructField("key", StringType())), default_topic=None)
    assert {"value", "topic"} <= dict(raised.value.problems).keys()


def test_schema_refuses_wrong_column_types() -> None:
    bad = schema(
        StructField("value", IntegerType()),
        StructField("partition", StringType()),
        StructField("headers", ArrayType(StringType())),
    )
    with pytest.raises(ConfigError) as raised:
        check_schema(bad, default_topic="t")
    assert set(dict(raised.value.problems)) == {"value", "partition", "headers"}


def test_schema_of_spark_kafka_sink_is_accepted() -> None:
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    check_schema(
        schema(
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("headers", ArrayType(header)),
        ),
        default_topic=None,
    )


def test_rows_become_records_with_provenance_first() -> None:
    import pyarrow as pa

    batch = pa.RecordBatch.from_pydict(
        {
            "value": [b"a", b"b"],
            "key": ["k1", None],
            "headers": [[{"key": "h", "value": b"v"}], None],
        }
    )
    provenance = [("bridge.epoch", b"3")]
    [chunk] = record_chunks(iter([batch]), default_topic="t", provenance=provenance)
    assert list(chunk.records) == [
        ("t", b"a", "k1", -1, [("bridge.epoch", b"3"), ("h", b"v")]),
        ("t", b"b", None, -1, [("bridge.epoch", b"3")]),
    ]
    assert (chunk.record_count, chunk.size) == (2, 4)
    assert chunk.topics == {"t": 2}  # counted as the records were read


def test_a_chunk_counts_its_records_per_topic_for_the_epoch_manifest() -> None:
    import pyarrow as pa

    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c"], "topic": ["x", None, "x"]})
    [chunk] = record_chunks(iter([batch]), default_topic="t", provenance=[])
    assert chunk.topics == {}  # nothing read yet
    assert [record[0] for record in chunk.records] == ["x", "t", "x"]
    assert chunk.topics == {"x": 2, "t": 1}


def test_value_and_key_batches_share_one_provenance_dict() -> None:
    """What `bridge produce` writes: every record of a batch carries the same headers object,
    and the count and size are the batch's, strings counted in UTF-8 bytes."""
    import pyarrow as pa

    provenance = [("bridge.query", b"q"), ("bridge.partition", b"0"), ("bridge.epoch", b"3")]
    batches = [
        pa.RecordBatch.from_pydict({"value": ["é", None], "key": ["k", "kk"]}),
        pa.RecordBatch.from_pydict({"value": [b"xyz"]}),
    ]
    first, second = record_chunks(iter(batches), default_topic="t", provenance=provenance)
    rows = list(first.records)
    assert rows == [("t", "é", "k", -1, dict(provenance)), ("t", None, "kk", -1, dict(provenance))]
    assert rows[0][4] is rows[1][4]
    assert list(rows[0][4]) == ["bridge.query", "bridge.partition", "bridge.epoch"]  # in order
    assert (first.record_count, first.size) == (2, 2 + 1 + 2)
    assert list(second.records) == [("t", b"xyz", None, -1, dict(provenance))]
    assert (second.record_count, second.size) == (1, 3)
    assert RecordChunk.of(rows) == (rows, 2, 5, {"t": 2})
    assert first.topics == {"t": 2}  # known before the records are read


def test_a_null_topic_without_a_default_names_the_row() -> None:
    import pyarrow as pa

    batches = [
        pa.RecordBatch.from_pydict({"value": [b"a"], "topic": ["t"]}),
        pa.RecordBatch.from_pydict({"value": [b"b", b"c"], "topic": ["t", None]}),
    ]
    chunks = list(record_chunks(iter(batches), default_topic=None, provenance=[]))
    assert list(chunks[0].records) == [("t", b"a", None, -1, [])]
    with pytest.raises(RowError, match="row 2 of this task: topic is null"):
        list(chunks[1].records)


def test_transactional_ids_by_naming() -> None:
    where = TaskCoordinates(query_id="q", prefix="orders", partition=4, epoch=17, attempt=1)
    assert where.transactional_id(IdNaming.PER_EPOCH) == "orders-p4-e17"
    assert where.transactional_id(IdNaming.PER_PARTITION) == "orders-p4"
    assert where.transactional_id(IdNaming.POOLED) == "orders-p4-s1"


def test_pooled_ids_are_bounded_by_partitions_and_shared_by_every_attempt_of_an_epoch() -> None:
    def pooled(partition: int, epoch: int, attempt: int = 0) -> str:
        return TaskCoordinates(
            query_id="q", prefix="orders", partition=partition, epoch=epoch, attempt=attempt
        ).transactional_id(IdNaming.POOLED)

    ids = {pooled(p, e) for p in range(8) for e in range(1_000)}
    assert len(ids) == 8 * ID_POOL_SIZE  # what the brokers hold, whatever the query's age
    # A retry, a replay after a crash and a speculative twin of an epoch share its id: each
    # fences the attempt it replaces. Consecutive epochs of a partition never share one.
    assert {pooled(3, 41, attempt) for attempt in range(4)} == {pooled(3, 41)}
    assert all(pooled(3, e) != pooled(3, e + 1) for e in range(100))
    assert transactional_ids("orders", [0, 2], None, IdNaming.POOLED) == [
        "orders-p0-s0",
        "orders-p0-s1",
        "orders-p2-s0",
        "orders-p2-s1",
    ]
    assert transactional_ids("orders", [2], 7, IdNaming.POOLED) == ["orders-p2-s1"]


def test_marker_round_trip() -> None:
    [position] = marker_position("markers", 17, {"rows": 5})
    assert position.offset == 18  # epoch + 1: offset 0 must never mean epoch 0
    marker = Marker.from_committed(position)
    assert marker is not None and marker.epoch == 17 and marker.details["rows"] == 5
    assert Marker.from_committed(TopicPartition("markers", 0, -1001)) is None
    assert partition_of_marker_group("orders", marker_group("orders", 12)) == 12
    assert partition_of_marker_group("orders", marker_group("orders-2", 12)) is None


def test_counters_count_a_replayed_epoch_once() -> None:
    counters = SinkCounters()
    first = EpochSummary(epoch=4, rows=10, partitions_written=(0, 1), partitions_skipped=())
    replay = EpochSummary(epoch=4, rows=0, partitions_written=(), partitions_skipped=(0, 1))
    counters.add(first, committed=True)
    counters.add(replay, committed=True)
    assert (counters.epochs_committed, counters.rows_written, counters.partitions_skipped) == (
        1,
        10,
        2,
    )


def test_an_epoch_summary_keeps_each_written_tasks_steps_and_the_tasks_window() -> None:
    where = TaskCoordinates(query_id="q", prefix="orders", partition=1, epoch=3, attempt=0)
    written = EpochOutcome(
        partition=0, epoch=3, attempt=0, transactional_id="orders-p0-e3", rows=7, skipped=False,
        setup_seconds=0.010, init_seconds=0.004, marker_seconds=0.001, produce_seconds=0.2,
        commit_seconds=0.005, first_batch_seconds=0.03, started_at=100.0, finished_at=100.25,
    )  # fmt: skip
    empty = replace(EpochOutcome.of_empty_input(where), started_at=99.5, finished_at=99.6)
    summary = EpochSummary.of(3, [written, empty])

    steps = {"first_batch": 30.0, "setup": 10.0, "init": 4.0, "marker": 1.0, "produce": 200.0,
             "commit": 5.0}  # fmt: skip
    assert summary.steps_ms == {step: (ms,) for step, ms in steps.items()}
    assert summary.transaction_overhead_ms == (20.0,)  # setup + init + marker + commit
    assert (summary.tasks_started_at, summary.tasks_finished_at) == (99.5, 100.25)
    assert summary.partitions_empty == 1 and summary.recorded_at is not None


def test_fault_rules_fire_once_and_only_where_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"point": "before-commit", "epoch": 2, "action": "fail"}]))
    monkeypatch.setenv(ENV_FAULTS, str(rules))
    assert TaskFaults.for_task(prefix="p", partition=0, epoch=1, attempt=0) is None
    faults = TaskFaults.for_task(prefix="p", partition=0, epoch=2, attempt=0)
    assert faults is not None
    faults.reach("after-commit")  # another point: nothing
    with pytest.raises(InjectedFault):
        faults.reach("before-commit")
    faults.reach("before-commit")  # fired already
    monkeypatch.delenv(ENV_FAULTS)
    assert TaskFaults.for_task(prefix="p", partition=0, epoch=2, attempt=0) is None


def test_a_call_is_bounded_even_when_the_library_ignores_its_own_timeout() -> None:
    assert call_within(5, lambda: 42, on_stuck=lambda: None) == 42
    with pytest.raises(ValueError, match="'refused'"):
        call_within(5, lambda: int("refused"), on_stuck=lambda: None)
    release = threading.Event()
    stuck: list[bool] = []
    try:
        with pytest.raises(TimeoutError):
            call_within(0.2, lambda: release.wait(30), on_stuck=lambda: stuck.append(True))
        assert stuck == [True]
    finally:
        release.set()  # the abandoned call's thread ends too


def test_the_sink_options_and_the_job_never_show_kafka_secrets() -> None:
    from bridge_shell.spark.producer_job import ProducerJob, Source

    secret = {"sasl.password": "hunter2", "sasl.jaas.config": "password=hunter2;"}
    options = SinkOptions.parse(
        {"kafka.bootstrap.servers": "b:9092", "topic": "t"}
        | {f"kafka.{key}": value for key, value in secret.items()}
    )
    assert options.kafka["sasl.password"] == "hunter2"  # the clients get it
    job = ProducerJob(source=Source.RATE, topic="t", checkpoint="s3a://bucket/c",
                      bootstrap_servers="b:9092", kafka_properties=secret)  # fmt: skip
    assert "hunter2" not in repr(options) + repr(job)


def test_the_kafka_source_gets_the_sinks_security_in_the_java_clients_terms() -> None:
    options = java_client_options(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "bridge-producer",
            "sasl.password": 'pa"ss\\word',
            "ssl.ca.location": "/stack/tls/ca.pem",
            "statistics.interval.ms": "1000",  # librdkafka's own: left out
        }
    )
    assert options == {
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="bridge-producer" password="pa\\"ss\\\\word";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/stack/tls/ca.pem",
        "kafka.security.protocol": "SASL_SSL",
    }
    # Spark redacts each of them by key in plans, the UI and event logs.
    secret_keys = [key for key in options if re.search(REDACTION_REGEX, key)]
    assert secret_keys == ["kafka.sasl.mechanism", "kafka.sasl.jaas.config"]


def test_a_security_setting_the_java_client_cannot_take_is_refused_by_name() -> None:
    with pytest.raises(ConfigError) as refused:
        java_client_options(
            {
                "security.protocol": "SSL",
                "ssl.certificate.location": "/c.pem",
                "ssl.key.location": "/k.pem",
            }
        )
    fields = [name for name, _ in refused.value.problems]
    assert fields == [
        "kafka.properties.ssl.certificate.location",
        "kafka.properties.ssl.key.location",
    ]
    with pytest.raises(ConfigError, match=r"sasl\.mechanism"):
        java_client_options(
            {"sasl.mechanism": "OAUTHBEARER", "sasl.username": "u", "sasl.password": "p"}
        )


def test_each_route_mode_names_the_table_rights_it_needs() -> None:
    assert table_rights("insert", deletes=False) == ("INSERT",)
    assert table_rights("insert", deletes=True) == ("INSERT", "SELECT", "DELETE")
    assert table_rights("upsert", deletes=True) == ("INSERT", "SELECT", "UPDATE", "DELETE")
    assert table_rights("replace", deletes=True) == ("INSERT", "SELECT", "DELETE")
    assert table_rights("insert_if_absent", deletes=True) == ("INSERT", "SELECT", "DELETE")
    assert table_rights("update", deletes=True) == ("SELECT", "UPDATE", "DELETE")


def test_a_typed_key_needs_its_field_and_the_registry() -> None:
    from bridge_shell.spark.producer_job import ProducerJob, Source

    def problems(**job: Any) -> dict[str, str]:
        with pytest.raises(ConfigError) as raised:
            ProducerJob(source=Source.RATE, topic="t", checkpoint="/c", bootstrap_servers="b:9",
                        **job).check()  # fmt: skip
        return dict(raised.value.problems)

    assert problems(key_format="avro") == {
        "--key-format": "a typed key is a record of --key-field: name it",
        "schema_registry.url": "--key-format avro needs the schema registry",
    }
    assert problems(key_format="thrift", key_field="id") == {
        "--key-format": "'thrift' is not json, avro, json-schema or protobuf"
    }
    typed: dict[str, Any] = {"key_field": "value", "key_format": "avro",
                             "registry": {"url": "http://r"}}  # fmt: skip
    ProducerJob(source=Source.RATE, topic="t", checkpoint="/c", bootstrap_servers="b:9",
                **typed).check()  # fmt: skip


def test_spark_packages_name_the_installed_pysparks_version_as_the_pom_pins_it() -> None:
    import re
    from pathlib import Path

    import pyspark

    from spark_jobs.spark_packages import spark_packages

    version = pyspark.__version__
    assert spark_packages() == f"org.apache.spark:spark-avro_2.13:{version}"
    assert spark_packages(avro=False, kafka_source=True) == (
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
    )
    pom = (Path(__file__).parents[2] / "spark_jobs" / "jars" / "pom.xml").read_text()
    pinned = re.search(r"<spark.version>([^<]+)</spark.version>", pom)
    assert pinned is not None and pinned.group(1) == version


def test_a_key_field_the_kafka_sources_rows_lack_is_refused_before_spark_starts() -> None:
    from bridge_shell.spark.producer_job import ProducerJob, Source

    job = ProducerJob(source=Source.KAFKA, source_topic="raw", topic="t", checkpoint="/c",
                      bootstrap_servers="b:9", key_field="order_id")  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        job.check()
    assert dict(raised.value.problems)["--key-field"].startswith(
        "'order_id': the kafka source's rows are key, value, source_topic"
    )
    ProducerJob(source=Source.KAFKA, source_topic="raw", topic="t", checkpoint="/c",
                bootstrap_servers="b:9", key_field="key").check()  # fmt: skip
