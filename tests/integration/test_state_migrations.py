"""bridge's own tables carry a version: a new release takes over the tables an older one made,
migrating them in place, and an older release refuses tables a newer one migrated."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from bridge.errors import StateSchemaTooNew
from bridge.kafka_admin import create_topic
from bridge.names import STATE_VERSION_TABLE
from consumers.database.state import (
    ensure_state,
    known_state_version,
    sqlalchemy_engine,
    state_version,
)
from tests.consumer_helpers import (
    drained,
    eventually,
    plain_config,
    produce,
    running,
    settings_for,
    sql,
)
from tests.harness import Endpoints

# In `make check`'s quick loop too.
pytestmark = pytest.mark.quick

_ROOT = Path(__file__).resolve().parents[2]
# The last release whose state tables had no version: what every deployed consumer has made.
_UNVERSIONED_RELEASE = "bdcb7c2"


def test_the_migrations_make_the_tables_the_code_describes(
    stack: Endpoints, names: dict[str, str]
) -> None:
    tables = ensure_state(stack.dsn, names["schema"])
    engine = sqlalchemy_engine(stack.dsn)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "include_schemas": True,
                    "include_name": lambda name, kind, _: (
                        kind != "schema" or name == names["schema"]
                    ),
                },
            )
            differences = compare_metadata(context, tables.offsets.metadata)
            assert state_version(conn, names["schema"]) == known_state_version()
    finally:
        engine.dispose()
    # The version table is the migrations' own, not the code's.
    left = [
        d for d in differences if not (d[0] == "remove_table" and d[1].name == STATE_VERSION_TABLE)
    ]
    assert left == []
    function = sql(
        stack,
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        f"WHERE n.nspname = '{names['schema']}' AND p.proname = 'advance_offsets'",
    )
    assert function == [(1,)]


def test_migrating_twice_and_from_two_members_at_once_changes_nothing(
    stack: Endpoints, names: dict[str, str]
) -> None:
    import threading

    errors: list[BaseException] = []

    def start() -> None:
        try:
            ensure_state(stack.dsn, names["schema"])
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    members = [threading.Thread(target=start) for _ in range(3)]
    for member in members:
        member.start()
    for member in members:
        member.join(60)
    assert errors == []
    ensure_state(stack.dsn, names["schema"])
    versions = sql(stack, f"SELECT version_num FROM {names['schema']}.{STATE_VERSION_TABLE}")
    assert versions == [(known_state_version(),)]


def test_a_newer_schema_is_refused_naming_both_versions(
    stack: Endpoints, names: dict[str, str]
) -> None:
    ensure_state(stack.dsn, names["schema"])
    sql(stack, f"UPDATE {names['schema']}.{STATE_VERSION_TABLE} SET version_num = '9001'")

    with pytest.raises(StateSchemaTooNew) as refused:
        ensure_state(stack.dsn, names["schema"])
    message = str(refused.value)
    assert "9001" in message and f"up to version {known_state_version()}" in message
    # Refused before anything was changed.
    versions = sql(stack, f"SELECT version_num FROM {names['schema']}.{STATE_VERSION_TABLE}")
    assert versions == [("9001",)]


def test_the_consumer_process_exits_non_zero_on_a_newer_schema(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    ensure_state(stack.dsn, names["schema"])
    sql(stack, f"UPDATE {names['schema']}.{STATE_VERSION_TABLE} SET version_num = '9001'")
    create_topic(stack.bootstrap_servers, names["topic"])
    sql(stack, f"CREATE TABLE public.{names['table']} (id int)")
    config = tmp_path / "bridge.yaml"
    config.write_text(json.dumps(plain_config(stack, names)))  # JSON is YAML

    ended = subprocess.run(
        [sys.executable, "-m", "consumers", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ended.returncode != 0
    assert "9001" in ended.stderr and known_state_version() in ended.stderr


def test_the_tables_of_the_release_before_versions_are_taken_over(
    stack: Endpoints, names: dict[str, str], tmp_path: Path
) -> None:
    """The release before versions creates its tables and applies half the records with its own
    consumer; this release's consumer takes the tables over and applies the rest, every record
    once."""
    old = _checkout(_UNVERSIONED_RELEASE, tmp_path / "old")
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    sql(stack, f"CREATE TABLE public.{names['table']} (id int)")  # no key: a double would show
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(100)])

    _run_old_consumer(old, stack, names, rows=100)
    assert sql(
        stack,
        "SELECT count(*) FROM information_schema.tables "
        f"WHERE table_schema = '{names['schema']}' AND table_name = '{STATE_VERSION_TABLE}'",
    ) == [(0,)], "the old release made a version table: it is not the one before versions"
    stored = sql(stack, f"SELECT sum(next_offset) FROM {names['schema']}.offsets")[0][0]
    assert stored >= 100

    produce(stack, names["topic"], [(None, {"id": i}) for i in range(100, 150)])
    with running(settings_for(stack, names)):
        eventually(lambda: sql(stack, f"SELECT count(*) FROM {names['table']}")[0][0] >= 150)
        drained(stack, names, partitions=2)

    assert sql(stack, f"SELECT count(*), count(DISTINCT id) FROM {names['table']}") == [(150, 150)]
    versions = sql(stack, f"SELECT version_num FROM {names['schema']}.{STATE_VERSION_TABLE}")
    assert versions == [(known_state_version(),)]


def _checkout(commit: str, into: Path) -> Path:
    """The packages as they were at `commit`, from this repository's history."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "bridge", "consumers"],
        cwd=_ROOT,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    into.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


_OLD_CONSUMER = """
import json, sys, threading, time
import consumers, psycopg
from bridge.settings import load_settings
from consumers.service import ConsumerService

assert consumers.__file__.startswith(sys.argv[1]), consumers.__file__
arguments, dsn, table, rows = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
service = ConsumerService(load_settings(**arguments))
service.start()
thread = threading.Thread(target=service.run, daemon=True)
thread.start()
deadline = time.monotonic() + 120
with psycopg.connect(dsn, autocommit=True) as conn:
    while conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] < rows:
        assert time.monotonic() < deadline, "the old consumer did not apply the records"
        time.sleep(0.2)
service.stop()
thread.join(60)
assert not thread.is_alive()
"""


def _run_old_consumer(old: Path, stack: Endpoints, names: dict[str, str], *, rows: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(old)}
    ended = subprocess.run(
        [
            sys.executable,
            "-c",
            _OLD_CONSUMER,
            str(old),
            json.dumps(plain_config(stack, names)),
            stack.dsn,
            f"public.{names['table']}",
            str(rows),
        ],
        env=env,
        cwd=old,  # `python -c` puts the working directory first on the path
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert ended.returncode == 0, ended.stderr[-4000:]
