"""`bridge demo`: the whole pipeline once, on the local stack, verified row by row.

Sample orders (unique ids) as JSON-lines files -> the Spark producer job (`available-now`) ->
Kafka transactions -> the consumer service -> PostgreSQL. Then every id is checked to have
arrived exactly once, and the group's offsets are shown next to Kafka's log.

With `value_format` avro (or json-schema) the orders travel as typed records: the producer
reads each line by `ORDER_SCHEMA` and registers it in the stack's schema registry, and the
consumer decodes them by the id each record carries.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import yaml
from rich.console import Console

from bridge.errors import BridgeError
from bridge.kafka_admin import KafkaAdmin, create_topic
from bridge.names import DEFAULT_STATE_SCHEMA, ENV_PREFIX
from bridge.settings import load_settings, stack_env_files
from bridge_shell.stack import LocalStack
from bridge_shell.stack.postgres import grant_table, role_of
from consumers import applied_position, caught_up_position

DEMO_TABLE = "public.demo_orders"
# The sample orders' fields as Spark reads them for `--format avro`.
ORDER_SCHEMA = (
    "order_id BIGINT, run_id STRING, customer STRING, amount DECIMAL(12,2), currency STRING, "
    "created_at TIMESTAMP"
)
PARTITIONS = 4
_CONSUMER_DEADLINE_S = 180.0


@dataclass(frozen=True)
class Verdict:
    expected: int
    rows: int
    distinct: int
    dead_letters: int

    @property
    def missing(self) -> int:
        return self.expected - self.distinct

    @property
    def duplicated(self) -> int:
        return self.rows - self.distinct

    @property
    def exactly_once(self) -> bool:
        return self.missing == 0 and self.duplicated == 0 and self.dead_letters == 0


def write_orders(directory: Path, run: str, count: int, files: int) -> None:
    """`count` orders with unique ids, spread over `files` JSON-lines files (one epoch each)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(run)  # noqa: S311 - sample data, not secrets
    start = datetime(2026, 1, 1, tzinfo=UTC)
    per_file = -(-count // files)
    for index in range(files):
        ids = range(index * per_file, min(count, (index + 1) * per_file))
        lines = [json.dumps(_order(i, run, rng, start)) for i in ids]
        (directory / f"orders-{index:03d}.json").write_text("\n".join(lines) + "\n")


def _order(i: int, run: str, rng: random.Random, start: datetime) -> dict[str, object]:
    return {
        "order_id": i,
        "run_id": run,
        "customer": f"customer-{rng.randrange(500):03d}",
        "amount": f"{rng.randrange(100, 100_000) / 100:.2f}",
        "currency": "EUR",
        "created_at": (start + timedelta(seconds=i)).isoformat(),
    }


def create_demo_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Qualified on purpose: the stack's role is `bridge`, so an unqualified name would land
        # in the consumer's state schema `bridge` through the default search_path ("$user").
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {DEMO_TABLE} ("
            "order_id bigint NOT NULL, run_id text NOT NULL, customer text, "
            "amount numeric(12,2), currency text, created_at timestamptz, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(
            "CREATE INDEX IF NOT EXISTS demo_orders_run ON public.demo_orders (run_id, order_id)"
        )


def verify(dsn: str, run: str, expected: int, group: str) -> Verdict:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*), count(DISTINCT order_id) FROM {DEMO_TABLE} "  # noqa: S608
            "WHERE run_id = %s AND order_id >= 0 AND order_id < %s",
            (run, expected),
        ).fetchone()
        strays = conn.execute(
            f"SELECT count(*) FROM {DEMO_TABLE} "  # noqa: S608 - our constant
            "WHERE run_id = %s AND NOT (order_id >= 0 AND order_id < %s)",
            (run, expected),
        ).fetchone()
        dead = conn.execute(
            f'SELECT count(*) FROM "{DEFAULT_STATE_SCHEMA}".dead_letters WHERE group_id = %s',  # noqa: S608
            (group,),
        ).fetchone()
    assert row is not None and strays is not None and dead is not None  # noqa: S101
    return Verdict(
        expected=expected,
        rows=int(row[0]) + int(strays[0]),
        distinct=int(row[1]),
        dead_letters=int(dead[0]),
    )


def _tail(log: Path, lines: int = 30) -> str:
    """The end of a step's log, for the failure message."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


class DemoFailed(BridgeError):
    """A step of the demo failed; the message says which and where its log is."""


def _run_step(console: Console, what: str, command: list[str], log: Path) -> None:
    started = time.monotonic()
    with console.status(f"{what} ...", spinner="dots"), log.open("wb") as out:
        result = subprocess.run(  # noqa: S603 - our own interpreter and arguments
            command, stdout=out, stderr=subprocess.STDOUT, env=_own_environment(), check=False
        )
    if result.returncode != 0:
        raise DemoFailed(f"{what} failed (exit {result.returncode}); log {log}:\n{_tail(log)}")
    console.print(f"[green]✓[/] {what} ({time.monotonic() - started:.0f} s)")


def run_demo(
    console: Console,
    *,
    stack: LocalStack,
    records: int,
    keep_stack: bool,
    value_format: str = "json",
) -> bool:
    """Returns True when every id arrived exactly once."""
    begun = time.monotonic()
    run = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    stack_dir = stack.data_dir
    work = stack_dir / "demo" / run
    work.mkdir(parents=True, exist_ok=True)
    was_running = stack.status().running
    try:
        with console.status("starting the local stack ...", spinner="dots"):
            status = stack.up()
        assert status.bootstrap_servers and status.dsn  # noqa: S101 - up() waits for both
        nodes = len(status.kafka_nodes)
        spark = (
            f", Spark {status.spark_master} ({len(status.spark_daemons) - 1} workers)"
            if status.spark_master
            else ""
        )
        console.print(
            f"[green]✓[/] local stack: Kafka {status.bootstrap_servers} ({nodes} "
            f"node{'s' if nodes > 1 else ''}), PostgreSQL {status.dsn}{spark}"
        )
        if status.secure:
            console.print(
                "[green]✓[/] secured: Kafka over SASL_SSL (SCRAM-SHA-512) with ACLs, PostgreSQL "
                "over TLS with SCRAM; the producer, the consumer and the tools each as their own "
                "principal"
            )
        return _pipeline(console, stack_dir, work, run, records, begun, value_format)
    finally:
        if keep_stack or was_running:
            console.print(f"the stack keeps running: `bridge stack down --data-dir {stack_dir}`")
        else:
            stack.down()


def _pipeline(
    console: Console,
    stack_dir: Path,
    work: Path,
    run: str,
    records: int,
    begun: float,
    value_format: str,
) -> bool:
    topic, group = f"demo-orders-{run}", f"demo-{run}"
    consumer: subprocess.Popen[bytes] | None = None
    # The set-up and the checks run as the stack's administrator; the producer and the consumer
    # each read their own role's settings from the stack (on a secured stack, least rights).
    admin = load_settings(env_file=stack_env_files(stack_dir, "admin"))
    kafka = admin.kafka.client_config()
    dsn = admin.postgres.dsn.get_secret_value()
    try:
        write_orders(work / "input", run, records, files=5)
        console.print(f"[green]✓[/] {records:,} sample orders with unique ids in {work / 'input'}")
        create_topic(admin.kafka.bootstrap_servers, topic, partitions=PARTITIONS, config=kafka)
        create_demo_table(dsn)
        consumer_dsn = load_settings(env_file=stack_env_files(stack_dir, "consumer")).postgres.dsn
        consumer_role = role_of(consumer_dsn.get_secret_value())
        if consumer_role != role_of(dsn):
            grant_table(dsn, DEMO_TABLE, consumer_role)
        typed = ["--value-format", value_format, "--value-schema", ORDER_SCHEMA]
        as_what = {
            "avro": " as Avro registered in the schema registry",
            "json-schema": " as JSON with a JSON Schema registered in the schema registry",
        }.get(value_format, "")
        _run_step(
            console,
            f"Spark producer: files -> Kafka topic {topic} in transactions{as_what}, one epoch "
            "per file",
            [sys.executable, "-m", "bridge_shell.cli", "produce", "--source", "files",
             "--input", str(work / "input"), "--max-files-per-trigger", "1",
             "--topic", topic, "--key-field", "order_id", "--trigger", "available-now",
             "--checkpoint", str(work / "checkpoint"), "--stack-dir", str(stack_dir),
             *(typed if value_format != "json" else [])],
            work / "producer.log",
        )  # fmt: skip
        config = work / "consumer.yaml"
        # Where Kafka and PostgreSQL are, and as whom, the consumer reads from the stack.
        route = {"topic": topic, "table": DEMO_TABLE, "mode": "insert",
                 "value_format": value_format}  # fmt: skip
        config.write_text(yaml.safe_dump({"consumer": {"group_id": group, "routes": [route]}}))
        with (work / "consumer.log").open("wb") as out:
            consumer = subprocess.Popen(  # noqa: S603
                [sys.executable, "-m", "consumers", "--config", str(config),
                 "--stack-dir", str(stack_dir)],
                stdout=out, stderr=subprocess.STDOUT, env=_own_environment(),
            )  # fmt: skip
        kafka_admin = KafkaAdmin(kafka)
        target = caught_up_position(kafka_admin, topic, PARTITIONS)
        _wait_for_consumer(console, consumer, dsn, group, topic, target, work / "consumer.log")
        consumer.send_signal(signal.SIGTERM)
        consumer.wait(60)
        consumer = None

        verdict = verify(dsn, run, records, group)
        from bridge_shell.tables import positions_table
        from consumers import read_positions

        with psycopg.connect(dsn, autocommit=True) as conn:
            positions = read_positions(conn, DEFAULT_STATE_SCHEMA, kafka_admin, group)
        console.print(positions_table(positions, title=f"offsets of group {group}"))
        _summary(console, verdict, run, topic, time.monotonic() - begun)
        return verdict.exactly_once
    finally:
        if consumer is not None:
            consumer.kill()
            consumer.wait()


def _wait_for_consumer(
    console: Console,
    consumer: subprocess.Popen[bytes],
    dsn: str,
    group: str,
    topic: str,
    target: int,
    log: Path,
) -> None:
    started = time.monotonic()
    with (
        console.status("consumer: Kafka -> PostgreSQL ...", spinner="dots") as status,
        psycopg.connect(dsn, autocommit=True) as watcher,
    ):
        while (position := applied_position(watcher, group, DEFAULT_STATE_SCHEMA, topic)) < target:
            if consumer.poll() is not None:
                raise DemoFailed(
                    f"the consumer exited ({consumer.returncode}); log {log}:\n{_tail(log)}"
                )
            if time.monotonic() - started > _CONSUMER_DEADLINE_S:
                raise DemoFailed(f"the consumer did not catch up in {_CONSUMER_DEADLINE_S:.0f} s")
            status.update(f"consumer: Kafka -> PostgreSQL, offset {position:,} of {target:,}")
            time.sleep(0.2)
    console.print(
        f"[green]✓[/] consumer caught up: offsets and rows committed together "
        f"({time.monotonic() - started:.0f} s)"
    )


def _summary(console: Console, verdict: Verdict, run: str, topic: str, seconds: float) -> None:
    mark = "[bold green]exactly once[/]" if verdict.exactly_once else "[bold red]MISMATCH[/]"
    console.print(
        f"\n{mark}: {verdict.expected:,} orders sent, {verdict.rows:,} rows in {DEMO_TABLE} "
        f"for run {run}, {verdict.distinct:,} distinct ids, {verdict.missing:,} missing, "
        f"{verdict.duplicated:,} duplicated, {verdict.dead_letters:,} dead letters "
        f"(topic {topic}, {seconds:.0f} s in all)"
    )


def _own_environment() -> dict[str, str]:
    """The environment for the demo's processes: BRIDGE_* variables of the caller's shell would
    override the demo's own stack and configuration, so they are left out."""
    return {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
