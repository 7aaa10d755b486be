"""Dirty database faults under a running consumer: a link that goes silent without a reset, a
database that answers but refuses to write. Each ends with exact totals, a bound on the stall,
and the consumer having said what was wrong while it was."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bridge.kafka_admin import create_topic
from bridge.names import METRIC_DATABASE_RECONNECTS, METRIC_DATABASE_REFUSALS
from consumers.service import ConsumerService
from tests.consumer_helpers import (
    drained,
    eventually,
    http_get,
    in_background,
    produce,
    running,
    sample,
    settings_for,
    sql,
)
from tests.harness import Endpoints
from tests.kafka_helpers import transactional_producer
from tests.toxiproxy import Proxy, Toxiproxy

pytestmark = pytest.mark.slow

SILENCE_S = 90  # as long as a network partition that heals by itself often lasts
SESSION_TIMEOUT_MS = 5_000  # the server ends a stuck statement after this; replies wait 2x


class Stream:
    """Records written in transactions of 100 every 50 ms, until stopped: a steady producer."""

    def __init__(self, stack: Endpoints, topic: str) -> None:
        self.sent = 0
        self._stop = threading.Event()
        self._producer = transactional_producer(stack.bootstrap_servers)
        self._topic = topic
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._producer.begin_transaction()
            for i in range(self.sent, self.sent + 100):
                self._producer.produce(self._topic, json.dumps({"id": i}).encode())
            self._producer.commit_transaction(30)
            self.sent += 100
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        return self.sent


@pytest.fixture
def pg_proxy(stack: Endpoints, toxiproxy: Toxiproxy, names: dict[str, str]) -> Iterator[Proxy]:
    params = conninfo_to_dict(stack.dsn)
    if str(params.get("host", "")).startswith("/"):
        pytest.skip("PostgreSQL on a Unix socket: a TCP proxy cannot stand in front of it")
    proxy = toxiproxy.proxy(f"pg-{names['group']}", f"{params['host']}:{params['port']}")
    yield proxy
    proxy.delete()


def through(proxy: Proxy, stack: Endpoints) -> Endpoints:
    params = conninfo_to_dict(stack.dsn)
    params.update(host="127.0.0.1", port=str(proxy.port))
    return replace(stack, dsn=" ".join(f"{k}={v}" for k, v in params.items()))


def rows(stack: Endpoints, table: str) -> tuple[int, int]:
    count, distinct = sql(stack, f"SELECT count(*), count(DISTINCT id) FROM public.{table}")[0]
    return count, distinct


def grows_from(stack: Endpoints, table: str, count: int) -> None:
    eventually(lambda: rows(stack, table)[0] > count, timeout=60)


def finish(
    stack: Endpoints, service: ConsumerService, stream: Stream, names: dict[str, str]
) -> None:
    """Once the stream stops: every record it sent applied, and the stored offsets at the end
    of the log, after which no late duplicate can land."""
    sent = stream.stop()
    table = names["table"]
    eventually(lambda: rows(stack, table)[0] >= sent, timeout=120)
    drained(stack, names, partitions=3)
    assert rows(stack, table) == (sent, sent)
    assert service.ready, service.not_ready()


def test_a_silent_postgres_link_is_noticed_and_the_stream_resumes_when_it_heals(
    stack: Endpoints,
    names: dict[str, str],
    pg_proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    table = names["table"]
    sql(stack, f"CREATE TABLE public.{table} (id int NOT NULL)")
    settings = settings_for(
        through(pg_proxy, stack), names, consumer={"db_session_timeout_ms": SESSION_TIMEOUT_MS}
    )
    stream = Stream(stack, names["topic"])
    with running(settings) as service:
        eventually(lambda: rows(stack, table)[0] > 500)
        caplog.clear()
        pg_proxy.silence()
        silenced = time.monotonic()
        # Noticed within the reply bound (2x the session timeout) and a poll, and said aloud.
        eventually(lambda: any(r.levelno >= logging.ERROR for r in caplog.records), timeout=30)
        noticed = time.monotonic() - silenced
        eventually(lambda: "database unreachable" in " ".join(service.not_ready()), timeout=15)
        time.sleep(max(0.0, SILENCE_S - (time.monotonic() - silenced)))
        before = rows(stack, table)[0]
        pg_proxy.heal()
        healed = time.monotonic()
        eventually(lambda: rows(stack, table)[0] > before, timeout=60)
        resumed = time.monotonic() - healed
        print(f"noticed after {noticed:.1f}s; resumed {resumed:.1f}s after the link healed")
        assert noticed < 2 * SESSION_TIMEOUT_MS / 1000 + 5
        finish(stack, service, stream, names)
    assert sample(service, f"{METRIC_DATABASE_RECONNECTS}_total") >= 1


def test_a_database_lost_under_held_records_clears_readyz_on_an_idle_topic(
    stack: Endpoints, names: dict[str, str], pg_proxy: Proxy
) -> None:
    """The documented recovery for the database is none: the member holds the records, says
    why, and writes them once the database answers again. Nothing is produced after the fault
    ends, so the reason must clear with the held records alone, as a pod's readiness must on a
    quiet topic."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    table = names["table"]
    sql(stack, f"CREATE TABLE public.{table} (id int NOT NULL)")
    settings = settings_for(
        through(pg_proxy, stack), names, consumer={"db_session_timeout_ms": SESSION_TIMEOUT_MS}
    )
    with running(settings) as service:
        produce(stack, names["topic"], [(None, {"id": i}) for i in range(50)])
        eventually(lambda: rows(stack, table) == (50, 50))
        eventually(lambda: service.ready)
        pg_proxy.silence()
        produce(stack, names["topic"], [(None, {"id": i}) for i in range(50, 80)])  # the last
        eventually(lambda: "database unreachable" in " ".join(service.not_ready()), timeout=30)
        assert rows(stack, table) == (50, 50)
        pg_proxy.heal()
        eventually(lambda: rows(stack, table) == (80, 80), timeout=60)
        eventually(lambda: service.ready and not service.not_ready(), timeout=30)
        drained(stack, names, 3)


@pytest.fixture
def read_only_database(stack: Endpoints) -> Iterator[Callable[[bool], None]]:
    """Switches `default_transaction_read_only` on and off for the whole server, as a replica
    after a failover has it; always off again at the end."""
    with psycopg.connect(stack.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (row and row[0]):
            pytest.skip("needs a superuser to change the server's configuration")

    def switch(on: bool) -> None:
        with psycopg.connect(stack.dsn, autocommit=True) as conn:
            conn.execute(
                f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}"
            )
            conn.execute("SELECT pg_reload_conf()")

    yield switch
    switch(False)


@pytest.fixture
def consumer_role(stack: Endpoints, names: dict[str, str]) -> Iterator[str]:
    """A login role that is not a superuser (a connection limit binds only such a role), owning
    this test's table and allowed to create its state schema; dropped at the end."""
    role = f"r_{names['table']}"
    database = str(conninfo_to_dict(stack.dsn).get("dbname"))
    sql(stack, f"CREATE ROLE {role} LOGIN")
    sql(stack, f'GRANT CREATE ON DATABASE "{database}" TO {role}')
    yield role
    sql(stack, f"DROP OWNED BY {role} CASCADE")
    sql(stack, f"DROP ROLE {role}")


def test_a_database_refusing_writes_under_held_records_clears_readyz_on_an_idle_topic(
    stack: Endpoints, names: dict[str, str], read_only_database: Callable[[bool], None]
) -> None:
    """As a failover's old primary turned replica refuses writes (25006), then takes them
    again: the reason clears once the held records land, with nothing produced after."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    table = names["table"]
    sql(stack, f"CREATE TABLE public.{table} (id int NOT NULL)")
    with running(settings_for(stack, names)) as service:
        produce(stack, names["topic"], [(None, {"id": i}) for i in range(50)])
        eventually(lambda: rows(stack, table) == (50, 50))
        read_only_database(True)
        produce(stack, names["topic"], [(None, {"id": i}) for i in range(50, 80)])  # the last
        eventually(lambda: "database refuses" in " ".join(service.not_ready()), timeout=30)
        read_only_database(False)
        eventually(lambda: rows(stack, table) == (80, 80), timeout=60)
        eventually(lambda: service.ready and not service.not_ready(), timeout=30)


@pytest.mark.parametrize(
    "fault", ["read-only database", "statement timeout", "too many connections"]
)
def test_a_database_that_refuses_writes_is_retried_with_growing_delays_and_reported(
    stack: Endpoints,
    names: dict[str, str],
    fault: str,
    read_only_database: Callable[[bool], None],
    consumer_role: str,
) -> None:
    switch_read_only = read_only_database
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    table = names["table"]
    sql(stack, f"CREATE TABLE public.{table} (id int NOT NULL)")
    sql(stack, f"ALTER TABLE public.{table} OWNER TO {consumer_role}")
    as_role = replace(stack, dsn=make_conninfo(stack.dsn, user=consumer_role))
    settings = settings_for(as_role, names, consumer={"db_session_timeout_ms": 1_000})
    stream = Stream(stack, names["topic"])
    blocker = psycopg.connect(stack.dsn)
    try:
        with running(settings) as service:
            eventually(lambda: rows(stack, table)[0] > 500)
            if fault == "read-only database":
                switch_read_only(True)
                expected = "25006"
            elif fault == "statement timeout":
                # A maintenance job holding the table: reads go on, every write waits past
                # statement_timeout.
                blocker.execute(f"LOCK TABLE public.{table} IN EXCLUSIVE MODE")
                expected = "57014"
            else:
                # The limit binds when a connection opens: its sessions end, it must reconnect.
                sql(stack, f"ALTER ROLE {consumer_role} CONNECTION LIMIT 0")
                sql(stack, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           f"WHERE usename = '{consumer_role}'")  # fmt: skip
                expected = "53300"
            eventually(lambda: "database refuses" in " ".join(service.not_ready()), timeout=30)
            assert expected in " ".join(service.not_ready()), service.not_ready()
            refused_at = rows(stack, table)[0]
            time.sleep(12)
            refusals = sample(service, f"{METRIC_DATABASE_REFUSALS}_total", sqlstate=expected)
            # Growing delays (0.5, 1, 2, 4 s ...): a handful of tries, not a tight loop.
            assert 2 <= refusals <= 8, refusals
            assert rows(stack, table)[0] == refused_at  # nothing written meanwhile
            if fault == "read-only database":
                switch_read_only(False)
            elif fault == "statement timeout":
                blocker.rollback()
            else:
                sql(stack, f"ALTER ROLE {consumer_role} CONNECTION LIMIT -1")
            healed = time.monotonic()
            eventually(lambda: rows(stack, table)[0] > refused_at, timeout=40)
            print(f"{refusals} refusals; resumed {time.monotonic() - healed:.1f}s after")
            finish(stack, service, stream, names)
    finally:
        blocker.close()


@pytest.mark.parametrize("fault", ["connections reset", "500 ms latency"])
def test_a_reset_or_slow_postgres_link_loses_and_doubles_nothing(
    stack: Endpoints, names: dict[str, str], pg_proxy: Proxy, fault: str
) -> None:
    """Resets land wherever the stream is: in the middle of a COPY, during a COMMIT, between
    batches. Latency on every packet slows the consumer down and changes nothing else."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=3)
    table = names["table"]
    sql(stack, f"CREATE TABLE public.{table} (id int NOT NULL)")
    stream = Stream(stack, names["topic"])
    with running(settings_for(through(pg_proxy, stack), names)) as service:
        eventually(lambda: rows(stack, table)[0] > 500)
        if fault == "connections reset":
            for _ in range(3):
                pg_proxy.reset_peer()
                time.sleep(0.5)
                pg_proxy.heal()
                grows_from(stack, table, rows(stack, table)[0])
            assert sample(service, f"{METRIC_DATABASE_RECONNECTS}_total") >= 1
        else:
            pg_proxy.latency(500)
            before = rows(stack, table)[0]
            eventually(lambda: rows(stack, table)[0] > before + 1_000, timeout=90)
            assert service.ready, service.not_ready()
            pg_proxy.heal()
        finish(stack, service, stream, names)


def test_a_consumer_started_while_postgres_is_unreachable_waits_for_it(
    stack: Endpoints, names: dict[str, str], pg_proxy: Proxy
) -> None:
    """A supervisor starts the consumer before the database is back (a failover, a restart of
    both): it keeps trying with growing delays, saying so, and comes up when the database does,
    rather than dying on its first connection."""
    create_topic(stack.bootstrap_servers, names["topic"])
    table = names["table"]
    sql(stack, f"CREATE TABLE public.{table} (id int NOT NULL)")
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(100)])
    pg_proxy.reset_peer()
    settings = settings_for(through(pg_proxy, stack), names)
    consumer = settings.require_consumer().model_copy(update={"http_port": 0})
    service = ConsumerService(settings.model_copy(update={"consumer": consumer}))
    started = time.monotonic()
    starting = threading.Thread(target=service.start, daemon=True)
    starting.start()
    failure: list[BaseException] = []
    thread: threading.Thread | None = None
    try:
        # Served from the first moment: alive, not ready, and why.
        eventually(lambda: service.http_port is not None, timeout=10)
        base = f"http://127.0.0.1:{service.http_port}"
        eventually(lambda: "the database is unreachable" in http_get(base + "/readyz")[1])
        assert http_get(base + "/readyz")[0] == 503
        assert http_get(base + "/healthz")[0] == 200
        assert starting.is_alive(), "the start-up did not wait for the database"
        pg_proxy.heal()
        starting.join(60)
        waited = time.monotonic() - started
        assert not starting.is_alive(), "the start-up did not end once the database was back"
        thread, failure = in_background(service)
        eventually(lambda: rows(stack, table) == (100, 100) and service.ready)
        assert http_get(base + "/readyz")[0] == 200
        service.stop()
        thread.join(60)
    finally:
        service.stop()
        starting.join(60)
        if thread is None:
            service.close()  # started or not, nothing it opened is left behind
    assert not failure, failure
    print(f"started {waited:.1f}s after the database became unreachable")


def test_a_member_leaving_while_the_database_refuses_writes_leaves_cleanly(
    stack: Endpoints, names: dict[str, str], read_only_database: Callable[[bool], None]
) -> None:
    """Its partitions are revoked while the database is read-only: marking them unowned is
    refused, which is no reason to crash (the next owner's claim fences this member anyway)."""
    create_topic(stack.bootstrap_servers, names["topic"], partitions=2)
    table = names["table"]
    sql(stack, f"CREATE TABLE public.{table} (id int NOT NULL)")
    produce(stack, names["topic"], [(None, {"id": i}) for i in range(100)])
    with running(settings_for(stack, names)) as service:
        eventually(lambda: rows(stack, table) == (100, 100) and service.ready)
        read_only_database(True)
    # Leaving the block stopped the member (its partitions revoked) and found no failure.
    read_only_database(False)
    owners = sql(stack, f"SELECT owner FROM {names['schema']}.offsets")
    assert [owner for (owner,) in owners if owner is not None], "the release was not refused"
