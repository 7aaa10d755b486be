"""A Spark query replayed after its markers are gone lands nothing twice in PostgreSQL.

The driver died between its Kafka commits and Spark's commit log (its last commit-log entry
removed, as such a crash leaves it: tests/integration/test_producer_faults.py kills a real
driver there), and the query stayed stopped longer than `offsets.retention.minutes`, so that
its marker groups expired (deleted here, as their expiry would). The restarted query's tasks
find no marker and write the epoch again: Kafka holds it twice. Two consumer groups read the
topic all along, one through a whole route and one through a route applied per partition; each
lands every id once, and counts and names what came again (a whole route by its query's
watermark, `consumers.epochs.ledger`; one per partition by the attempt ids the partition
carried, `consumers.batch.replays`). With the markers kept, the replay writes nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from bridge.kafka_admin import create_topic
from bridge.names import DEFAULT_EPOCHS_TOPIC, MARKER_GROUP_INFIX
from bridge_shell.spark.producer_job import run
from consumers.service import ConsumerService
from tests.consumer_helpers import eventually, running, sample, settings_for, sql
from tests.harness import Endpoints
from tests.integration.test_sink import PARTITIONS, files_job, write_orders
from tests.kafka_helpers import read_all

REPLAYED = "bridge_consumer_replayed_epoch_records_total"
FILES, ROWS_PER_FILE = 4, 500  # two epochs of two files
ROWS = FILES * ROWS_PER_FILE


def delete_marker_groups(stack: Endpoints, query: str) -> list[str]:
    """The query's marker groups deleted (the sink's default prefix), as their expiry would."""
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers, **stack.properties()})
    head = f"bridge-{query}{MARKER_GROUP_INFIX}"
    groups = [g.group_id for g in admin.list_consumer_groups().result(60).valid
              if g.group_id.startswith(head)]  # fmt: skip
    assert groups, f"no marker group of {query}"
    for future in admin.delete_consumer_groups(groups, request_timeout=60).values():
        future.result(60)
    return groups


@pytest.fixture
def consumers(
    stack: Endpoints, names: dict[str, str]
) -> Iterator[dict[str, tuple[ConsumerService, str]]]:
    """Two groups over the topic, running all along: its route whole in one, per partition in
    the other; each with a table without a key, so that a row twice shows."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS,
                 config=stack.properties())  # fmt: skip
    create_topic(stack.bootstrap_servers, DEFAULT_EPOCHS_TOPIC, partitions=1,
                 config=stack.properties())  # fmt: skip
    found: dict[str, tuple[ConsumerService, str]] = {}
    with ExitStack() as stack_of:
        for epochs in ("whole", "per-partition"):
            suffix = uuid.uuid4().hex[:8]
            ours = {**names, "group": f"{names['group']}-{suffix}",
                    "schema": f"{names['schema']}_{suffix}", "table": f"me_{suffix}"}  # fmt: skip
            table = f"public.{ours['table']}"
            sql(stack, f"CREATE TABLE {table} (id bigint, amount int, note text)")
            sql(stack, f"GRANT ALL ON {table} TO PUBLIC")
            service = stack_of.enter_context(running(settings_for(stack, ours, epochs=epochs)))
            found[epochs] = (service, table)
        yield found


def landed(stack: Endpoints, table: str) -> tuple[int, int]:
    rows = sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {table}")
    return int(rows[0][0]), int(rows[0][1])


def all_once(stack: Endpoints, table: str) -> bool:
    return landed(stack, table) == (ROWS, ROWS)


def counted(service: ConsumerService, query: str, records: int) -> bool:
    return sample(service, REPLAYED, query=query) == records


@pytest.mark.slow
@pytest.mark.parametrize("markers", ["kept", "expired"])
def test_a_query_replayed_after_its_markers_are_gone_lands_every_id_once(
    spark: Any,
    stack: Endpoints,
    names: dict[str, str],
    tmp_path: Path,
    consumers: dict[str, tuple[ConsumerService, str]],
    markers: str,
) -> None:
    write_orders(tmp_path / "in", files=FILES, rows_per_file=ROWS_PER_FILE)
    job = files_job(stack, tmp_path, names["topic"])
    assert run(job, spark).epochs_committed == 2
    for _, table in consumers.values():
        eventually(partial(all_once, stack, table), timeout=120)
    query = str(json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"])
    for entry in ("1", ".1.crc"):  # as a driver killed before Spark's commit log leaves it
        (tmp_path / "checkpoint" / "commits" / entry).unlink(missing_ok=True)
    if markers == "expired":
        delete_marker_groups(stack, query)

    run(job, spark)  # replays epoch 1

    in_kafka = read_all(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS,
                        config=stack.properties())  # fmt: skip
    again = ROWS // 2 if markers == "expired" else 0
    assert len(in_kafka) == ROWS + again, "the replay wrote what its markers said"
    for epochs, (service, table) in consumers.items():
        eventually(partial(counted, service, query, again), timeout=120)
        assert landed(stack, table) == (ROWS, ROWS), epochs
