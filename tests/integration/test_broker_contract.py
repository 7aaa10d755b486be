"""The four broker behaviours the producer design rests on, checked against the real broker.

If one of these fails, the exactly-once sink is wrong, not just this test.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bridge.kafka_admin import create_topic
from tests.harness import Endpoints
from tests.kafka_helpers import read_all, transactional_producer


@pytest.fixture
def topic(stack: Endpoints, topic_name: str) -> str:
    create_topic(stack.bootstrap_servers, topic_name)
    return topic_name


def test_committed_transaction_is_visible_to_read_committed(stack: Endpoints, topic: str) -> None:
    producer = transactional_producer(stack.bootstrap_servers)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"c{i}".encode())
    producer.commit_transaction(30)

    assert read_all(stack.bootstrap_servers, topic) == [f"c{i}".encode() for i in range(10)]


def test_aborted_transaction_is_invisible_to_read_committed(stack: Endpoints, topic: str) -> None:
    producer = transactional_producer(stack.bootstrap_servers)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed")
    producer.commit_transaction(30)

    assert read_all(stack.bootstrap_servers, topic) == [b"committed"]
    # The aborted record did reach the log: only the isolation level hides it.
    uncommitted = read_all(stack.bootstrap_servers, topic, isolation="read_uncommitted")
    assert uncommitted == [b"aborted", b"committed"]


def test_new_holder_of_a_transactional_id_fences_the_old_one(stack: Endpoints, topic: str) -> None:
    transactional_id = f"fence-{uuid.uuid4().hex}"
    zombie = transactional_producer(stack.bootstrap_servers, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie")
    zombie.flush(30)

    # init_transactions of the new holder aborts the zombie's open transaction.
    successor = transactional_producer(stack.bootstrap_servers, transactional_id)

    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(30)
    error: KafkaError = raised.value.args[0]
    assert error.fatal() or error.code() == KafkaError._FENCED, error

    successor.begin_transaction()
    successor.produce(topic, value=b"successor")
    successor.commit_transaction(30)
    assert read_all(stack.bootstrap_servers, topic) == [b"successor"]


def test_transaction_commits_offsets_of_a_memberless_marker_group(
    stack: Endpoints, topic: str
) -> None:
    marker_group = f"marker-{uuid.uuid4().hex}"
    # A consumer that never subscribes: its group has no members, only its metadata is used.
    group_metadata = Consumer(
        {"bootstrap.servers": stack.bootstrap_servers, "group.id": marker_group}
    ).consumer_group_metadata()
    reader = Consumer(
        {
            "bootstrap.servers": stack.bootstrap_servers,
            "group.id": marker_group,
            "isolation.level": "read_committed",
        }
    )
    wanted = [TopicPartition(topic, 0)]

    producer = transactional_producer(stack.bootstrap_servers)
    producer.begin_transaction()
    producer.produce(topic, value=b"data")
    producer.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 42, metadata="epoch=7")], group_metadata, 30
    )

    # While the transaction is open the offset is unstable: a stable fetch cannot return it.
    try:
        before = reader.committed(wanted, timeout=3)
        assert before[0].offset != 42
    except KafkaException as exc:
        assert exc.args[0].code() == KafkaError._TIMED_OUT

    producer.commit_transaction(30)
    after = reader.committed(wanted, timeout=30)
    assert (after[0].offset, after[0].metadata) == (42, "epoch=7")
    reader.close()
