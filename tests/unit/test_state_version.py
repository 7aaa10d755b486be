"""The state tables' version a start takes as current without loading the migrations."""

from consumers.database.state import STATE_HEAD, known_state_version


def test_the_version_taken_as_current_is_the_newest_migrations() -> None:
    assert known_state_version() == STATE_HEAD
