"""Consumer benchmark: the service against the limits of its parts, in one run on one machine.

    .venv/bin/python -m bench.consumer [--records 1000000] [--rate 10000] [--seconds 20]
        [--rounds 5] [--warm-up-rounds 1] [--baseline-tree DIR]

(a) COPY of the same rows as text formatted before the clock starts, into the same table: the
    baseline, PostgreSQL's own limit for these rows (the service formats its COPY text in C, so
    a baseline that formats tuples in Python while timed would be the weaker one); and, for
    reference, psycopg's COPY of the rows as ready-made tuples (`write_row`, formatted while timed),
(b) raw read_committed consumption of the topic with that decoding and the service's tuning,
(c) the service end to end (`python -m consumers`) in insert and upsert mode, with peak RSS,
(d) end-to-end latency under a steady load: send time to the row's insertion, p50 / p99,
(e) the best hand-written upsert of the same ready-made tuples (staged COPY + ON CONFLICT),
    upsert's baseline as (a) is insert's.
The baselines' rows are the topic's, decoded before any clock starts, in the order a consumer
receives them (a run of consecutive ids from each partition in turn); each batch of (e) is
sorted by key, the most a hand-written streaming upsert can do (the service keeps the records'
order: of two keys PostgreSQL equates and Python does not, "a" and "A" under a case-insensitive
collation, the later record must win). The same upsert of the rows in
id order over the whole topic, which no consumer of a partitioned topic sees and which spares
the index all but its rightmost page, is run and reported for reference.
(a), (b), (c) and (e) are measured in alternating rounds (--rounds, default 5): on a shared
machine their rates drift by a third within minutes, and a ratio is only worth something between
runs made next to each other, and five rounds keep an odd one out of the median. Each round
gives its own ratio; the figures are the medians, with every round's kept. The service is
timed as a user sees it from outside: from the moment the offsets table shows that it holds all
its partitions (the claim it writes on assignment) to the moment the offsets table shows the
topic's end, polled every 20 ms over one connection: the watching reads a few rows of a small
table, never the target table. One round runs first
and is not counted (reported as the warm-up; --warm-up-rounds): in six runs of nine on a new
stack, the first round's raw COPY ran at half to two thirds of the later rounds' rate. Each
timed run starts after a CHECKPOINT (see `checkpoint`) and reports the CPU seconds of its parts
(client or service, PostgreSQL, the broker) and how busy the machine was (bench/cpu.py). Writes
bench/results/consumer-*.json.

`--baseline-tree DIR` (another commit's checkout) also runs that tree's service in every round,
each tree first in every other round: a change's before and after, alternated in one run."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
import yaml
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from psycopg import sql as sql_ident

from bench.common import Endpoints, new_table, new_topic, running_stack, scratch_dir, write_results
from bench.cpu import CpuMeter, thread_seconds
from bridge.kafka_admin import KafkaAdmin
from bridge.names import DEFAULT_STATE_SCHEMA, OFFSETS_TABLE
from consumers.batch.pipelined import formatted
from consumers.database.offsets import applied_position
from consumers.database.positions import caught_up_position
from consumers.decoding.rows import RowDecoder
from consumers.service import CONSUMER_FETCH_DEFAULTS

PARTITIONS = 4
POLL_S = 0.02  # how often the offsets table is read while a service run is timed
COLUMNS = "id bigint NOT NULL, customer text, amount numeric(12,2), currency text, note text, " \
    "sent_ms bigint, applied_at timestamptz DEFAULT clock_timestamp()"  # fmt: skip


def record(i: int, sent_ms: int) -> dict[str, Any]:
    """About 150 bytes of JSON, like an order event."""
    return {"id": i, "customer": f"customer-{i % 5000:05d}", "amount": round(i % 10_000 / 7, 2),
            "currency": "EUR", "note": "n" * 40, "sent_ms": sent_ms}  # fmt: skip


def fill_topic(stack: Endpoints, topic: str, records: int, partitions: int = PARTITIONS) -> float:
    new_topic(stack, topic, partitions=partitions)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 20,
                         "transactional.id": f"bench-{uuid.uuid4().hex}"})  # fmt: skip
    producer.init_transactions(30)
    started = time.perf_counter()
    now_ms = int(time.time() * 1000)
    for start in range(0, records, 50_000):
        producer.begin_transaction()
        for i in range(start, min(records, start + 50_000)):
            while True:
                try:
                    producer.produce(topic, json.dumps(record(i, now_ms)).encode())
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(60)
    return time.perf_counter() - started


def sql(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement.encode())
        return cursor.fetchall() if cursor.description else []


def checkpoint(dsn: str) -> None:
    """Before each timed run, baseline or service alike: a fresh cluster has no spent WAL
    segments to recycle, so PostgreSQL zero-fills a new 16 MB segment every few batches, 40-60
    ms each, and whichever run came when the WAL ran out paid for it (rates swung by a quarter
    between runs of the same code). After a CHECKPOINT the segments already written are
    recycled for the next run, as on a database that has been running a while."""
    sql(dsn, "CHECKPOINT")


NAMES = ["id", "customer", "amount", "currency", "note", "sent_ms"]
RAW_BATCH = 5_000  # rows per transaction of the hand-written baselines


def ready_rows(records: int) -> list[tuple[Any, ...]]:
    """The topic's rows as tuples, decoded before any clock starts."""
    decoder = RowDecoder(NAMES)
    return [decoder.decode(json.dumps(record(i, 0)).encode()) for i in range(records)]


def sorted_per_batch(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each batch of the hand-written upsert sorted by its key (id, the first column): index
    pages are then touched in order within a batch, the most a streaming upsert can do, since
    it sees the rows only as they arrive."""
    return [
        row
        for start in range(0, len(rows), RAW_BATCH)
        for row in sorted(rows[start : start + RAW_BATCH], key=itemgetter(0))
    ]


def copy_text(rows: list[tuple[Any, ...]]) -> list[bytes]:
    """The rows as COPY text, one chunk per 5,000-row transaction, made before any clock starts.
    The rows hold ints, Decimals and plain ASCII text without tabs, newlines or backslashes, so
    `str` of each value is its COPY text; anything else is refused rather than mis-escaped."""
    chunks = []
    for start in range(0, len(rows), RAW_BATCH):
        lines = []
        for row in rows[start : start + RAW_BATCH]:
            fields = ["\\N" if v is None else str(v) for v in row]
            if any(c in f for f in fields for c in "\t\n\r") or any(
                "\\" in f for f in fields if f != "\\N"
            ):
                raise ValueError(f"a value would need COPY escaping: {row!r}")
            lines.append("\t".join(fields))
        chunks.append(("\n".join(lines) + "\n").encode())
    return chunks


def text_copy(stack: Endpoints, chunks: list[bytes]) -> float:
    """PostgreSQL's own limit for these rows: their COPY text, formatted before the clock, sent
    into an identical table, one transaction per 5,000 rows. Nothing else is timed: no decoding,
    no formatting, no offset update, all of which the service does on top."""
    table = f"raw_t_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, COLUMNS)
    statement = f"COPY {table} ({', '.join(NAMES)}) FROM STDIN".encode()
    started = time.perf_counter()
    with psycopg.connect(stack.dsn) as conn:
        for chunk in chunks:
            with conn.transaction(), conn.cursor().copy(statement) as copy:
                copy.write(chunk)
    return time.perf_counter() - started


def raw_copy(stack: Endpoints, rows: list[tuple[Any, ...]]) -> float:
    """For reference: the same rows as ready-made tuples, formatted by psycopg while timed
    (`write_row`), one transaction per 5,000 rows."""
    table = f"raw_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, COLUMNS)
    statement = f"COPY {table} ({', '.join(NAMES)}) FROM STDIN".encode()
    started = time.perf_counter()
    with psycopg.connect(stack.dsn) as conn:
        for start in range(0, len(rows), RAW_BATCH):
            with conn.transaction(), conn.cursor().copy(statement) as copy:
                for row in rows[start : start + RAW_BATCH]:
                    copy.write_row(row)
    return time.perf_counter() - started


def raw_upsert(stack: Endpoints, rows: list[tuple[Any, ...]]) -> float:
    """The best hand-written upsert of the same rows: a staging table made once per session
    (ON COMMIT DELETE ROWS empties it at each commit for free), and per 5,000 rows one COPY into
    it and one INSERT ... ON CONFLICT DO UPDATE into the keyed table."""
    table = f"raw_up_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, f"{COLUMNS}, PRIMARY KEY (id)")
    columns = ", ".join(NAMES)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in NAMES if c != "id")
    copy_in = f"COPY stage ({columns}) FROM STDIN".encode()
    merge = (
        f"INSERT INTO {table} ({columns}) SELECT {columns} FROM stage "
        f"ON CONFLICT (id) DO UPDATE SET {updates}"
    ).encode()
    started = time.perf_counter()
    with psycopg.connect(stack.dsn) as conn:
        conn.execute(
            f"CREATE TEMP TABLE stage (LIKE {table} INCLUDING DEFAULTS) "
            "ON COMMIT DELETE ROWS".encode()
        )
        conn.commit()
        for start in range(0, len(rows), RAW_BATCH):
            with conn.transaction():
                with conn.cursor().copy(copy_in) as copy:
                    for row in rows[start : start + RAW_BATCH]:
                        copy.write_row(row)
                conn.execute(merge)
    return time.perf_counter() - started


def part_costs(stack: Endpoints, values: list[bytes]) -> dict[str, float]:
    """Microseconds a row of the service's two Python-thread steps, each alone over the topic's
    values in 5,000-record batches, in this process: decoding (the service's RowDecoder) and
    formatting the COPY text (the service's `formatted`, psycopg's C formatter). Together with
    the service's main-thread CPU per row, they say where its time goes."""
    decoder = RowDecoder(NAMES)
    batches = [values[i : i + RAW_BATCH] for i in range(0, len(values), RAW_BATCH)]
    started = time.perf_counter()
    decoded = [decoder.decode_all(batch) for batch in batches]
    decode_s = time.perf_counter() - started
    with psycopg.connect(stack.dsn) as conn:
        started = time.perf_counter()
        for rows in decoded:
            assert rows is not None
            formatted(conn, rows)
        format_s = time.perf_counter() - started
    return {
        "decode_us_per_row": round(decode_s * 1e6 / len(values), 3),
        "format_us_per_row": round(format_s * 1e6 / len(values), 3),
    }


def raw_consume(
    stack: Endpoints,
    topic: str,
    keep: list[tuple[Any, ...]] | None = None,
    raw: list[bytes] | None = None,
) -> tuple[float, int]:
    """Seconds to read and decode the whole topic as a read_committed consumer does, and the
    records read; `keep` collects the rows in the order they arrived."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "bench-raw",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False, **CONSUMER_FETCH_DEFAULTS})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    decoder = RowDecoder(NAMES)
    started = time.perf_counter()
    seen, at_end = 0, set[int]()
    while len(at_end) < PARTITIONS:
        for message in consumer.consume(10_000, 1.0):
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition() or 0)
            elif error is None:
                row = decoder.decode(message.value() or b"{}")  # the service decodes every value
                if keep is not None:
                    keep.append(row)
                if raw is not None:
                    raw.append(message.value() or b"{}")
                seen += 1
    seconds = time.perf_counter() - started
    consumer.close()
    return seconds, seen


class Service:
    """`python -m consumers` on one route, in its own process, as in production."""

    def __init__(
        self,
        stack: Endpoints,
        topic: str,
        table: str,
        mode: str,
        scratch: Path,
        tree: Path | None = None,
        batch_max_wait_ms: int | None = 20,  # None: the service's default
        group: str | None = None,  # several instances of one group share it
        http_port: int | None = None,  # serve /metrics there
        value_format: str = "json",  # avro: through the stack's schema registry
        route_options: dict[str, Any] | None = None,  # more of the route: epochs, metadata
        consumer_options: dict[str, Any] | None = None,  # more of the group: epochs_topic
        more_routes: list[dict[str, Any]] | None = None,  # other topics, as the config says them
    ) -> None:
        self.stack, self.group = stack, group or f"bench-{uuid.uuid4().hex[:8]}"
        self.topic = topic  # its positions: a group of whole routes has the manifest's beside
        self._watcher: psycopg.Connection[Any] | None = None
        route: dict[str, Any] = {"topic": topic, "table": f"public.{table}", "mode": mode}
        if mode == "upsert":
            route["key_columns"] = ["id"]
        if value_format != "json":
            route["value_format"] = value_format
        route |= route_options or {}
        # Another tree (another release) keeps its state tables apart: a newer release migrates
        # them forward, and an older one refuses tables newer than it knows.
        self.state_schema = (
            DEFAULT_STATE_SCHEMA if tree is None else f"{DEFAULT_STATE_SCHEMA}_baseline"
        )
        consumer: dict[str, Any] = {
            "group_id": self.group, "routes": [route, *(more_routes or [])],
            "state_schema": self.state_schema,
        }  # fmt: skip
        if batch_max_wait_ms is not None:
            consumer["batch_max_wait_ms"] = batch_max_wait_ms
        if http_port is not None:
            consumer["http_port"] = http_port
        consumer |= consumer_options or {}
        name = f"{self.group}-{uuid.uuid4().hex[:6]}"
        config = scratch / f"{name}.yaml"
        config.write_text(yaml.safe_dump({
            "kafka": {"bootstrap_servers": stack.bootstrap_servers},
            "postgres": {"dsn": stack.dsn},
            "consumer": consumer,
            **({"schema_registry": {"url": stack.registry_url}} if stack.registry_url else {}),
        }))  # fmt: skip
        self.log = scratch / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
        if tree is not None:  # that tree's packages come first on the path
            env["PYTHONPATH"] = str(tree)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "consumers", "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tree,
            )  # fmt: skip

    def watcher(self) -> psycopg.Connection[Any]:
        # One connection for all the polls: a new one every 50 ms would fork a PostgreSQL
        # backend each time, CPU taken from the database the service is measured against.
        if self._watcher is None:
            self._watcher = psycopg.connect(self.stack.dsn, autocommit=True)
        return self._watcher

    def position(self) -> int:
        return applied_position(self.watcher(), self.group, self.state_schema, self.topic)

    def held_partitions(self) -> int:
        """Partitions whose row in the offsets table names an owner: the claim the service
        writes when it is assigned them, before it reads a record."""
        try:
            row = (
                self.watcher()
                .execute(
                    sql_ident.SQL(
                        "SELECT count(*) FROM {} WHERE group_id = %s AND topic = %s "
                        "AND owner IS NOT NULL"
                    ).format(sql_ident.Identifier(self.state_schema, OFFSETS_TABLE)),
                    (self.group, self.topic),
                )
                .fetchone()
            )
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row else 0

    def wait_until(self, reached: Callable[[], bool], timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not reached():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service stopped short:\n{self.log.read_text()[-2000:]}")
            time.sleep(POLL_S)

    def wait_for(self, target: int, timeout: float = 600) -> None:
        self.wait_until(lambda: self.position() >= target, timeout)

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None


def caught_up(stack: Endpoints, topic: str, partitions: int = PARTITIONS) -> int:
    admin = KafkaAdmin({"bootstrap.servers": stack.bootstrap_servers})
    return caught_up_position(admin, topic, partitions)


def service_run(
    stack: Endpoints,
    topic: str,
    records: int,
    mode: str,
    scratch: Path,
    tree: Path | None = None,
    value_format: str = "json",
) -> dict[str, Any]:
    table = f"svc_{mode}_{uuid.uuid4().hex[:8]}"
    key = ", PRIMARY KEY (id)" if mode == "upsert" else ""
    new_table(stack, table, f"{COLUMNS}{key}")
    # Asked before the clock starts: a new admin client now and then takes a second or more
    # to answer (1 s in 40 tries), which once counted against the service.
    target = caught_up(stack, topic)
    checkpoint(stack.dsn)
    started = time.perf_counter()
    service = Service(stack, topic, table, mode, scratch, tree, value_format=value_format)
    meter = stack_meter(stack)
    try:
        # The clock starts when the service holds every partition, as a user's would once it
        # is in its group: the process's start and the group's join are not the rate's.
        service.wait_until(lambda: service.held_partitions() >= PARTITIONS)
        joined = time.perf_counter()
        before = meter.read(service=service.process.pid)
        threads_before = thread_seconds(service.process.pid)
        service.wait_for(target)
        seconds = time.perf_counter() - joined
        cpu: dict[str, Any] = CpuMeter.spent(
            before, meter.read(service=service.process.pid), seconds
        )
        threads = thread_seconds(service.process.pid)
        # Where the service's own CPU went: its main (Python) thread, librdkafka's threads.
        cpu["service_threads_cpu"] = {
            name: round(threads[name] - threads_before[name], 2) for name in threads
        }
        rss = service.peak_rss_mb()
    finally:
        service.stop()
    return {"mode": mode, "seconds": round(seconds, 2), "rows_per_second": round(records / seconds),
            "start_seconds": round(joined - started, 2), "peak_rss_mb": round(rss, 1),
            "cpu": cpu}  # fmt: skip


def stack_meter(stack: Endpoints) -> CpuMeter:
    return CpuMeter(trees={"postgres": stack.postgres_pid}, processes={"kafka": stack.kafka_pid})


def metered(stack: Endpoints, run: Callable[[], float]) -> tuple[float, dict[str, Any]]:
    """A hand-written baseline's seconds, after a checkpoint, and the CPU of its run; the
    client is this process."""
    checkpoint(stack.dsn)
    meter = stack_meter(stack)
    before = meter.read(client=os.getpid())
    seconds = run()
    return seconds, CpuMeter.spent(before, meter.read(client=os.getpid()), seconds)


def cpu_line(cpu: dict[str, Any]) -> str:
    parts = ", ".join(
        f"{name.removesuffix('_cpu_s')} {value}"
        for name, value in cpu.items()
        if name.endswith("_cpu_s")
    )
    return (
        f"CPU s in {cpu['wall_s']} s: {parts}; machine {cpu['machine_busy']:.0%} busy, "
        f"{cpu['machine_iowait']:.0%} waiting for I/O"
    )


def latency_run(stack: Endpoints, rate: int, seconds: int, scratch: Path) -> dict[str, Any]:
    topic = f"bench-lat-{uuid.uuid4().hex[:8]}"
    new_topic(stack, topic, partitions=PARTITIONS)
    table = f"lat_{uuid.uuid4().hex[:8]}"
    new_table(stack, table, COLUMNS)
    service = Service(stack, topic, table, "insert", scratch)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 5,
                         "transactional.id": f"bench-lat-{uuid.uuid4().hex}"})  # fmt: skip
    producer.init_transactions(30)
    sent = 0
    try:
        time.sleep(3)  # let the service join its group
        # One transaction every 100 ms, as a streaming producer with a short trigger commits.
        tick, per_tick = 0.1, rate // 10
        begin = time.perf_counter()
        while time.perf_counter() - begin < seconds:
            due = begin + (sent // per_tick) * tick
            time.sleep(max(0.0, due - time.perf_counter()))
            producer.begin_transaction()
            for _ in range(per_tick):
                producer.produce(topic, json.dumps(record(sent, int(time.time() * 1000))).encode())
                sent += 1
            producer.commit_transaction(30)
        offered = sent / (time.perf_counter() - begin)
        service.wait_for(caught_up(stack, topic))
        rss = service.peak_rss_mb()
    finally:
        service.stop()
    p50, p99, worst = sql(
        stack.dsn,
        f"""
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
        FROM (SELECT extract(epoch FROM applied_at) * 1000 - sent_ms AS ms FROM {table}) t""",
    )[0]
    return {
        "offered_per_second": round(offered),
        "records": sent,
        "p50_ms": round(float(p50), 1),
        "p99_ms": round(float(p99), 1),
        "max_ms": round(float(worst), 1),
        "peak_rss_mb": round(rss, 1),
    }


def _tree_commit(tree: Path) -> str:
    """The commit a baseline checkout stands at."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def median_run(rounds: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The service's runs in one mode across the rounds: median rate, highest peak RSS."""
    return {
        "mode": mode,
        "rows_per_second": round(median(r[mode]["rows_per_second"] for r in rounds)),
        "peak_rss_mb": max(r[mode]["peak_rss_mb"] for r in rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warm-up-rounds", type=int, default=1,
        help="rounds run first and not counted: the first runs on a new stack are the slowest",
    )  # fmt: skip
    parser.add_argument("--baseline-tree", type=Path, help="also run this checkout's service")
    args = parser.parse_args()
    base = args.baseline_tree.resolve() if args.baseline_tree else None
    with scratch_dir("bridge-bench-consumer-") as scratch, running_stack() as stack:
        topic = f"bench-c-{uuid.uuid4().hex[:8]}"
        fill = fill_topic(stack, topic, args.records)
        print(f"{args.records:,} records of ~150 bytes in Kafka ({args.records / fill:,.0f}/s)")
        # The baselines write the very rows the service writes, in the order a consumer of the
        # topic receives them: a run of consecutive ids from each partition in turn.
        arrived: list[tuple[Any, ...]] = []
        values: list[bytes] = []
        raw_consume(stack, topic, keep=arrived, raw=values)
        assert len(arrived) == args.records, len(arrived)
        upsert_rows = sorted_per_batch(arrived)
        # For reference only: the same rows in key order over the whole topic, as no consumer
        # of a partitioned topic receives them. Every insert then lands on the key index's
        # rightmost page.
        id_order = sorted(arrived, key=itemgetter(0))
        chunks = copy_text(arrived)
        rounds: list[dict[str, Any]] = []
        warm_up: dict[str, Any] = {}
        for number in range(args.warm_up_rounds + args.rounds):
            counted = number >= args.warm_up_rounds
            text_s, text_cpu = metered(stack, lambda: text_copy(stack, chunks))
            text_rate = args.records / text_s
            copy_s, copy_cpu = metered(stack, lambda: raw_copy(stack, arrived))
            copy_rate = args.records / copy_s
            consume_s, consumed = raw_consume(stack, topic)
            assert consumed == args.records, consumed
            parts = part_costs(stack, values)
            # With a baseline tree, each goes first in every other round.
            before = None
            if base is not None and len(rounds) % 2:
                before = service_run(stack, topic, args.records, "insert", scratch, base)
            insert = service_run(stack, topic, args.records, "insert", scratch)
            if base is not None and before is None:
                before = service_run(stack, topic, args.records, "insert", scratch, base)
            ratio = round(insert["rows_per_second"] / copy_rate, 3)
            text_ratio = round(insert["rows_per_second"] / text_rate, 3)
            upsert_s, upsert_cpu = metered(stack, lambda: raw_upsert(stack, upsert_rows))
            raw_upsert_rate = args.records / upsert_s
            before_upsert = None
            if base is not None and len(rounds) % 2:
                before_upsert = service_run(stack, topic, args.records, "upsert", scratch, base)
            upsert = service_run(stack, topic, args.records, "upsert", scratch)
            if base is not None and before_upsert is None:
                before_upsert = service_run(stack, topic, args.records, "upsert", scratch, base)
            upsert_ratio = round(upsert["rows_per_second"] / raw_upsert_rate, 3)
            id_order_s, id_order_cpu = metered(stack, lambda: raw_upsert(stack, id_order))
            id_order_rate = args.records / id_order_s
            done = {
                "parts": parts,
                "text_copy_rows_per_second": round(text_rate),
                "text_copy_cpu": text_cpu,
                "insert_ratio_to_text_copy": text_ratio,
                "raw_copy_rows_per_second": round(copy_rate),
                "raw_copy_cpu": copy_cpu,
                "raw_consume_records_per_second": round(args.records / consume_s),
                "insert": insert,
                "insert_ratio_to_copy": ratio,
                "raw_upsert_rows_per_second": round(raw_upsert_rate),
                "raw_upsert_cpu": upsert_cpu,
                "upsert": upsert,
                "upsert_ratio_to_raw_upsert": upsert_ratio,
                "raw_upsert_id_order_rows_per_second": round(id_order_rate),
                "raw_upsert_id_order_cpu": id_order_cpu,
                "upsert_ratio_to_raw_upsert_id_order": round(
                    upsert["rows_per_second"] / id_order_rate, 3
                ),
            }  # fmt: skip
            if counted:
                rounds.append(done)
            else:
                warm_up = done
            label = f"round {len(rounds)}" if counted else "warm-up (not counted)"
            print(f"{label}: COPY of text {text_rate:,.0f} rows/s, of tuples {copy_rate:,.0f}; "
                  f"service insert {insert['rows_per_second']:,} rows/s = {text_ratio}x text, "
                  f"{ratio}x tuples; "
                  f"hand-written upsert {raw_upsert_rate:,.0f} rows/s, service upsert "
                  f"{upsert['rows_per_second']:,} rows/s = {upsert_ratio}x "
                  f"(= {done['upsert_ratio_to_raw_upsert_id_order']}x of the same upsert "
                  f"in id order, {id_order_rate:,.0f} rows/s)",
                  flush=True)  # fmt: skip
            measured = {
                "COPY of text": text_cpu,
                "COPY of tuples": copy_cpu,
                "service insert": insert["cpu"],
                "hand-written upsert": upsert_cpu,
                "service upsert": upsert["cpu"],
                "upsert in id order": id_order_cpu,
            }
            for name, cpu in measured.items():
                print(f"         {name:<20} {cpu_line(cpu)}", flush=True)
            threads = insert["cpu"]["service_threads_cpu"]
            print("         service insert's threads, µs a row: "
                  + ", ".join(f"{k} {v * 1e6 / args.records:.2f}" for k, v in threads.items())
                  + f"; alone here: decode {parts['decode_us_per_row']}, format COPY text "
                  f"{parts['format_us_per_row']}", flush=True)  # fmt: skip
            if before is not None and before_upsert is not None:
                done["baseline_insert"], done["baseline_upsert"] = before, before_upsert
                print(f"         baseline tree's insert {before['rows_per_second']:,} rows/s, "
                      f"upsert {before_upsert['rows_per_second']:,} rows/s")  # fmt: skip
        baseline: dict[str, Any] = {}
        if base is not None:
            baseline["tree"] = str(base)
            baseline["commit"] = _tree_commit(base)
            inserts = [r["baseline_insert"]["rows_per_second"] for r in rounds]
            baseline["insert_rows_per_second"] = round(median(inserts))
            upserts = [r["baseline_upsert"]["rows_per_second"] for r in rounds]
            baseline["upsert_rows_per_second"] = round(median(upserts))
            # Each round's own ratio, the two trees run next to each other, then their median:
            # the machine's drift between rounds cancels out of it, as for the other ratios.
            for mode in ("insert", "upsert"):
                ratios = [
                    r[mode]["rows_per_second"] / r[f"baseline_{mode}"]["rows_per_second"]
                    for r in rounds
                ]
                baseline[f"{mode}_ratios"] = [round(x, 3) for x in ratios]
                baseline[f"{mode}_ratio_of_rounds"] = round(median(ratios), 3)
            print(f"this tree / baseline tree, the median of the rounds' own ratios: insert "
                  f"{baseline['insert_ratio_of_rounds']}x {baseline['insert_ratios']}, upsert "
                  f"{baseline['upsert_ratio_of_rounds']}x {baseline['upsert_ratios']}")  # fmt: skip
        latency = latency_run(stack, args.rate, args.seconds, scratch)

    text_rate = median(r["text_copy_rows_per_second"] for r in rounds)
    text_ratio = median(r["insert_ratio_to_text_copy"] for r in rounds)
    copy_rate = median(r["raw_copy_rows_per_second"] for r in rounds)
    consume_rate = median(r["raw_consume_records_per_second"] for r in rounds)
    insert = median_run(rounds, "insert")
    insert_ratio = median(r["insert_ratio_to_copy"] for r in rounds)
    raw_upsert_rate = median(r["raw_upsert_rows_per_second"] for r in rounds)
    upsert = median_run(rounds, "upsert")
    upsert_ratio = median(r["upsert_ratio_to_raw_upsert"] for r in rounds)
    id_order_upsert_rate = median(r["raw_upsert_id_order_rows_per_second"] for r in rounds)
    id_order_ratio = median(r["upsert_ratio_to_raw_upsert_id_order"] for r in rounds)
    print(f"(a) COPY of text formatted beforehand     : {text_rate:>10,.0f} rows/s (median)")
    print(f"    COPY of ready-made tuples (reference) : {copy_rate:>10,.0f} rows/s (median)")
    print(f"(b) raw read_committed consumption        : {consume_rate:>10,.0f} records/s (median)")
    for run, ratio in ((insert, text_ratio), (upsert, upsert["rows_per_second"] / text_rate)):
        print(
            f"(c) service, {run['mode']:<6}                       : "
            f"{run['rows_per_second']:>10,} rows/s  = {ratio:.2f}x COPY of text, "
            f"{run['rows_per_second'] / consume_rate:.2f}x consumption"
            f"  (peak RSS {run['peak_rss_mb']} MB)"
        )
    print("    insert's ratio is the median of the rounds' own ratios: "
          + ", ".join(f"{r['insert_ratio_to_text_copy']}x" for r in rounds)
          + f"; to COPY of tuples {insert_ratio:.2f}x ("
          + ", ".join(f"{r['insert_ratio_to_copy']}x" for r in rounds) + ")")  # fmt: skip
    print(f"(e) hand-written upsert (staged COPY)     : {raw_upsert_rate:>10,.0f} rows/s (median); "
          f"service upsert = {upsert_ratio:.2f}x of it (median of the rounds' ratios: "
          + ", ".join(f"{r['upsert_ratio_to_raw_upsert']}x" for r in rounds) + ")")  # fmt: skip
    print("    its rows as they arrive from the topic, each batch sorted by key; the same upsert "
          f"of the rows in id order, as no consumer receives them: {id_order_upsert_rate:,.0f} "
          f"rows/s, service = {id_order_ratio:.2f}x of it")  # fmt: skip
    if baseline:
        before_insert = baseline["insert_rows_per_second"]
        before_upsert = baseline["upsert_rows_per_second"]
        baseline["insert_ratio"] = round(insert["rows_per_second"] / before_insert, 3)
        baseline["upsert_ratio"] = round(upsert["rows_per_second"] / before_upsert, 3)
        print(
            f"baseline tree {baseline['tree']}: insert {before_insert:,} rows/s (median), "
            f"upsert {before_upsert:,} rows/s; this tree / baseline: insert "
            f"{baseline['insert_ratio']}x, upsert {baseline['upsert_ratio']}x"
        )
    print(
        f"(d) latency at {latency['offered_per_second']:,} records/s offered: "
        f"p50 {latency['p50_ms']} ms, p99 {latency['p99_ms']} ms (max {latency['max_ms']} ms)"
    )
    print("goals: insert >= 0.6x COPY of text, upsert >= 0.9x the hand-written "
          "upsert, p99 < 200 ms, peak RSS < 200 MB")  # fmt: skip
    path = write_results("consumer", {
        "records": args.records,
        "text_copy_rows_per_second": round(text_rate),
        "raw_copy_rows_per_second": round(copy_rate),
        "raw_consume_records_per_second": round(consume_rate),
        "insert": insert | {"ratio_to_text_copy": round(text_ratio, 3),
                            "ratio_to_copy": round(insert_ratio, 3),
                            "ratio_to_consume": round(insert["rows_per_second"] / consume_rate, 3)},
        "raw_upsert_rows_per_second": round(raw_upsert_rate),
        "raw_upsert_id_order_rows_per_second": round(id_order_upsert_rate),
        "upsert": upsert | {"ratio_to_text_copy": round(upsert["rows_per_second"] / text_rate, 3),
                            "ratio_to_raw_upsert": round(upsert_ratio, 3),
                            "ratio_to_raw_upsert_id_order": round(id_order_ratio, 3),
                            "ratio_to_consume": round(upsert["rows_per_second"] / consume_rate, 3)},
        "rounds": rounds,
        "warm_up": warm_up,
        "latency": latency,
        "baseline": baseline,
        "clock": "from holding every partition (offsets table) to the topic's end applied",
        "goals": {"insert_ratio_to_text_copy": 0.6, "upsert_ratio_to_raw_upsert": 0.9,
                  "p99_ms": 200, "peak_rss_mb": 200},
    })  # fmt: skip
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
