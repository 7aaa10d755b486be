"""PostgreSQL for the local stack: the system's server binaries, run with `initdb` and `pg_ctl`.

PostgreSQL refuses to run as root, so when we are root the server runs as the `postgres`
system user that Debian's package creates (docs/stack.md says why we chose this server).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from bridge.errors import MissingToolError, ServerStartError, StackError
from bridge.names import POSTGRES_DATABASE, POSTGRES_USER
from bridge.stack import process

ENV_POSTGRES_BINDIR = "BRIDGE_POSTGRES_BINDIR"
SERVER_USER_WHEN_ROOT = "postgres"
_DEBIAN_BINDIRS = Path("/usr/lib/postgresql")
_INSTALL_HINT = (
    "install the PostgreSQL server (Debian: apt-get install postgresql; `make setup` does it "
    f"when run as root) or set {ENV_POSTGRES_BINDIR} to the directory holding initdb and pg_ctl"
)


def find_bindir() -> Path:
    """Where `initdb`, `pg_ctl` and `postgres` are: the override, Debian's newest, or PATH."""
    override = os.environ.get(ENV_POSTGRES_BINDIR)
    candidates: list[Path] = [Path(override)] if override else []
    if _DEBIAN_BINDIRS.is_dir():
        versions = sorted(
            (p for p in _DEBIAN_BINDIRS.iterdir() if re.fullmatch(r"\d+", p.name)),
            key=lambda p: int(p.name),
            reverse=True,
        )
        candidates += [v / "bin" for v in versions]
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if all((bindir / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    raise MissingToolError("PostgreSQL server", _INSTALL_HINT)


@dataclass(frozen=True)
class _RunAs:
    """The user the server runs as: ourselves, or `postgres` when we are root."""

    uid: int | None = None
    gid: int | None = None

    @classmethod
    def current(cls) -> _RunAs:
        if os.geteuid() != 0:
            return cls()
        try:
            entry = pwd.getpwnam(SERVER_USER_WHEN_ROOT)
        except KeyError:
            raise MissingToolError(
                f"system user {SERVER_USER_WHEN_ROOT!r}",
                "PostgreSQL cannot run as root; install Debian's postgresql package, which "
                "creates that user, or run as an ordinary user",
            ) from None
        return cls(uid=entry.pw_uid, gid=entry.pw_gid)

    def own(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)

    def check_reachable(self, path: Path) -> None:
        """The server user must be able to enter every directory above its data directory."""
        if self.uid is None:
            return
        for parent in path.resolve().parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH and parent.stat().st_uid != self.uid:
                raise StackError(
                    f"PostgreSQL runs as {SERVER_USER_WHEN_ROOT!r}, which cannot enter {parent}: "
                    f"choose a --data-dir elsewhere (under /tmp, say) or `chmod o+x {parent}`"
                )

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - argv is built by us
            argv,
            capture_output=True,
            text=True,
            check=False,
            user=self.uid,
            group=self.gid,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
            cwd="/",
        )


class PostgresServer:
    """One PostgreSQL cluster under `home`, listening on 127.0.0.1 only (no Unix socket)."""

    def __init__(self, *, home: Path, port: int) -> None:
        self.home = home
        self.port = port
        self.data_dir = home / "data"
        self.log_path = home / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://{POSTGRES_USER}@127.0.0.1:{self.port}/{POSTGRES_DATABASE}"

    @property
    def pid(self) -> int | None:
        return process.read_pid(self.data_dir / "postmaster.pid")

    def running(self) -> bool:
        return process.alive(self.pid, str(self.data_dir))

    def start(self, timeout: float = 60.0) -> None:
        if self.running():
            return
        if process.port_open("127.0.0.1", self.port):
            raise ServerStartError("PostgreSQL", f"port {self.port} on 127.0.0.1 is already taken")
        bindir = find_bindir()
        run_as = _RunAs.current()
        self.home.mkdir(parents=True, exist_ok=True)
        run_as.check_reachable(self.home)
        run_as.own(self.home)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bindir, run_as)
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
            "-c max_connections=200 -c shared_buffers=128MB"
        )
        argv = [
            str(bindir / "pg_ctl"), "start", "-D", str(self.data_dir), "-l", str(self.log_path),
            "-w", "-t", str(int(timeout)), "-o", options,
        ]  # fmt: skip
        result = run_as.run(argv)
        if result.returncode != 0:
            reason = (result.stdout + result.stderr).strip()[-1000:]
            raise ServerStartError("PostgreSQL", reason, log_path=str(self.log_path))
        self._create_database()

    def stop(self, *, grace: float = 30.0) -> None:
        """Fast shutdown (SIGINT): open transactions roll back, the cluster stays consistent."""
        pid = self.pid
        if pid is not None:
            process.terminate(pid, str(self.data_dir), grace=grace, sig=signal.SIGINT)

    def kill(self) -> None:
        """SIGKILL the postmaster, for fault-injection tests; the next start runs crash recovery."""
        pid = self.pid
        if pid is not None:
            process.terminate(pid, str(self.data_dir), grace=0, sig=signal.SIGKILL)

    def _initdb(self, bindir: Path, run_as: _RunAs) -> None:
        argv = [
            str(bindir / "initdb"), "-D", str(self.data_dir), "-U", POSTGRES_USER,
            "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync",
        ]  # fmt: skip
        result = run_as.run(argv)
        if result.returncode != 0:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise ServerStartError("PostgreSQL", f"initdb failed: {result.stderr.strip()[-1000:]}")

    def _create_database(self) -> None:
        admin_dsn = f"postgresql://{POSTGRES_USER}@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (POSTGRES_DATABASE,)
            ).fetchone()
            if exists is None:
                conn.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(POSTGRES_DATABASE))
                )
