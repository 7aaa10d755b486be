"""What a consumer member says over its life, read as an operator reads it: a JSON line each, its
assignment, its revocation and its stop on SIGTERM said aloud, and no HTTP request lines from
the registry's client, no raw librdkafka lines and no traceback."""

from __future__ import annotations

import signal
from pathlib import Path

import yaml

from bridge.kafka_admin import create_topic
from tests.consumer_helpers import (
    consumer_process,
    drained,
    eventually,
    json_lines,
    plain_config,
    produce,
    sql,
)
from tests.harness import Endpoints
from tests.integration.test_table_evolution import V1, _framed, _ids, _record


def test_a_members_log_says_its_life_and_nothing_else(
    stack: Endpoints, names: dict[str, str], registry_url: str, tmp_path: Path
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    (v1,) = _ids(stack, registry_url, names["topic"], V1)
    produce(stack, names["topic"], [(None, _framed(v1, V1, _record(i))) for i in range(20)])
    route = {"topic": names["topic"], "table": f"public.{names['table']}",
             "value_format": "avro", "auto_create": True}  # fmt: skip
    config = plain_config(stack, names, routes=[route])
    config["schema_registry"] = {"url": registry_url}
    path = tmp_path / "consumer.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "consumer.log"
    with consumer_process(path, log) as member:
        drained(stack, names, 2, timeout=90)
        member.send_signal(signal.SIGTERM)
        assert member.wait(60) == 0, log.read_text()[-3000:]
    output = log.read_text()
    lines = json_lines(output)  # no raw librdkafka line, no traceback: every line is JSON
    messages = [line["message"] for line in lines]
    assert not [line for line in lines if line["logger"].startswith(("httpx", "httpcore"))], [
        line for line in lines if line["logger"].startswith(("httpx", "httpcore"))
    ]
    assert any(m.startswith("assigned ") for m in messages), messages
    assert any(m.startswith("revoked ") for m in messages), messages
    assert any(m.startswith("stopped on SIGTERM") for m in messages), messages


def test_a_manifest_topic_not_made_yet_is_said_once_and_calmly(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    """A group with a whole route started before the sink's first epoch made the manifest
    topic: one INFO line says so, and no warning or error names the topic."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=1)
    sql(stack, f"CREATE TABLE public.{names['table']} (id bigint)")
    manifest = f"{names['topic']}-epochs"  # made by no one in this test
    route = {"topic": names["topic"], "table": f"public.{names['table']}", "epochs": "whole"}
    path = tmp_path / "consumer.yaml"
    path.write_text(yaml.safe_dump(plain_config(stack, names, routes=[route],
                                                epochs_topic=manifest)))  # fmt: skip
    log = tmp_path / "consumer.log"
    said = "the epoch manifest topic " + manifest + " does not exist yet"
    with consumer_process(path, log) as member:
        eventually(lambda: said in (log.read_text() if log.exists() else ""), timeout=60)
        member.send_signal(signal.SIGTERM)
        assert member.wait(60) == 0, log.read_text()[-3000:]
    lines = json_lines(log.read_text())
    assert sum(said in line["message"] for line in lines) == 1
    loud = [line for line in lines if line["level"] in ("warning", "error", "critical")
            and manifest in line["message"]]  # fmt: skip
    assert loud == [], loud
