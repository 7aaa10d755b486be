"""Markers, and the one Kafka + PostgreSQL pair the whole test session shares."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Endpoints, endpoints

_HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: no I/O, fast")
    config.addinivalue_line("markers", "integration: needs real Kafka and PostgreSQL")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The directory decides the marker, so `-m unit` and `-m integration` never miss a test.
    for item in items:
        parts = Path(str(item.path)).relative_to(_HERE).parts
        if parts and parts[0] in ("unit", "integration"):
            item.add_marker(parts[0])


@pytest.fixture(scope="session")
def stack() -> Iterator[Endpoints]:
    """Real Kafka and PostgreSQL for the session; see tests/harness.py for where they come from."""
    with endpoints() as found:
        yield found


@pytest.fixture
def topic_name() -> str:
    """A topic name no other test uses, so tests sharing one broker never see each other."""
    return f"t-{uuid.uuid4().hex[:12]}"
