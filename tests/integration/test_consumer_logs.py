"""The consumer process writes JSON lines only: librdkafka's own complaints included, so that a
log shipper parsing its stderr loses none of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bridge_shell.stack.process import free_port
from tests.consumer_helpers import sql
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    log = tmp_path / "consumer.log"
    with (
        log.open("wb") as out,
        subprocess.Popen(
            [sys.executable, "-m", "consumers", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        ) as service,
    ):
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

    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "the consumer wrote nothing"
    records = []
    for line in lines:
        assert line.startswith("{"), f"not a JSON line: {line!r}"
        records.append(json.loads(line))
    refused = [r for r in records if r["logger"] == "bridge.rdkafka"]
    assert refused, output[-3000:]
    assert any(unreachable in r["message"] for r in refused), refused
