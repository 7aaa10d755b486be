"""Dirty Kafka faults under a running consumer: a topic deleted and recreated under the same
name, a broker that never comes back. Neither may pass silently: the first is a partition
reported out of range until an operator resets it, the second a clear error and a non-zero
exit after a configured bound."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient

from bridge.kafka_admin import TopicError, create_topic
from bridge.names import METRIC_PARTITIONS
from tests.consumer_helpers import (
    drained,
    eventually,
    produce,
    running,
    sample,
    settings_for,
    sql,
)
from tests.harness import Endpoints
from tests.integration.test_operator_tools import bridge, count
from tests.toxiproxy import Proxy

pytestmark = pytest.mark.slow


def recreate_topic(stack: Endpoints, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(60)
    deadline = time.monotonic() + 60
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "the topic was not deleted"
        time.sleep(0.2)
    while True:
        try:
            create_topic(stack.bootstrap_servers, topic)
            return
        except TopicError:  # the deletion may still be in progress on the broker
            assert time.monotonic() < deadline, "the topic could not be created again"
            time.sleep(0.5)


def test_a_topic_recreated_under_the_consumer_is_reported_and_waits_for_a_reset(
    stack: Endpoints, names: dict[str, str]
) -> None:
    topic = names["topic"]
    create_topic(stack.bootstrap_servers, topic)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int)")
    produce(stack, topic, [(None, {"id": i}) for i in range(100)])
    with running(settings_for(stack, names)) as service:
        eventually(lambda: count(stack, names) == 100)
        recreate_topic(stack, topic)
        # The new log is shorter than the stored position: 10 records, offsets 0-10.
        produce(stack, topic, [(None, {"id": i}) for i in range(1000, 1010)])
        eventually(lambda: "out_of_range" in " ".join(service.not_ready()), timeout=60)
        assert "beyond the log end" in " ".join(service.not_ready()), service.not_ready()
        eventually(lambda: sample(service, METRIC_PARTITIONS, state="out_of_range") == 1)
        # Nothing must happen: the member's loop turns thrice after the new records are in.
        turned = service.turns
        eventually(lambda: service.turns >= turned + 3)
        assert count(stack, names) == 100, "no silent jump onto the new log"

        reset = bridge(stack, "offsets", "reset", "--group", names["group"], "--schema",
                       names["schema"], "--topic", topic, "--to", "earliest",
                       "--execute", "--force")  # fmt: skip
        assert reset.returncode == 0, reset.stderr
        eventually(lambda: count(stack, names) == 110 and service.ready)
    assert sql(stack, f"SELECT count(DISTINCT id) FROM public.{names['table']}") == [(110,)]


def test_a_broker_that_never_comes_back_ends_the_consumer_with_a_clear_error(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    kafka = stack.kafka
    if kafka is None:
        pytest.skip("needs the local stack's Kafka process to kill it")
    create_topic(stack.bootstrap_servers, names["topic"])
    sql(stack, f"CREATE TABLE public.{names['table']} (id int)")
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(10)])
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": stack.bootstrap_servers},
        "postgres": {"dsn": stack.dsn},
        "consumer": {"group_id": names["group"], "state_schema": names["schema"],
                     "kafka_unavailable_timeout_ms": 15_000,
                     "routes": [{"topic": names["topic"], "table": f"public.{names['table']}"}]},
    }))  # fmt: skip
    log = tmp_path / "consumer.log"
    with log.open("wb") as out:
        consumer = subprocess.Popen(
            [sys.executable, "-m", "consumers", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        eventually(lambda: count(stack, names) == 10)
        kafka.kill()
        killed = time.monotonic()
        code = consumer.wait(90)
        waited = time.monotonic() - killed
    finally:
        consumer.kill()
        kafka.start()
    output = log.read_text()
    print(f"exited {code} {waited:.1f}s after the broker died")
    assert code != 0, output[-3000:]
    assert "Kafka unreachable" in output, output[-3000:]
    assert 15 <= waited <= 60


def test_a_silent_kafka_link_is_ridden_out_and_nothing_is_lost_or_doubled(
    stack: Endpoints, names: dict[str, str], proxied_kafka: Proxy
) -> None:
    """60 s without a byte from the broker, and no reset: requests time out, the member drops
    out of its group; when the link heals it rejoins, claims its partitions again at their
    stored offsets, and goes on."""
    through = replace(stack, bootstrap_servers=proxied_kafka.listen)
    create_topic(through.bootstrap_servers, names["topic"], partitions=3)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int NOT NULL)")
    produce(through, names["topic"], [(None, {"id": i}) for i in range(2_000)])
    with running(settings_for(through, names)) as service:
        eventually(lambda: count(stack, names) == 2_000)
        proxied_kafka.silence()
        time.sleep(60)
        proxied_kafka.heal()
        healed = time.monotonic()
        produce(through, names["topic"], [(None, {"id": i}) for i in range(2_000, 3_000)])
        eventually(lambda: count(stack, names) == 3_000, timeout=120)
        resumed = time.monotonic() - healed
        drained(through, names, partitions=3)  # a duplicate applied late would show now
        eventually(lambda: service.ready, timeout=30)
    print(f"resumed {resumed:.1f}s after the link healed")
    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM public.{names['table']}") == [
        (3_000, 3_000)
    ]
