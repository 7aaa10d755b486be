"""Routes as users of Kafka Connect expect them, on the real stack: metadata columns filled from
each record's coordinates, timestamp, key and headers, the Spark sink's provenance among them,
equal to what a read_committed reader sees of the same record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bridge.errors import ConfigError
from bridge.kafka_admin import create_topic
from bridge.names import PROVENANCE_EPOCH, PROVENANCE_PARTITION, PROVENANCE_QUERY
from bridge_shell.spark.producer_job import ProducerJob, Source, run
from consumers.service import ConsumerService
from tests.consumer_helpers import drained, produce, running, settings_for, sql
from tests.harness import Endpoints
from tests.kafka_helpers import read_messages

PARTITIONS = 2
METADATA = {
    "src_topic": "topic", "src_partition": "partition", "src_offset": "offset",
    "written_at": "timestamp", "k": "key", "trace": "header:trace", "query": "spark.query",
    "spark_partition": "spark.partition", "epoch": "spark.epoch",
}  # fmt: skip


@pytest.fixture
def traced_table(stack: Endpoints, names: dict[str, str]) -> str:
    table = f"public.{names['table']}"
    sql(stack, f"""CREATE TABLE {table} (
        id bigint, note text, src_topic text, src_partition integer, src_offset bigint,
        written_at timestamptz, k text, trace text, query text, spark_partition integer,
        epoch bigint)""")  # fmt: skip
    stack.let_consumer_write(table, schema=names["schema"])
    return table


def _header(message: Any, name: str) -> str | None:
    found = [value for key, value in message.headers() or () if key == name]
    return found[-1].decode() if found else None


def test_metadata_and_provenance_columns_match_what_a_reader_sees(
    spark: Any, stack: Endpoints, names: dict[str, str], traced_table: str, tmp_path: Path
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.json").write_text(
        "".join(f'{{"id": {i}, "note": "n{i}"}}\n' for i in range(40))
    )
    producer = {k: str(v) for k, v in stack.properties("producer").items()}
    job = ProducerJob(
        source=Source.FILES, input=tmp_path / "in", topic=names["topic"], key_field="id",
        checkpoint=tmp_path / "checkpoint", bootstrap_servers=stack.bootstrap_servers,
        kafka_properties=producer,
    )  # fmt: skip
    assert run(job, spark).rows_written == 40
    # And records from elsewhere: a header of their own, no provenance, no key.
    produce(stack, names["topic"], [(None, {"id": 100 + i, "note": "x"}) for i in range(5)],
            headers=[("trace", "t-1"), ("trace", "t-2")])  # fmt: skip
    settings = settings_for(stack, names, metadata=METADATA)
    with running(settings):
        drained(stack, names, PARTITIONS)

    expected = set()
    for message in read_messages(stack.bootstrap_servers, names["topic"],
                                 partitions=PARTITIONS, config=stack.properties()):  # fmt: skip
        _, millis = message.timestamp()
        key = message.key()
        expected.add((
            message.topic(), message.partition(), message.offset(),
            datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis),
            None if key is None else key.decode(), _header(message, "trace"),
            _header(message, PROVENANCE_QUERY),
            int(p) if (p := _header(message, PROVENANCE_PARTITION)) is not None else None,
            int(e) if (e := _header(message, PROVENANCE_EPOCH)) is not None else None,
        ))  # fmt: skip
    stored = sql(stack, f"SELECT src_topic, src_partition, src_offset, written_at, k, trace, "
                        f"query, spark_partition, epoch FROM {traced_table}")  # fmt: skip
    assert len(stored) == len(expected) == 45
    assert set(stored) == expected
    # The sink's provenance on every row it wrote, the Spark query's id the same on all.
    spark_rows = sql(stack, f"SELECT count(*), count(DISTINCT query), count(k) FROM "
                            f"{traced_table} WHERE epoch IS NOT NULL")  # fmt: skip
    assert spark_rows == [(40, 1, 40)]
    assert sql(stack, f"SELECT DISTINCT trace FROM {traced_table} WHERE id >= 100") == [("t-2",)]


def test_a_metadata_column_the_table_lacks_is_refused_naming_the_key_path(
    stack: Endpoints, names: dict[str, str], traced_table: str
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    settings = settings_for(stack, names, metadata={"nope": "offset"})
    with pytest.raises(ConfigError, match=r"consumer\.routes\.0\.metadata\.nope"):
        ConsumerService(settings).start()
