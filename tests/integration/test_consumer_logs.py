"""The consumer process writes JSON lines only: librdkafka's own complaints included, so that a
log shipper parsing its stderr loses none of them."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from bridge_shell.stack.process import free_port
from tests.consumer_helpers import consumer_process, json_lines, sql
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
