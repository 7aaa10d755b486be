"""Upgrades one side at a time: a sink that writes no epoch manifest (`epochs=per-partition`,
as every release before whole epochs) into a route left at the default (whole epochs) lands
every row at once, found from the records' own headers, and another producer's records on the
same topic are not held behind it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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


# The last release before the sink marked its records `bridge.epochs: whole` (0.2.0).
_RELEASE_0_2_0 = "c1c3eb8"


@pytest.fixture(scope="module")
def consumer_0_2_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bridge 0.2.0's tree, its C readers built in place: a consumer not yet upgraded."""
    tree = tmp_path_factory.mktemp("bridge-0.2.0")
    root = Path(__file__).resolve().parents[2]
    archive = subprocess.run(["git", "-C", str(root), "archive", _RELEASE_0_2_0],
                             capture_output=True, check=False, timeout=60)  # fmt: skip
    if archive.returncode != 0:
        pytest.fail(f"git archive {_RELEASE_0_2_0}: {archive.stderr.decode()[-500:]} (a clone "
                    "with the project's history is needed)")  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=60)
    built = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    return tree


def test_a_consumer_of_the_release_before_applies_a_new_sinks_whole_epochs_exactly(
    spark: Any, stack: Endpoints, names: dict[str, str], tmp_path: Path, consumer_0_2_0: Path
) -> None:
    """The way a rolling upgrade goes when the producers are upgraded first: a consumer of
    0.2.0 reads records of this release's sink (whole epochs, the manifest, and the new
    `bridge.epochs: whole` header it does not know) and lands each row once."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=PARTITIONS)
    table = f"public.{names['table']}"
    sql(stack, f"CREATE TABLE {table} (id bigint, note text)")
    stack.let_consumer_write(table, schema=names["schema"])
    lines = [f'{{"id": {i}, "note": "n{i}"}}' for i in range(300)]
    assert (
        run(files_job(stack, names["topic"], tmp_path, lines, epochs="whole"), spark).rows_written
        == 300
    )
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers, "properties": stack.properties()},
        "postgres": {"dsn": stack.dsn},
        "consumer": {"group_id": names["group"], "state_schema": names["schema"],
                     "batch_max_wait_ms": 50,
                     "routes": [{"topic": names["topic"], "table": table}]},
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    env["PYTHONPATH"] = str(consumer_0_2_0)  # before the installed (editable) tree
    which = "import bridge, consumers; print(bridge.__version__, consumers.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", which],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert found.stdout.split() == ["0.1.0", str(consumer_0_2_0 / "consumers" / "__init__.py")], (
        found.stdout + found.stderr
    )  # 0.2.0 still said 0.1.0: it had no version of its own yet
    log = tmp_path / "consumer-0.2.0.log"
    with log.open("wb") as out:
        service = subprocess.Popen(
            [sys.executable, "-m", "consumers", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )  # fmt: skip
    try:
        try:
            drained(stack, names, PARTITIONS, timeout=120)
        except AssertionError:
            raise AssertionError(log.read_text()[-4000:]) from None
        service.send_signal(signal.SIGTERM)
        assert service.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [(300, 300)]
