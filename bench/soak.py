"""The soak: the whole pipeline under random faults for `--minutes`, then an exact account.

    python -m bench.soak --minutes 60

Runs, each a real process: PostgreSQL, one Kafka broker, Toxiproxy in front of both, the Spark
producer job (`bridge produce` on the rate source, an epoch every `--trigger`), and two
consumer instances in one group, each under a supervisor that restarts it when it exits. A
scheduler injects one fault at a time from every class in `bench/soak_faults.py`, a few seconds
apart. At the end it heals everything, stops the producer, lets the consumers drain, and checks
(`bench/soak_checks.py`), without asking the service anything: every id Kafka committed is in
PostgreSQL exactly once, Kafka itself holds each id once with no hole, no record of an aborted
transaction reached the table, the dead letters are exactly the poison records, and no stored
offset ever moved backwards. It prints a table and writes `bench/results/soak-*.json`.

Exit status: 0 when the account is exact (and no stall beyond a fault exceeded `--max-stall`),
1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import psycopg
import yaml
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.common import RESULTS, write_results
from bench.soak_checks import (
    KafkaTimeline,
    Progress,
    committed_in_kafka,
    epoch_in_flight,
    longest_stall,
    rate_rows_committed,
    rates,
    verdict,
)
from bench.soak_faults import CATALOGUE, Fault, Pipeline, heal_everything
from bench.soak_processes import Supervised, Supervisor, wait_for
from bridge.kafka_admin import KafkaAdmin, create_topic
from bridge_shell.stack.kafka import KafkaPorts, KafkaServer, new_cluster_id
from bridge_shell.stack.postgres import PostgresServer
from bridge_shell.stack.process import free_port
from tests.toxiproxy import Toxiproxy, toxiproxy_binary

TOPIC = "soak"
PARTITIONS = 3
TABLE = "public.soak_rows"
GROUP = "soak"
STATE_SCHEMA = "soak_state"
ROLE = "bridge_soak"  # the consumers' role: not a superuser, so a connection limit binds it
TRANSACTION_TIMEOUT_MS = 20_000
# What a user tunes for faster failover than Kafka's 45 s default: a dead member's partitions
# wait this long before the group hands them on.
CONSUMER_KAFKA = {"session.timeout.ms": 15_000, "heartbeat.interval.ms": 3_000}


@dataclass(frozen=True)
class Options:
    minutes: float
    seed: int
    rows_per_second: int
    trigger: str
    gap_s: tuple[float, float]
    max_stall_s: float
    results_dir: Path
    keep: bool
    # The sink's and the route's: "default" names none (whole epochs, as "whole").
    epochs: str = "default"


def parse(
    argv: list[str] | None,
    *,
    prog: str = "python -m bench.soak",
    description: str = __doc__.split("\n")[0],
    gap: tuple[float, float] = (2.0, 6.0),
) -> Options:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long faults are injected")
    parser.add_argument("--seed", type=int, default=None, help="for the fault schedule")
    parser.add_argument("--rows-per-second", type=int, default=300)
    parser.add_argument("--trigger", default="2 seconds", help="the producer's epoch interval")
    parser.add_argument(
        "--gap", type=float, nargs=2, default=gap, metavar=("MIN", "MAX"),
        help="seconds between one fault's end and the next one's start",
    )  # fmt: skip
    parser.add_argument(
        "--max-stall", type=float, default=60.0,
        help="longest stall beyond a fault that still passes, in seconds",
    )  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    parser.add_argument(
        "--epochs", choices=["default", "per-partition", "whole"], default="default",
        help="default: neither the sink nor the route names it, and gets whole epochs, as "
        "whole does; with whole epochs a reader polls the table for part of an epoch all "
        "through the run",
    )  # fmt: skip
    args = parser.parse_args(argv)
    return Options(
        minutes=args.minutes,
        seed=args.seed if args.seed is not None else int(time.time()),
        rows_per_second=args.rows_per_second,
        trigger=args.trigger,
        gap_s=(args.gap[0], args.gap[1]),
        max_stall_s=args.max_stall,
        results_dir=args.results_dir,
        keep=args.keep,
        epochs=args.epochs,
    )


def say(message: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} {message}", flush=True)


Target = TypeVar("Target")
Injector = Callable[[Target, random.Random], tuple[str, str]]  # -> (kind, detail), once healed


class SoakRun(ABC):
    """What every soak shares: its options, fault schedule, work directory and notes, and the
    loop that injects one random fault after another."""

    work_prefix = "bridge-soak-"

    def __init__(self, options: Options) -> None:
        self.options = options
        self.rng = random.Random(options.seed)  # noqa: S311 - a fault schedule, not a secret
        self.work = Path(tempfile.mkdtemp(prefix=self.work_prefix))
        self.work.chmod(0o755)  # the postgres user must reach its data directory
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)
        say(message)

    def run(self) -> dict[str, Any]:
        with temporary_files_in(self.work / "tmp"):
            return self._run()

    @abstractmethod
    def _run(self) -> dict[str, Any]: ...

    def inject_faults(
        self,
        catalogue: Mapping[str, Injector[Target]],
        target: Target,
        heal: Callable[[Target], None],
    ) -> list[Fault]:
        """Faults of random classes for `--minutes`, `--gap` apart, each healed before the next;
        one that fails to inject is noted, everything healed, and the loop goes on."""
        deadline = time.monotonic() + self.options.minutes * 60
        faults: list[Fault] = []
        classes = sorted(catalogue)
        say(f"flowing; injecting faults for {self.options.minutes:g} min")
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(*self.options.gap_s))
            cls = self.rng.choice(classes)
            fault = Fault(cls=cls, kind="", started=time.monotonic())
            try:
                fault.kind, fault.detail = catalogue[cls](target, self.rng)
            except Exception as exc:  # noqa: BLE001 - the harness's own trouble, healed and noted
                self.note(f"injecting {cls} failed: {exc!r}; healing and going on")
                heal(target)
                continue
            fault.healed = time.monotonic()
            faults.append(fault)
            say(f"#{len(faults)} {fault.cls}/{fault.kind}: {fault.detail}")
        heal(target)
        return faults


class Soak(SoakRun):
    def _run(self) -> dict[str, Any]:
        toxiproxy = Toxiproxy(toxiproxy_binary(), self.work / "toxiproxy.log")
        postgres = PostgresServer(home=self.work / "postgres", port=free_port())
        broker, controller, front = free_port(), free_port(), free_port()
        kafka = KafkaServer(
            home=self.work / "kafka",
            ports=KafkaPorts(broker=broker, controller=controller, advertised=front),
            cluster_id=new_cluster_id(),
        )
        supervisor: Supervisor | None = None
        progress: Progress | None = None
        pipeline: Pipeline | None = None
        passed = False
        try:
            kafka_proxy = toxiproxy.proxy(
                "kafka", f"127.0.0.1:{broker}", listen=f"127.0.0.1:{front}"
            )
            kafka.start()
            postgres.start()
            postgres_proxy = toxiproxy.proxy("postgres", f"127.0.0.1:{postgres.port}")
            kafka.wait_ready(120)
            bootstrap = kafka_proxy.listen
            create_topic(bootstrap, TOPIC, partitions=PARTITIONS)
            prepare_database(postgres.dsn)
            consumer_dsn = make_conninfo(postgres.dsn, user=ROLE, port=postgres_proxy.port)
            driver = self._driver(bootstrap)
            consumers = [
                consumer_process(self.work, name, bootstrap, consumer_dsn) for name in ("a", "b")
            ]
            supervisor = Supervisor([driver, *consumers], self.note)
            pipeline = Pipeline(
                kafka=kafka, postgres=postgres, kafka_proxy=kafka_proxy,
                postgres_proxy=postgres_proxy, driver=driver, consumers=consumers,
                supervisor=supervisor, admin_dsn=postgres.dsn, consumer_role=ROLE, table=TABLE,
                topic=TOPIC, bootstrap=bootstrap, note=self.note,
            )  # fmt: skip
            supervisor.start()
            progress = Progress(postgres.dsn, STATE_SCHEMA, GROUP)
            progress.start()
            say(f"pipeline starting in {self.work}; seed {self.options.seed}")
            if not wait_for(lambda: rows_written(postgres.dsn) > 0, timeout=300):
                raise RuntimeError(f"no row reached PostgreSQL in 300 s; logs in {self.work}")
            figures = self._soak_and_check(pipeline, progress)
            passed = bool(figures["ok"])
            return figures
        finally:
            if progress is not None:
                progress.close()
            if supervisor is not None:
                supervisor.close()
                for process in supervisor.processes:
                    process.held = True
                    process.resume()
                    process.kill()
            if pipeline is not None:
                try:
                    heal_everything(pipeline)
                except Exception as exc:  # noqa: BLE001 - tearing down regardless
                    say(f"healing at teardown failed: {exc}")
            kafka.stop()
            postgres.stop()
            toxiproxy.stop()
            if self.options.keep or not passed:  # the logs of a failed run are the evidence
                say(f"work directory kept: {self.work}")
            else:
                shutil.rmtree(self.work, ignore_errors=True)

    # -- the run --------------------------------------------------------------------------------

    def _soak_and_check(self, p: Pipeline, progress: Progress) -> dict[str, Any]:
        started = time.monotonic()
        kafka = KafkaTimeline(p.bootstrap, TOPIC, PARTITIONS)
        kafka.start()
        faults = self.inject_faults(CATALOGUE, p, heal_everything)
        return account(
            Ending(
                options=self.options, driver=p.driver, consumers=p.consumers,
                supervisor=p.supervisor, bootstrap=p.bootstrap, admin_dsn=p.admin_dsn,
                checkpoint=self.work / "checkpoint", poison=p.poison, aborted=p.aborted_values,
                progress=progress, kafka=kafka, faults=faults, started=started, note=self.note,
                notes=self.notes,
            )
        )  # fmt: skip

    # -- set-up ---------------------------------------------------------------------------------

    def _driver(self, bootstrap: str) -> Supervised:
        argv = [
            sys.executable, "-m", "bridge_shell.cli", "produce", "--source", "rate",
            "--rows-per-second", str(self.options.rows_per_second),
            "--trigger", self.options.trigger, "--topic", TOPIC, "--key-field", "value",
            "--checkpoint", str(self.work / "checkpoint"),
            "--stack-dir", str(self.work / "no-stack"), "--bootstrap-servers", bootstrap,
            "--transaction-timeout-ms", str(TRANSACTION_TIMEOUT_MS),
            *sink_epochs(self.options.epochs),
        ]  # fmt: skip
        return Supervised("driver", argv, self.work / "driver.log", pipeline_env())


def whole_epochs(epochs: str) -> bool:
    """Whether a run with the soak's `--epochs` publishes whole epochs (the default does)."""
    return epochs != "per-partition"


def sink_epochs(epochs: str) -> list[str]:
    """`bridge produce`'s option for the soak's `--epochs`: none for the default."""
    return [] if epochs == "default" else ["--epochs", epochs]


@contextmanager
def temporary_files_in(directory: Path) -> Iterator[None]:
    """What the run's processes put in the temporary directory (Spark's blocks and unpacked
    executor environments, JVM helper libraries) lands in `directory`, removed with the run:
    killed JVMs never clean up after themselves. Children inherit TMPDIR, and java.io.tmpdir,
    Spark's default spark.local.dir, through JAVA_TOOL_OPTIONS; both are restored at the end,
    for a caller that goes on (the tests)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o1777)  # like /tmp: PostgreSQL runs as its own user
    saved = {name: os.environ.get(name) for name in ("TMPDIR", "JAVA_TOOL_OPTIONS")}
    os.environ["TMPDIR"] = str(directory)
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(
        filter(None, [saved["JAVA_TOOL_OPTIONS"], f"-Djava.io.tmpdir={directory}"])
    )
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def pipeline_env() -> dict[str, str]:
    """The pipeline's processes take no settings from this shell's BRIDGE_* variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}


def prepare_database(dsn: str) -> None:
    """The consumer's role, and the table; its `epoch_no` is the sink's epoch of each row
    (a metadata column), which the whole-epochs reader counts by."""
    role = sql.Identifier(ROLE)
    database = sql.Identifier(str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
        conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(database, role))
        conn.execute(
            f'CREATE TABLE {TABLE} (value bigint NOT NULL, "timestamp" timestamptz, '
            "epoch_no bigint)".encode()
        )
        conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.SQL(TABLE), role))


def consumer_process(
    work: Path, name: str, bootstrap: str, dsn: str, *, epochs: str = "default"
) -> Supervised:
    """One consumer instance of the soak's group, as its supervisor runs it; `epochs`: the
    route's, or "default" for none named."""
    named = {} if epochs == "default" else {"epochs": epochs}
    config = work / f"consumer-{name}.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap, "properties": CONSUMER_KAFKA},
        "postgres": {"dsn": dsn},
        "consumer": {
            "group_id": GROUP, "state_schema": STATE_SCHEMA,
            "routes": [{"topic": TOPIC, "table": TABLE, **named,
                        "metadata": {"epoch_no": "spark.epoch"}}],
            "db_session_timeout_ms": 10_000, "http_port": 0,
        },
    }))  # fmt: skip
    argv = [sys.executable, "-m", "consumers", "--config", str(config)]
    return Supervised(f"consumer-{name}", argv, work / f"consumer-{name}.log", pipeline_env())


@dataclass
class Ending:
    """What the account at the end of a soak needs, the single-node one's or the cluster's."""

    options: Options
    driver: Supervised
    consumers: list[Supervised]
    supervisor: Supervisor
    bootstrap: str
    admin_dsn: str
    checkpoint: Path
    poison: set[tuple[int, int]]
    aborted: set[int]
    progress: Progress
    kafka: KafkaTimeline
    faults: list[Fault]
    started: float  # monotonic, when the faults began
    note: Callable[[str], None]
    notes: list[str]  # what `note` wrote


# What a failed drain prints of each process's log: the work directory, which holds them all,
# goes with the test session's temporary files, so the run's output must carry the evidence.
_EVIDENCE_LINES = 15
_LOUD = ('"level": "warning"', '"level": "error"', '"level": "critical"', " WARN ", " ERROR ")


def drain_evidence(end: Ending) -> list[str]:
    """Why the consumers may not have drained: the group's open epochs and what each lacks,
    then the last warnings and errors of each consumer's log and of the driver's."""
    from consumers import LedgerNames, open_epochs

    lines: list[str] = []
    try:
        with psycopg.connect(end.admin_dsn, connect_timeout=10) as conn:
            states = open_epochs(conn, LedgerNames(STATE_SCHEMA), GROUP)
        lines += [f"open: {state.describe(lambda _topic: True)}" for state in states[:10]]
        lines.append(f"{len(states)} open epoch(s)")
    except psycopg.Error as exc:
        lines.append(f"the ledger could not be read: {exc}")
    for process in [*end.consumers, end.driver]:
        try:
            text = process.log.read_text(errors="replace").splitlines()
        except OSError as exc:
            lines.append(f"{process.name}: {exc}")
            continue
        loud = [line for line in text if any(mark in line for mark in _LOUD)]
        lines += [f"{process.name}: {line[:400]}" for line in loud[-_EVIDENCE_LINES:]]
    return lines


def account(end: Ending) -> dict[str, Any]:
    """After the last fault is healed: the flow's last stretch, the producer stopped, the
    consumers drained, and every id counted in Kafka and in PostgreSQL."""
    options, faults, started = end.options, end.faults, end.started
    time.sleep(15)  # the flow after the last fault counts for stalls too
    flow_end = time.monotonic()
    stall = longest_stall(end.progress.moves, faults, started, flow_end)

    code = end.driver.stop(timeout=120)
    say(f"producer stopped (exit {code})")
    if whole_epochs(options.epochs) and epoch_in_flight(end.checkpoint):
        # Stopped mid-epoch (the graceful stop's bound passed, or a kill): its tasks may have
        # committed without the driver's epoch record, so whole epochs hold it, by design,
        # until the query runs again and Spark replays it. A user's supervisor restarts the
        # job; so does the soak, before judging, so that its verdict is about the product.
        end.note("the query stopped mid-epoch; run again so that Spark replays the epoch")
        end.driver.start()
        replayed = wait_for(lambda: not epoch_in_flight(end.checkpoint), timeout=300, interval=1)
        code = end.driver.stop(timeout=120)
        say(f"producer run again and stopped (exit {code}, epoch replayed: {replayed})")
    settled = wait_for(lambda: _transactions_settled(end.bootstrap), timeout=120, interval=1)
    if not settled:
        end.note("a transaction was still open 120 s after the producer stopped")
    kafka_ids, kafka_others = committed_in_kafka(end.bootstrap, TOPIC, PARTITIONS)
    committed = sum(kafka_ids.values()) + len(kafka_others)
    drained = wait_for(lambda: rows_written(end.admin_dsn) >= committed, timeout=300, interval=1)
    if not drained:
        end.note(f"consumers did not drain in 300 s: {rows_written(end.admin_dsn)} of {committed}")
        for line in drain_evidence(end):
            say(f"  {line}")
    time.sleep(5)  # a late duplicate would show now
    for consumer in end.consumers:
        consumer.stop(timeout=60)
    end.kafka.close()
    complete_below = rate_rows_committed(end.checkpoint, options.rows_per_second)
    result = verdict(
        dsn=end.admin_dsn, table=TABLE, schema=STATE_SCHEMA, group=GROUP, topic=TOPIC,
        kafka_ids=kafka_ids, kafka_others=kafka_others, poison=end.poison, aborted=end.aborted,
        complete_below=complete_below,
    )  # fmt: skip
    by_class = Counter(f.cls for f in faults)
    by_kind = Counter(f"{f.cls}/{f.kind}" for f in faults)
    return {
        "minutes": options.minutes,
        "seed": options.seed,
        "rows_per_second": options.rows_per_second,
        "trigger": options.trigger,
        "faults": len(faults),
        "faults_by_class": dict(sorted(by_class.items())),
        "faults_by_kind": dict(sorted(by_kind.items())),
        "produced": result.produced,
        "epochs_complete_below": result.epochs_complete_below,
        "lost": result.lost,
        "doubled": result.doubled,
        "kafka_doubled": result.kafka_doubled,
        "kafka_gaps": result.kafka_gaps,
        "aborted_in_table": result.aborted_in_table,
        "aborted_records": len(end.aborted),
        "dead_letters_expected": result.dead_letters_expected,
        "dead_letters_found": result.dead_letters_found,
        "dead_letters_wrong": result.dead_letters_wrong,
        "offsets_backwards": end.progress.backwards,
        "longest_stall_s": round(stall, 1),
        "drained": drained,
        "restarts_by_supervisor": {
            proc.name: proc.exits for proc in end.supervisor.processes if proc.exits
        },
        "consumer_kafka_properties": CONSUMER_KAFKA,
        "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
        "notes": end.notes,
        "fault_log": [f.as_json(started) for f in faults],
        # Records per second into Kafka (last stable offsets) and into PostgreSQL (stored
        # offsets), [seconds since the faults began, rate], for the timeline plot.
        "timeline": {
            "kafka": rates(end.kafka.timeline, started),
            "postgres": rates(end.progress.timeline, started),
        },
        "ok": result.ok and drained and not end.progress.backwards
        and stall <= options.max_stall_s,
    }  # fmt: skip


class EpochReader:
    """Polls the table all through a run: how many rows of each epoch a reader sees, each time.
    At the end, a sight of an epoch with fewer rows than it ends with was part of an epoch."""

    def __init__(self, dsn: str, every_s: float = 0.05) -> None:
        self._dsn, self._every_s = dsn, every_s
        self.seen: set[tuple[int, int]] = set()  # (epoch, rows) pairs
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True, connect_timeout=3) as conn:
                    while not self._stop.wait(self._every_s):
                        rows = conn.execute(
                            f"SELECT epoch_no, count(*) FROM {TABLE} GROUP BY epoch_no"
                        ).fetchall()
                        self.seen.update((int(e), int(n)) for e, n in rows if e is not None)
                        self.polls += 1
            except psycopg.Error:
                self._stop.wait(1)  # the database's link is cut by a fault: read again after

    def partial(self) -> list[tuple[int, int, int]]:
        """(epoch, rows seen, rows at the end) of every sight of part of an epoch."""
        self._stop.set()
        self._thread.join(10)
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            rows = conn.execute(f"SELECT epoch_no, count(*) FROM {TABLE} GROUP BY epoch_no")
            final: dict[int, int] = {int(e): int(n) for e, n in rows if e is not None}
        return sorted((e, n, final.get(e, 0)) for e, n in self.seen if n != final.get(e, 0))


def rows_written(dsn: str) -> int:
    """Rows in the target table plus dead letters: what the consumers have written."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            row = conn.execute(
                f"SELECT (SELECT count(*) FROM {TABLE}) + "
                f"(SELECT count(*) FROM {STATE_SCHEMA}.dead_letters)"
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    except psycopg.OperationalError:
        return -1
    return int(row[0]) if row else 0


def _transactions_settled(bootstrap: str) -> bool:
    """No transaction open on any partition: a read_committed reader then sees everything."""
    admin = KafkaAdmin({"bootstrap.servers": bootstrap}, timeout=10)
    ranges = admin.log_ranges((TOPIC, p) for p in range(PARTITIONS))
    return all(r.last_stable == r.high_watermark for r in ranges.values())


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"soak: {figures['minutes']:g} min, seed {figures['seed']}, "
        f"{figures['produced']} ids produced",
        f"{'faults injected':<28}{figures['faults']:>8}",
        *(f"  {cls:<26}{n:>8}" for cls, n in figures["faults_by_class"].items()),
        f"{'rows lost':<28}{figures['lost']:>8}",
        f"{'rows doubled':<28}{figures['doubled']:>8}",
        f"{'ids doubled in Kafka':<28}{figures['kafka_doubled']:>8}",
        f"{'ids missing in Kafka':<28}{figures['kafka_gaps']:>8}",
        f"{'aborted ids in the table':<28}{figures['aborted_in_table']:>8}",
        f"{'dead letters (expected)':<28}{figures['dead_letters_found']:>8} "
        f"({figures['dead_letters_expected']}, {figures['dead_letters_wrong']} wrong)",
        f"{'offsets moved backwards':<28}{len(figures['offsets_backwards']):>8}",
        f"{'longest stall beyond a fault':<28}{figures['longest_stall_s']:>7}s",
        f"{'verdict':<28}{'OK' if figures['ok'] else 'FAILED':>8}",
    ]
    return "\n".join(lines)


def stop_on_signals() -> None:
    """SIGTERM and SIGINT end the run through its clean-up, which stops every process it
    started (a background job's SIGINT may be ignored: SIGTERM always works)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    stop_on_signals()
    figures = Soak(options).run()
    print(report(figures))
    path = write_results("soak", figures, directory=options.results_dir)
    print(f"figures written to {path}")
    print(json.dumps({k: figures[k] for k in ("faults", "lost", "doubled", "longest_stall_s")}))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
