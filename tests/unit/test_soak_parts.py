"""The soaks' pure parts: the timeline's rates and where Kafka places a transactional id."""

from __future__ import annotations

from bench.soak_checks import rates
from tests.kafka_helpers import coordinator_partition, java_hash


def test_rates_are_records_per_second_between_samples_from_the_origin() -> None:
    timeline = [(100.0, 0), (102.0, 600), (104.0, 600), (105.0, 900)]
    assert rates(timeline, origin=100.0) == [[2.0, 300.0], [4.0, 0.0], [5.0, 300.0]]


def test_rates_skip_two_samples_taken_at_the_same_instant() -> None:
    assert rates([(1.0, 5), (1.0, 9), (3.0, 13)], origin=0.0) == [[3.0, 2.0]]


def test_java_hash_is_javas_string_hash_code() -> None:
    # Values of "".hashCode(), "abc".hashCode() and "polygenelubricants".hashCode() in Java.
    assert java_hash("") == 0
    assert java_hash("abc") == 96354
    assert java_hash("polygenelubricants") == -(1 << 31)


def test_a_hash_of_integer_min_value_lands_in_partition_zero() -> None:
    assert coordinator_partition("polygenelubricants", 4) == 0
    assert coordinator_partition("abc", 4) == 96354 % 4
