"""The consumer process writes JSON lines only: librdkafka's own complaints included, so that a
log shipper parsing its stderr loses none of them."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from bridge.kafka_admin import create_topic
from bridge_shell.stack.process import free_port
from tests.consumer_helpers import (
    consumer_process,
    eventually,
    json_lines,
    plain_config,
    produce,
    sql,
)
from tests.harness import Endpoints


def test_librdkafka_lines_arrive_as_json_records(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    sql(stack, f"CREATE TABLE public.{names['table']} (id bigint, body text)")
    unreachable = f"127.0.0.1:{free_port()}"  # nothing listens: librdkafka logs each refusal
    config = tmp_path / "consumer.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": unreachable},
                "postgres": {"dsn": stack.dsn},
                "consumer": {
                    "group_id": names["group"],
                    "routes": [{"topic": names["topic"], "table": f"public.{names['table']}"}],
                },
            }
        )
    )
    log = tmp_path / "consumer.log"
    with consumer_process(config, log) as service:
        try:
            # Until librdkafka has said something, through the service's own log.
            deadline = time.monotonic() + 60
            while '"logger": "bridge.rdkafka"' not in log.read_text():
                assert service.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        finally:
            service.terminate()
            service.wait(timeout=60)
    output = log.read_text()

    records = json_lines(output)
    assert records, "the consumer wrote nothing"
    refused = [r for r in records if r["logger"] == "bridge.rdkafka"]
    assert refused, output[-3000:]
    assert any(unreachable in r["message"] for r in refused), refused
    # A quiet start: the state tables' migrations and the HTTP clients say nothing routine.
    chatty = [r for r in records if r["logger"].split(".")[0] in ("alembic", "httpx")]
    assert not chatty, chatty


def test_a_dead_letter_is_logged_with_its_coordinates_and_reason(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    sql(stack, f"CREATE TABLE public.{names['table']} (id bigint)")
    produce(stack, names["topic"], [(None, {"id": 1}), (None, b"not json"), (None, {"id": 3})])
    config = tmp_path / "consumer.yaml"
    config.write_text(yaml.safe_dump(plain_config(stack, names)))
    log = tmp_path / "consumer.log"
    with consumer_process(config, log) as service:
        try:
            eventually(lambda: "dead letter:" in log.read_text() or service.poll() is not None)
        finally:
            service.terminate()
            service.wait(timeout=60)
    (line,) = [r for r in json_lines(log.read_text()) if r["message"].startswith("dead letter:")]
    assert line["level"] == "warning"
    assert (line["topic"], line["partition"], line["offset"]) == (names["topic"], 0, 1)
    assert "JSON" in line["error"], line
