"""Faults of a replicated Kafka cluster (three KRaft nodes, three replicas, two in sync, as
`bridge stack up --brokers 3` runs it) under both sides of the pipeline: the node that is the
transaction coordinator of a write task SIGKILLed mid-epoch, the leader of a partition it writes
SIGKILLed mid-epoch, and a leader SIGKILLed under the consumer mid-stream. The killed node stays
down until the job is done. Totals are exact, read by an independent read_committed reader and
counted in PostgreSQL."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bridge.kafka_admin import create_topic
from bridge.names import MARKER_GROUP_INFIX
from bridge_shell.stack.kafka import KafkaServer, new_cluster_id, stop_kafka_nodes
from bridge_shell.stack.local import LocalStack, StackState
from bridge_shell.stack.process import free_port
from spark_jobs.sink_options import IdNaming
from spark_jobs.txn_admin import transactional_ids
from tests.consumer_helpers import drained, eventually, produce, running, settings_for, sql
from tests.harness import Endpoints
from tests.integration.test_consumer_operations import stream_through_fault
from tests.integration.test_producer_faults import SPLITS, Producer, assert_exactly, kill_group
from tests.integration.test_sink import write_orders
from tests.kafka_helpers import (
    OFFSETS_TOPIC_PARTITIONS,
    TRANSACTION_LOG_PARTITIONS,
    coordinator_partition,
)

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.xdist_group("kafka-cluster")]


@pytest.fixture(scope="module")
def nodes() -> Iterator[list[KafkaServer]]:
    home = Path(tempfile.mkdtemp(prefix="bridge-test-kafka-cluster-"))
    state = StackState(
        kafka_port=free_port(), controller_port=free_port(), postgres_port=0,
        cluster_id=new_cluster_id(), extra_nodes=[[free_port(), free_port()] for _ in range(2)],
    )  # fmt: skip
    servers = LocalStack(home).kafka_nodes(state)
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready(timeout=180)
        yield servers
    finally:
        stop_kafka_nodes(servers)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def cluster(nodes: list[KafkaServer], stack: Endpoints) -> Iterator[Endpoints]:
    """The cluster with every node up, and the session's PostgreSQL; a node a test killed
    comes back afterwards."""
    yield Endpoints(
        bootstrap_servers=",".join(node.bootstrap_servers for node in nodes),
        dsn=stack.dsn,
        origin="kafka cluster",
    )
    for node in nodes:
        node.start()
    for node in nodes:
        node.wait_ready(timeout=180)


def leader_of(cluster: Endpoints, topic: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    leader: int = admin.list_topics(topic, timeout=30).topics[topic].partitions[partition].leader
    return leader


def coordinator_of(cluster: Endpoints, key: str, *, group: bool = False) -> int:
    """The node leading the internal partition that holds `key`: a transactional id's in the
    transaction log, or a group's in __consumer_offsets (Kafka places both by
    abs(hashCode) % partitions)."""
    topic, partitions = (
        ("__consumer_offsets", OFFSETS_TOPIC_PARTITIONS)
        if group
        else ("__transaction_state", TRANSACTION_LOG_PARTITIONS)
    )
    return leader_of(cluster, topic, coordinator_partition(key, partitions))


def kill_mid_epoch(
    cluster: Endpoints, nodes: list[KafkaServer], tmp_path: Path, topic: str, victim: str
) -> None:
    """Partition 0 of epoch 1 pauses mid-transaction; `victim` (its coordinator or the leader
    of the topic's partition 0) is SIGKILLed meanwhile; the job must finish exactly once."""
    prefix = f"cluster-faults-{topic}"  # the cluster's markers outlive a test: one per test
    create_topic(cluster.bootstrap_servers, topic, partitions=3)
    expected = write_orders(tmp_path / "in", files=4, rows_per_file=2000)
    producer = Producer(cluster, tmp_path, topic, "--max-files-per-trigger", "2",
                        "--transactional-id-prefix", prefix, *SPLITS)  # fmt: skip
    rule = {"point": "mid-produce", "partition": 0, "epoch": 1, "after_rows": 200,
            "action": "pause", "seconds": 15}  # fmt: skip
    job = producer.start([rule])
    try:
        producer.wait_fired(job)
        if victim == "coordinator":
            # The id of partition 0's task of epoch 1, as the sink's default naming has it.
            [task_id] = transactional_ids(prefix, [0], 1, IdNaming.POOLED)
            node_id = coordinator_of(cluster, task_id)
        elif victim == "group coordinator":
            node_id = coordinator_of(cluster, f"{prefix}{MARKER_GROUP_INFIX}0", group=True)
        else:
            node_id = leader_of(cluster, topic, 0)
        nodes[node_id - 1].kill()
        # A call librdkafka leaves blocked past its timeout ends its worker after 60 + 30 s.
        assert job.wait(300) == 0, producer.log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            kill_group(job)
    assert_exactly(cluster, topic, 3, expected)


def test_the_transaction_coordinator_killed_mid_epoch(
    cluster: Endpoints, nodes: list[KafkaServer], tmp_path: Path, topic_name: str
) -> None:
    kill_mid_epoch(cluster, nodes, tmp_path, topic_name, "coordinator")


def test_the_marker_group_coordinator_killed_mid_epoch(
    cluster: Endpoints, nodes: list[KafkaServer], tmp_path: Path, topic_name: str
) -> None:
    """The task adds its marker to the transaction through the group's coordinator; librdkafka
    may then block past its timeout (issues #5456, #5511), which the sink bounds."""
    kill_mid_epoch(cluster, nodes, tmp_path, topic_name, "group coordinator")


def test_a_partition_leader_killed_mid_epoch(
    cluster: Endpoints, nodes: list[KafkaServer], tmp_path: Path, topic_name: str
) -> None:
    kill_mid_epoch(cluster, nodes, tmp_path, topic_name, "leader")


def test_a_leader_killed_under_the_consumer_mid_stream(
    cluster: Endpoints, nodes: list[KafkaServer], names: dict[str, str]
) -> None:
    def kill_a_leader() -> None:
        nodes[leader_of(cluster, names["topic"], 0) - 1].kill()

    rows, distinct, applied = stream_through_fault(cluster, names, kill_a_leader, total=20_000)
    assert (rows, distinct, applied) == (20_000, 20_000, 20_000)


def test_a_log_range_that_cannot_be_read_at_assignment_is_retried_and_reported_not_fatal(
    cluster: Endpoints, nodes: list[KafkaServer], names: dict[str, str]
) -> None:
    """The only replica of the topic's partition sits on a paused node (SIGSTOP): the group
    still assigns the partition (its coordinator is elsewhere), but the log range query the
    claim needs cannot be answered. The member stays up, `/readyz` says which partition waits
    and why, and once the node wakes up the partition is claimed and every record lands once."""
    coordinator = _group_coordinator(cluster, names["group"])
    victim = next(n for n in (1, 2, 3) if n != coordinator)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    created = admin.create_topics(
        [NewTopic(names["topic"], num_partitions=1, replica_assignment=[[victim]])]
    )
    created[names["topic"]].result(30)
    sql(cluster, f"CREATE TABLE public.{names['table']} (id int NOT NULL)")
    produce(cluster, names["topic"], [(None, {"id": i}) for i in range(500)])
    paused = nodes[victim - 1].pid
    assert paused is not None
    os.kill(paused, signal.SIGSTOP)
    try:
        with running(settings_for(cluster, names)) as service:
            waiting = f"{names['topic']}[0] assigned but not claimed"
            eventually(lambda: any(waiting in r for r in service.not_ready()), timeout=90)
            assert any("log range" in r for r in service.not_ready()), service.not_ready()
            os.kill(paused, signal.SIGCONT)
            drained(cluster, names, partitions=1, timeout=180)
            eventually(lambda: not any(waiting in r for r in service.not_ready()))
    finally:
        os.kill(paused, signal.SIGCONT)
    rows, distinct = sql(cluster, f"SELECT count(*), count(DISTINCT id) FROM {names['table']}")[0]
    assert (rows, distinct) == (500, 500)


def _group_coordinator(cluster: Endpoints, group: str) -> int:
    """The node coordinating `group`, once a lookup of its offsets made Kafka create the
    offsets topic (a fresh cluster has none)."""
    probe = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group})

    def looked_up() -> bool:
        try:
            probe.committed([TopicPartition("any", 0)], timeout=10)
        except KafkaException:
            return False  # the offsets topic is still being made
        return True

    try:
        eventually(looked_up, timeout=120)
    finally:
        probe.close()
    return coordinator_of(cluster, group, group=True)
