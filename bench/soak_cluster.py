"""The cluster soak: the pipeline on the cluster topology under random faults, then the same exact
account as the single-node soak (`bench/soak.py`).

    python -m bench.soak_cluster --minutes 30

Runs, each a real process: three KRaft Kafka nodes (three replicas, two in sync, as `bridge
stack up --brokers 3` runs them), each behind its own Toxiproxy (the address it advertises, so
clients and the other brokers' replica fetchers all go through it); a Spark standalone master and
two workers of 2 cores; the producer job on that cluster (`bridge produce --master spark://...`,
the rate source, an epoch every `--trigger`) under a supervisor; two consumer instances of one
group, each supervised; PostgreSQL behind a proxy. One fault at a time, from these classes:

- `broker-kill`: SIGKILL of the node leading the transaction log partition of an id the sink uses
  now (its transaction coordinator), of the leader of a data partition, or of any node; down
  for 3-20 s, then started again and waited for until every partition is fully in sync;
- `executor-kill`: SIGKILL of one executor JVM (Spark starts another; the task is retried and
  fences the dead attempt's transaction);
- `worker-lost`: a worker daemon and its executors SIGKILLed together, as when a machine goes;
  back after 5-20 s;
- `driver-kill`: the driver (its Python and JVM) SIGKILLed; its supervisor starts it again after
  1-8 s and it resumes from its checkpoint;
- `consumer-kill`: a consumer SIGKILLed; restarted after 1-8 s;
- `kafka-link` / `postgres-link`: one broker's link (or every broker's) silent without a reset,
  reset, or slowed; the database's link the same.

A fault's window lasts until what it broke is back (a node in sync, a worker registered, a
driver that committed an epoch again): the longest stall is then what no fault explains.
Writes bench/results/soak-cluster-*.json, with the timeline of records per second into Kafka and
into PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from psycopg.conninfo import make_conninfo

from bench.common import write_results
from bench.soak import (
    GROUP,
    PARTITIONS,
    ROLE,
    STATE_SCHEMA,
    TOPIC,
    TRANSACTION_TIMEOUT_MS,
    Ending,
    EpochReader,
    Options,
    SoakRun,
    account,
    consumer_process,
    pipeline_env,
    prepare_database,
    report,
    rows_written,
    say,
    sink_epochs,
    stop_on_signals,
    whole_epochs,
)
from bench.soak import parse as parse_soak
from bench.soak_checks import KafkaTimeline, Progress
from bench.soak_faults import cut, restart_postgres
from bench.soak_processes import Supervised, Supervisor, wait_for
from bridge.kafka_admin import create_topic
from bridge_shell.stack.kafka import KafkaPorts, KafkaServer, new_cluster_id, stop_kafka_nodes
from bridge_shell.stack.postgres import PostgresServer
from bridge_shell.stack.process import free_port
from bridge_shell.stack.spark import DaemonPorts, SparkCluster
from tests.kafka_helpers import TRANSACTION_LOG_PARTITIONS, coordinator_partition
from tests.toxiproxy import Proxy, Toxiproxy, toxiproxy_binary

NODES = 3
WORKERS = 2
PREFIX = "soak-cluster"  # the sink's transactional id prefix: its ids are PREFIX-p<P>-e<E>
IN_SYNC_TOPICS = (TOPIC, "__transaction_state", "__consumer_offsets")


@dataclass
class Cluster:
    """What the faults act on."""

    nodes: list[KafkaServer]
    proxies: list[Proxy]  # one per node, in node order
    spark: SparkCluster
    postgres: PostgresServer
    postgres_proxy: Proxy
    driver: Supervised
    consumers: list[Supervised]
    supervisor: Supervisor
    bootstrap: str
    checkpoint: Path
    note: Callable[[str], None]
    admin: AdminClient = field(init=False)

    def __post_init__(self) -> None:
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})

    def leader_of(self, topic: str, partition: int) -> int | None:
        try:
            metadata = self.admin.list_topics(topic, timeout=5)
        except Exception:  # noqa: BLE001 - no answer: any node will do
            return None
        leader = metadata.topics[topic].partitions[partition].leader
        return leader if leader > 0 else None

    def in_sync(self) -> bool:
        """Every partition of the data topic and of Kafka's own topics led and fully in sync."""
        try:
            metadata = self.admin.list_topics(timeout=5)
        except Exception:  # noqa: BLE001 - not yet
            return False
        for name in IN_SYNC_TOPICS:
            topic = metadata.topics.get(name)
            if topic is None:
                continue
            for partition in topic.partitions.values():
                if partition.leader < 0 or len(partition.isrs) < NODES:
                    return False
        return True

    def current_epoch(self) -> int:
        """The epoch the query works on now: the newest in its offset log."""
        found = [int(p.name) for p in (self.checkpoint / "offsets").glob("[0-9]*")]
        return max(found, default=0)

    def committed_since(self, when: float) -> bool:
        """Whether the query committed an epoch after `when` (wall clock)."""
        return any(p.stat().st_mtime > when for p in (self.checkpoint / "commits").glob("[0-9]*"))


# -- faults ---------------------------------------------------------------------------------------


def _kill_broker(c: Cluster, rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["coordinator", "leader", "any"])
    node_id: int | None = None
    if kind == "coordinator":
        epoch = c.current_epoch() + rng.choice([0, 1])  # the epoch running, or the next one
        txn_id = f"{PREFIX}-p{rng.randrange(PARTITIONS)}-e{epoch}"
        log_partition = coordinator_partition(txn_id, TRANSACTION_LOG_PARTITIONS)
        node_id = c.leader_of("__transaction_state", log_partition)
        what = f"coordinator of {txn_id}"
    elif kind == "leader":
        partition = rng.randrange(PARTITIONS)
        node_id = c.leader_of(TOPIC, partition)
        what = f"leader of {TOPIC}[{partition}]"
    else:
        what = "a node"
    if node_id is None:
        node_id = rng.randint(1, NODES)
        what += " (unknown: a node at random)"
    node = c.nodes[node_id - 1]
    down = rng.uniform(3, 20)
    node.kill()
    wait_for(lambda: not node.running(), timeout=30)
    time.sleep(down)
    node.start()
    node.wait_ready(timeout=180)
    synced = wait_for(c.in_sync, timeout=180, interval=1)
    return f"kill-{kind}", (
        f"node {node_id}, {what}, down {down:.1f}s; "
        + ("back in sync" if synced else "NOT back in sync after 180 s")
    )


def _kill_executor(c: Cluster, rng: random.Random) -> tuple[str, str]:
    executors = c.spark.executor_pids()
    if not executors:
        return "kill-executor", "no executor running (the driver is starting): none killed"
    victim = rng.choice(executors)
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        now = c.spark.executor_pids()
        return victim not in now and len(now) >= len(executors)

    back = wait_for(replaced, timeout=120)
    return "kill-executor", f"pid {victim} of {len(executors)}; " + (
        "replaced" if back else "not replaced in 120 s"
    )


def _lose_worker(c: Cluster, rng: random.Random) -> tuple[str, str]:
    number = rng.randrange(WORKERS)
    worker = c.spark.workers[number]
    executors = [
        pid
        for pid in c.spark.executor_pids()
        if Path(f"/proc/{pid}/cwd").resolve().is_relative_to(worker.home)
    ]
    down = rng.uniform(5, 20)
    worker.kill()  # the machine goes: its daemon and its executors at once
    for pid in executors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(down)
    c.spark.start()
    c.spark.wait_ready(timeout=180)
    return "worker-lost", f"worker {number + 1} with {len(executors)} executor(s), {down:.1f}s"


def _kill_driver(c: Cluster, rng: random.Random) -> tuple[str, str]:
    down = rng.uniform(1, 8)
    with c.supervisor.holding(c.driver):
        c.driver.kill()
        time.sleep(down)
        restarted = time.time()
    again = wait_for(lambda: c.committed_since(restarted), timeout=300, interval=1)
    return "kill-driver", f"down {down:.1f}s; " + (
        "committing again" if again else "no epoch committed in 300 s after its restart"
    )


def _kill_consumer(c: Cluster, rng: random.Random) -> tuple[str, str]:
    consumer = rng.choice(c.consumers)
    down = rng.uniform(1, 8)
    with c.supervisor.holding(consumer):
        consumer.kill()
        time.sleep(down)
    return "kill-consumer", f"{consumer.name} down {down:.1f}s"


def _kafka_link(c: Cluster, rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        number = rng.randrange(NODES)
        targets, whom = [c.proxies[number]], f"node {number + 1}"
    else:
        targets, whom = c.proxies, "every node"
    # Up to 35 s: beyond the producer's 20 s transaction timeout, which the broker then enforces.
    kind, detail = cut(targets, rng, longest_silence=35)
    synced = wait_for(c.in_sync, timeout=180, interval=1)
    return f"link-{kind}", f"{whom}: {detail}" + ("" if synced else "; NOT in sync after 180 s")


def _postgres_link(c: Cluster, rng: random.Random) -> tuple[str, str]:
    kind, detail = cut([c.postgres_proxy], rng, longest_silence=40)
    return f"link-{kind}", detail


CATALOGUE: dict[str, Callable[[Cluster, random.Random], tuple[str, str]]] = {
    "broker-kill": _kill_broker,
    "executor-kill": _kill_executor,
    "worker-lost": _lose_worker,
    "driver-kill": _kill_driver,
    "consumer-kill": _kill_consumer,
    "kafka-link": _kafka_link,
    "postgres-link": _postgres_link,
}


def heal_everything(c: Cluster) -> None:
    for proxy in [*c.proxies, c.postgres_proxy]:
        proxy.heal()
    for node in c.nodes:
        node.start()
    for process in (c.driver, *c.consumers):
        process.resume()
    if not c.postgres.running():
        restart_postgres(c.postgres)
    c.spark.start()
    for node in c.nodes:
        node.wait_ready(timeout=180)
    c.spark.wait_ready(timeout=180)


# -- the run --------------------------------------------------------------------------------------


class ClusterSoak(SoakRun):
    work_prefix = "bridge-soak-cluster-"

    def _run(self) -> dict[str, Any]:
        toxiproxy = Toxiproxy(toxiproxy_binary(), self.work / "toxiproxy.log")
        postgres = PostgresServer(home=self.work / "postgres", port=free_port())
        ports = [(free_port(), free_port(), free_port()) for _ in range(NODES)]
        voters = ",".join(f"{n}@127.0.0.1:{c}" for n, (_, c, _) in enumerate(ports, start=1))
        cluster_id = new_cluster_id()
        nodes = [
            KafkaServer(
                home=self.work / f"kafka-{n}",
                ports=KafkaPorts(broker=broker, controller=controller, advertised=front),
                cluster_id=cluster_id,
                node_id=n,
                voters=voters,
                cluster_size=NODES,
            )
            for n, (broker, controller, front) in enumerate(ports, start=1)
        ]
        spark = SparkCluster(
            home=self.work / "spark",
            master=DaemonPorts(rpc=free_port(), web_ui=free_port()),
            workers=[DaemonPorts(rpc=free_port(), web_ui=free_port()) for _ in range(WORKERS)],
            worker_cores=2,
            worker_memory="1g",
        )
        supervisor: Supervisor | None = None
        progress: Progress | None = None
        c: Cluster | None = None
        passed = False
        try:
            proxies = [
                toxiproxy.proxy(f"kafka-{n}", f"127.0.0.1:{b}", listen=f"127.0.0.1:{f}")
                for n, (b, _, f) in enumerate(ports, start=1)
            ]
            for node in nodes:
                node.start()
            postgres.start()
            spark.start()
            postgres_proxy = toxiproxy.proxy("postgres", f"127.0.0.1:{postgres.port}")
            for node in nodes:
                node.wait_ready(180)
            spark.wait_ready(180)
            bootstrap = ",".join(proxy.listen for proxy in proxies)
            create_topic(bootstrap, TOPIC, partitions=PARTITIONS)
            prepare_database(postgres.dsn)
            consumer_dsn = make_conninfo(postgres.dsn, user=ROLE, port=postgres_proxy.port)
            driver = self._driver(bootstrap, spark.master_url)
            consumers = [
                consumer_process(self.work, n, bootstrap, consumer_dsn, epochs=self.options.epochs)
                for n in ("a", "b")
            ]
            supervisor = Supervisor([driver, *consumers], self.note)
            c = Cluster(
                nodes=nodes, proxies=proxies, spark=spark, postgres=postgres,
                postgres_proxy=postgres_proxy, driver=driver, consumers=consumers,
                supervisor=supervisor, bootstrap=bootstrap, checkpoint=self.work / "checkpoint",
                note=self.note,
            )  # fmt: skip
            supervisor.start()
            progress = Progress(postgres.dsn, STATE_SCHEMA, GROUP)
            progress.start()
            say(f"cluster pipeline starting in {self.work}; seed {self.options.seed}")
            if not wait_for(lambda: rows_written(postgres.dsn) > 0, timeout=600):
                raise RuntimeError(f"no row reached PostgreSQL in 600 s; logs in {self.work}")
            figures = self._soak_and_check(c, progress, postgres.dsn)
            passed = bool(figures["ok"])
            return figures
        finally:
            if progress is not None:
                progress.close()
            if supervisor is not None:
                supervisor.close()
                for supervised in supervisor.processes:
                    supervised.held = True
                    supervised.resume()
                    supervised.kill()
            if c is not None:
                for proxy in [*c.proxies, c.postgres_proxy]:
                    with contextlib.suppress(Exception):
                        proxy.heal()
            spark.stop()
            stop_kafka_nodes(nodes)
            postgres.stop()
            toxiproxy.stop()
            if self.options.keep or not passed:  # the logs of a failed run are the evidence
                say(f"work directory kept: {self.work}")
            else:
                shutil.rmtree(self.work, ignore_errors=True)

    def _soak_and_check(self, c: Cluster, progress: Progress, admin_dsn: str) -> dict[str, Any]:
        started = time.monotonic()
        kafka = KafkaTimeline(c.bootstrap, TOPIC, PARTITIONS)
        kafka.start()
        reader = EpochReader(admin_dsn) if whole_epochs(self.options.epochs) else None
        faults = self.inject_faults(CATALOGUE, c, heal_everything)
        figures = account(
            Ending(
                options=self.options, driver=c.driver, consumers=c.consumers,
                supervisor=c.supervisor, bootstrap=c.bootstrap, admin_dsn=admin_dsn,
                checkpoint=c.checkpoint, poison=set(), aborted=set(), progress=progress,
                kafka=kafka, faults=faults, started=started, note=self.note, notes=self.notes,
            )
        )  # fmt: skip
        figures["epochs"] = self.options.epochs
        if reader is not None:
            partial = reader.partial()
            figures["reader_polls"] = reader.polls
            figures["partial_epochs_seen"] = len({epoch for epoch, _, _ in partial})
            figures["partial_sights"] = [list(p) for p in partial[:20]]
            figures["ok"] = figures["ok"] and not partial
        figures["topology"] = {
            "kafka_nodes": NODES, "replicas": NODES, "min_insync_replicas": 2,
            "spark_workers": WORKERS, "worker_cores": 2, "consumers": len(c.consumers),
        }  # fmt: skip
        return figures

    def _driver(self, bootstrap: str, master: str) -> Supervised:
        argv = [
            sys.executable, "-m", "bridge_shell.cli", "produce", "--source", "rate",
            "--rows-per-second", str(self.options.rows_per_second),
            "--trigger", self.options.trigger, "--topic", TOPIC, "--key-field", "value",
            "--checkpoint", str(self.work / "checkpoint"), "--master", master,
            "--transactional-id-prefix", PREFIX,
            "--stack-dir", str(self.work / "no-stack"), "--bootstrap-servers", bootstrap,
            "--transaction-timeout-ms", str(TRANSACTION_TIMEOUT_MS),
            *sink_epochs(self.options.epochs),
        ]  # fmt: skip
        return Supervised("driver", argv, self.work / "driver.log", pipeline_env())


def parse(argv: list[str] | None) -> Options:
    return parse_soak(
        argv, prog="python -m bench.soak_cluster", description=__doc__.split("\n")[0],
        gap=(0.5, 2.0),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    stop_on_signals()
    figures = ClusterSoak(options).run()
    print(report(figures))
    path = write_results("soak-cluster", figures, directory=options.results_dir)
    print(f"figures written to {path}")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
