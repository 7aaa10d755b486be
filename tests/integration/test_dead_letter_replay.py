"""Dead letters replayed exactly once after a fix (`bridge dead-letters show|replay`), for a
JSON and an Avro route: the replay SIGKILLed while it waits inside the transaction of one dead
letter, run again, and every record counted once; a record that still does not fit stays, with
its new error and one more attempt."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import drained, eventually, produce, running, settings_for, sql
from tests.harness import Endpoints
from tests.integration.test_operator_tools import bridge

RECORDS = 30  # ids 0..29; every third one the table refuses until it is fixed
BAD = [i for i in range(RECORDS) if i % 3 == 0]
HELD = 4  # the replay is held (and killed) at the 5th dead letter


def _avro_values(
    stack: Endpoints, registry_url: str, topic: str
) -> Callable[[dict[str, Any]], bytes]:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from spark_jobs.registry_frames import register
    from tests.integration.test_table_evolution import _framed

    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "note", "type": "string"}]}  # fmt: skip
    with SchemaRegistryClient({"url": registry_url, **stack.registry_properties}) as client:
        schema_id = register(client, f"{topic}-value", schema)
    return lambda value: _framed(schema_id, schema, value)


def _config(tmp_path: Path, names: dict[str, str], route: dict[str, Any],
            registry_url: str | None) -> Path:  # fmt: skip
    consumer = {"group_id": names["group"], "state_schema": names["schema"], "routes": [route]}
    settings: dict[str, Any] = {"consumer": consumer}
    if registry_url is not None:
        settings["schema_registry"] = {"url": registry_url}
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def _dead(stack: Endpoints, names: dict[str, str]) -> list[tuple[Any, ...]]:
    return sql(stack, f'SELECT "offset", attempts, error FROM {names["schema"]}.dead_letters '
                      'ORDER BY "offset"')  # fmt: skip


@pytest.mark.parametrize("value_format", ["json", "avro"])
def test_dead_letters_are_replayed_once_after_a_fix_through_a_kill_in_the_middle(
    stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path, value_format: str
) -> None:
    topic, table = names["topic"], f"public.{names['table']}"
    create_topic(stack.bootstrap_servers, topic, partitions=1, config=stack.properties())
    # JSON: a CHECK the bad amounts break; Avro: a note too long for its column.
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, amount int "
               f"CONSTRAINT amount_positive CHECK (amount >= 0), note varchar(3))")  # fmt: skip
    stack.let_consumer_write(table, schema=names["schema"])
    route: dict[str, Any] = {"topic": topic, "table": table, "mode": "insert"}
    if value_format == "json":
        values: list[dict[str, Any]] = [
            {"id": i, "amount": -1 if i in BAD else i} for i in range(RECORDS)
        ]
        values += [{"id": RECORDS, "amount": "many"}]  # never fits an int column
        records: list[tuple[None, Any]] = [(None, v) for v in values]
        fix = f"ALTER TABLE {table} DROP CONSTRAINT amount_positive"
    else:
        frame = _avro_values(stack, registry_url, topic)
        notes = ["too long" if i in BAD else "ok" for i in range(RECORDS)]
        records = [(None, frame({"id": i, "note": n})) for i, n in enumerate(notes)]
        records += [(None, b"\x00not avro")]  # never a row
        route |= {"value_format": "avro"}
        fix = f"ALTER TABLE {table} ALTER COLUMN note TYPE text"
    config = _config(tmp_path, names, route, registry_url if value_format == "avro" else None)
    produce(stack, topic, records)
    with running(settings_for(stack, names, registry_url=registry_url, **{
        k: v for k, v in route.items() if k not in ("topic", "table")
    })):  # fmt: skip
        drained(stack, names, 1)
    assert [offset for offset, _, _ in _dead(stack, names)] == [*BAD, RECORDS]

    shown = bridge(stack, "dead-letters", "show", "--config", str(config), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert [d["offset"] for d in json.loads(shown.stdout)] == [*BAD, RECORDS]
    refused = "check constraint" if value_format == "json" else "too long"
    chosen = bridge(stack, "dead-letters", "show", "--config", str(config), "--format", "json",
                    "--error", refused.upper())  # fmt: skip
    assert [d["offset"] for d in json.loads(chosen.stdout)] == BAD

    sql(stack, fix)
    # A configuration whose routes do not read the topic: refused, nothing replayed.
    elsewhere = {**route, "topic": f"{topic}-elsewhere"}
    unrouted = _config(tmp_path / "other", names, elsewhere, None)
    no_route = bridge(stack, "dead-letters", "replay", "--config", str(unrouted), "--execute")
    assert no_route.returncode == 2, no_route.stdout + no_route.stderr
    assert f"no route of the configuration reads topic(s) {topic}" in " ".join(
        no_route.stderr.split()
    )
    dry = bridge(stack, "dead-letters", "replay", "--config", str(config))
    assert dry.returncode == 0, dry.stderr
    assert f"dry run: {len(BAD) + 1} dead letter(s) would be replayed" in dry.stdout
    assert len(_dead(stack, names)) == len(BAD) + 1

    # Hold the 5th dead letter's row: the replay lands 4, then waits inside the 5th's
    # transaction, where it is killed.
    with psycopg.connect(stack.dsn) as holder:
        holder.execute(f'SELECT 1 FROM {names["schema"]}.dead_letters WHERE "offset" = {BAD[HELD]} '
                       "FOR UPDATE")  # fmt: skip
        replay = _start_replay(stack, config)
        try:
            eventually(lambda: len(_dead(stack, names)) == len(BAD) + 1 - HELD, timeout=60)
            eventually(lambda: _waits_on_a_lock(stack), timeout=30)
        finally:
            replay.send_signal(signal.SIGKILL)
            replay.communicate(timeout=30)  # and its pipes closed
        holder.rollback()

    again = bridge(stack, "dead-letters", "replay", "--config", str(config), "--execute")
    assert again.returncode == 1, again.stdout + again.stderr  # the last one still does not fit
    assert f"{len(BAD) - HELD} landed" in again.stdout and "1 still do not fit" in again.stdout
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [(RECORDS, RECORDS)]
    [(offset, attempts, error)] = _dead(stack, names)
    assert (offset, attempts) == (RECORDS, 2), error
    audit = sql(stack, f"SELECT outcome, count(*) FROM {names['schema']}.dead_letter_replays "
                       "GROUP BY outcome ORDER BY outcome")  # fmt: skip
    assert audit == [("dead again", 1), ("landed", len(BAD))]


def _start_replay(stack: Endpoints, config: Path) -> subprocess.Popen[str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    env |= {"BRIDGE_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap_servers,
            "BRIDGE_POSTGRES__DSN": stack.dsn, "BRIDGE_STACK_DIR": "/nonexistent"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "bridge_shell.cli", "dead-letters", "replay", "--config",
         str(config), "--execute"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _waits_on_a_lock(stack: Endpoints) -> bool:
    """The replay's session waits for the held row (its transaction open, nothing committed)."""
    waiting = sql(stack, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                         "AND query LIKE '%FOR UPDATE%'")  # fmt: skip
    return bool(waiting[0][0])
