"""Upgrades one side at a time: a sink that writes no epoch manifest (`epochs=per-partition`,
as every release before whole epochs) into a route left at the default (whole epochs) lands
every row at once, found from the records' own headers, and another producer's records on the
same topic are not held behind it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.kafka_admin import create_topic
from bridge.names import PROVENANCE_QUERY, PROVENANCE_WHOLE
from bridge_shell.spark.producer_job import run
from tests.consumer_helpers import drained, files_job, produce, running, settings_for, sql
from tests.harness import Endpoints
from tests.kafka_helpers import read_messages

PARTITIONS = 2


@pytest.mark.parametrize("epochs", ["per-partition", "whole"])
def test_a_sink_without_the_manifest_lands_at_once_on_a_default_route(
    spark: Any, stack: Endpoints, names: dict[str, str], tmp_path: Path, epochs: str
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint, note text)")
    stack.let_consumer_write(table, schema=names["schema"])
    lines = [f'{{"id": {i}, "note": "n{i}"}}' for i in range(300)]
    job = files_job(stack, names["topic"], tmp_path, lines, epochs=epochs)
    assert run(job, spark).rows_written == 300
    produce(stack, names["topic"], [(None, {"id": 1000 + i, "note": "x"}) for i in range(30)])
    messages = read_messages(
        stack.bootstrap_servers, names["topic"], partitions=PARTITIONS, config=stack.properties()
    )
    sinks = [dict(m.headers() or ()) for m in messages]
    marked = {PROVENANCE_WHOLE in headers for headers in sinks if PROVENANCE_QUERY in headers}
    assert marked == {epochs == "whole"}  # only a sink that writes the manifest says so
    with running(settings_for(stack, names)) as service:  # the route says nothing: whole
        drained(stack, names, PARTITIONS, timeout=90)
        published = sum(
            found.value
            for metric in service.metrics.registry.collect()
            for found in metric.samples
            if found.name == "bridge_consumer_epochs_published_total"
        )
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [(330, 330)]
    assert (published == 0) is (epochs == "per-partition")  # per partition: no epoch to wait for
