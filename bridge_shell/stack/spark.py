"""A Spark standalone cluster on loopback: one master and N workers, each a JVM started with
`spark-class` from the PySpark installation, as Spark's own `sbin/start-*.sh` would start them.

Each daemon keeps its pid file and log under its own directory; each worker has its own work
directory, where its executors run and where their logs stay (`<worker>/work/<app>/<executor>`).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import ServerStartError, StackError
from bridge_shell.spark.spark_home import installed_spark_home, precompiled_spark_home
from bridge_shell.stack import process

ENV_WORKER_CORES = "BRIDGE_SPARK_WORKER_CORES"
ENV_WORKER_MEMORY = "BRIDGE_SPARK_WORKER_MEMORY"
_DAEMON_MEMORY = "256m"  # the master and the workers only schedule; executors have their own JVMs
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The Spark home the daemons run from: the compiled one (its executors' Python workers
    start faster, see bridge_shell/spark/spark_home.py), else the installed one."""
    try:
        home = precompiled_spark_home()
    except OSError:
        home = None
    home = home or installed_spark_home()
    if home is None:
        raise StackError("PySpark with its Spark home (bin/spark-class) is not installed")
    return home


@dataclass(frozen=True, kw_only=True)
class DaemonPorts:
    rpc: int
    web_ui: int


class SparkDaemon:
    """One master or worker JVM whose files live under `home`."""

    def __init__(self, *, home: Path, role: str, ports: DaemonPorts, args: list[str]) -> None:
        self.home = home
        self.role = role
        self.ports = ports
        self._args = args
        self.pid_path = home / "spark.pid"
        self.log_path = home / "daemon.log"

    @property
    def pid(self) -> int | None:
        return process.read_pid(self.pid_path)

    def running(self) -> bool:
        # The work/home directory is on the command line of both daemons: our marker.
        return process.alive(self.pid, str(self.home))

    def start(self) -> None:
        if self.running():
            return
        for port in (self.ports.rpc, self.ports.web_ui):
            if process.port_open("127.0.0.1", port):
                raise ServerStartError(f"Spark {self.role}", f"port {port} is already taken")
        self.home.mkdir(parents=True, exist_ok=True)
        home = spark_home()
        conf_dir = self.home / "conf"  # empty: no stray spark-defaults.conf from elsewhere
        conf_dir.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": _DAEMON_MEMORY,
            "SPARK_LOG_DIR": str(self.home),
            # A worker's scratch space (its executors' shuffle and block files), here rather
            # than in /tmp, so that the stack's directory holds all it writes.
            "SPARK_LOCAL_DIRS": str(self.home / "local"),
            # spark-class would otherwise print a warning per start about the missing scripts.
            "SPARK_NO_DAEMONIZE": "1",
        }
        argv = [str(home / "bin" / "spark-class"), *self._args]
        pid = process.spawn_detached(argv, log_path=self.log_path, cwd=self.home, env=env)
        self.pid_path.write_text(f"{pid}\n")

    def stop(self, *, grace: float = 15.0) -> None:
        pid = self.pid
        if pid is not None:
            process.terminate(pid, str(self.home), grace=grace)
        self.pid_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL, for fault-injection tests."""
        pid = self.pid
        if pid is not None:
            process.terminate(pid, str(self.home), grace=0)


class SparkCluster:
    """A standalone master and its workers, under `home` (`master/`, `worker-1/`, ...)."""

    def __init__(
        self,
        *,
        home: Path,
        master: DaemonPorts,
        workers: list[DaemonPorts],
        worker_cores: int | None = None,
        worker_memory: str | None = None,
    ) -> None:
        self.home = home
        self.master_ports = master
        cores = worker_cores or int(os.environ.get(ENV_WORKER_CORES, "2"))
        memory = worker_memory or os.environ.get(ENV_WORKER_MEMORY, "2g")
        self.master = SparkDaemon(
            home=home / "master",
            role="master",
            ports=master,
            args=[
                _MASTER_CLASS, "--host", "127.0.0.1", "--port", str(master.rpc),
                "--webui-port", str(master.web_ui), "--properties-file",
                str(home / "master" / "spark-daemon.conf"),
            ],
        )  # fmt: skip
        self.workers = [
            SparkDaemon(
                home=home / f"worker-{n}",
                role=f"worker {n}",
                ports=ports,
                args=self._worker_args(home / f"worker-{n}", ports, cores, memory),
            )
            for n, ports in enumerate(workers, start=1)
        ]

    def _worker_args(self, home: Path, ports: DaemonPorts, cores: int, memory: str) -> list[str]:
        return [
            _WORKER_CLASS, "--host", "127.0.0.1", "--port", str(ports.rpc),
            "--webui-port", str(ports.web_ui), "--cores", str(cores), "--memory", memory,
            "--work-dir", str(home / "work"), "--properties-file", str(home / "spark-daemon.conf"),
            self.master_url,
        ]  # fmt: skip

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_ports.rpc}"

    @property
    def web_ui(self) -> str:
        return f"http://127.0.0.1:{self.master_ports.web_ui}"

    def daemons(self) -> list[SparkDaemon]:
        return [self.master, *self.workers]

    def start(self) -> None:
        """Start every daemon not running yet, without waiting; `wait_ready` does that."""
        for daemon in self.daemons():
            daemon.home.mkdir(parents=True, exist_ok=True)
            # A worker's finished applications stay in its work directory for their logs; a day
            # later the worker removes them, so a long-lived stack does not fill the disk.
            (daemon.home / "spark-daemon.conf").write_text(
                "spark.worker.cleanup.enabled true\n"
                "spark.worker.cleanup.appDataTtl 86400\n"
                "spark.ui.showConsoleProgress false\n"
            )
        self.master.start()
        for worker in self.workers:
            worker.start()

    def alive_workers(self) -> int:
        """How many workers the master counts as alive (its web UI's JSON), 0 when it does not
        answer."""
        try:
            with urllib.request.urlopen(f"{self.web_ui}/json/", timeout=2) as reply:  # noqa: S310
                state = json.load(reply)
        except (OSError, ValueError, urllib.error.URLError):
            return 0
        return int(state.get("aliveworkers", 0))

    def wait_ready(self, timeout: float) -> None:
        """Ready means the master counts every worker as alive."""

        def ready() -> bool:
            for daemon in self.daemons():
                # Gone, not merely unrecognised (spark-class execs the JVM).
                if process.gone(daemon.pid):
                    raise ServerStartError(
                        f"Spark {daemon.role}", "the process exited", log_path=str(daemon.log_path)
                    )
            return self.alive_workers() >= len(self.workers)

        if not process.wait_until(ready, timeout=timeout, interval=0.3):
            raise ServerStartError(
                "Spark",
                f"{self.alive_workers()} of {len(self.workers)} workers registered after "
                f"{timeout:.0f}s",
                log_path=str(self.master.log_path),
            )

    def stop(self) -> None:
        # Workers first: a worker whose master vanished keeps retrying to reconnect.
        for daemon in [*self.workers, self.master]:
            daemon.stop()

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers run now (each under its worker's work directory)."""
        return process.processes(command_has="CoarseGrainedExecutorBackend", cwd_under=self.home)
