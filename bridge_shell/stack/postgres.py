"""PostgreSQL for the local stack: the system's server binaries, run with `initdb` and `pg_ctl`.

PostgreSQL refuses to run as root, so when we are root the server runs as the `postgres`
system user that Debian's package creates (docs/stack.md says why we chose this server).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
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

from bridge.acls import table_rights
from bridge.errors import MissingToolError, ServerStartError, StackError
from bridge.names import DEFAULT_STATE_SCHEMA, POSTGRES_DATABASE, POSTGRES_USER
from bridge.topic_patterns import split_table
from bridge_shell.stack import process
from bridge_shell.stack.secure import POSTGRES_ADMIN, POSTGRES_CONSUMER, StackSecurity

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


# A secured server: TLS only, passwords checked by SCRAM; no `trust`, no plain TCP.
_SECURE_HBA = """\
# TYPE   DATABASE USER ADDRESS      METHOD
hostssl  all      all  127.0.0.1/32 scram-sha-256
hostssl  all      all  ::1/128      scram-sha-256
"""


class PostgresServer:
    """One PostgreSQL cluster under `home`, listening on 127.0.0.1 only (no Unix socket).
    With `security`: TLS with the stack's certificate, SCRAM passwords, and a role of least
    rights for the consumer (see `secure_roles`)."""

    def __init__(self, *, home: Path, port: int, security: StackSecurity | None = None) -> None:
        self.home = home
        self.port = port
        self.security = security
        self.data_dir = home / "data"
        self.log_path = home / "postgres.log"

    @property
    def dsn(self) -> str:
        """The superuser's DSN."""
        if self.security is not None:
            return self.security.postgres_dsn(POSTGRES_ADMIN, self.port)
        return f"postgresql://{POSTGRES_USER}@127.0.0.1:{self.port}/{POSTGRES_DATABASE}"

    def role_dsn(self, role: str) -> str:
        """The DSN of `role` (the consumer's, say); on a stack without security, the superuser's."""
        if self.security is None:
            return self.dsn
        return self.security.postgres_dsn(role, self.port)

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
        if self.security is not None:
            cert, key = self._install_certificate(run_as)
            options += f" -c ssl=on -c ssl_cert_file={cert} -c ssl_key_file={key}"
        argv = [
            str(bindir / "pg_ctl"), "start", "-D", str(self.data_dir), "-l", str(self.log_path),
            "-w", "-t", str(int(timeout)), "-o", options,
        ]  # fmt: skip
        result = run_as.run(argv)
        if result.returncode != 0:
            reason = (result.stdout + result.stderr).strip()[-1000:]
            raise ServerStartError("PostgreSQL", reason, log_path=str(self.log_path))
        if self.is_standby:
            return  # read-only: the primary made the database and roles, and streams them here
        self._create_database()
        if self.security is not None:
            self._secure_roles()

    # -- a streaming standby ------------------------------------------------------------------

    @property
    def is_standby(self) -> bool:
        return (self.data_dir / "standby.signal").exists()

    def follow(self, primary: PostgresServer, *, timeout: float = 60.0) -> None:
        """Start as a streaming standby of `primary` (which must run): on first use, its data
        directory is a base backup of the primary's, with `primary_conninfo` written by
        `pg_basebackup -R`. Plain stacks only: the base backup connects as the superuser by
        trust, as the primary's pg_hba allows replication from 127.0.0.1."""
        if self.security is not None or primary.security is not None:
            raise StackError("a PostgreSQL standby is only offered on a plain stack")
        if not (self.data_dir / "PG_VERSION").exists():
            run_as = _RunAs.current()
            self.home.mkdir(parents=True, exist_ok=True)
            run_as.check_reachable(self.home)
            run_as.own(self.home)
            argv = [
                str(find_bindir() / "pg_basebackup"), "-D", str(self.data_dir), "-R",
                "-X", "stream", "-c", "fast", "-h", "127.0.0.1", "-p", str(primary.port),
                "-U", POSTGRES_USER, "--no-sync",
            ]  # fmt: skip
            result = run_as.run(argv)
            if result.returncode != 0:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                reason = result.stderr.strip()[-1000:]
                raise ServerStartError("PostgreSQL", f"pg_basebackup failed: {reason}")
        self.start(timeout=timeout)

    def promote(self, *, timeout: float = 60.0) -> None:
        """End recovery: the standby becomes a primary that takes writes."""
        argv = [str(find_bindir() / "pg_ctl"), "promote", "-D", str(self.data_dir), "-w",
                "-t", str(int(timeout))]  # fmt: skip
        result = _RunAs.current().run(argv)
        if result.returncode != 0:
            raise StackError(f"pg_ctl promote failed: {(result.stdout + result.stderr).strip()}")

    def replicate_synchronously(self, synchronous: bool) -> None:
        """On a primary: whether a COMMIT waits until a standby has flushed it
        (`synchronous_standby_names = '*'`), or only for the primary's own disk."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(
                    sql.Literal("*" if synchronous else "")
                )
            )
            conn.execute("SELECT pg_reload_conf()")

    def replication(self) -> list[tuple[str, str]]:
        """On a primary: each connected standby's (state, sync_state), from pg_stat_replication."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
        return [(str(state), str(sync)) for state, sync in rows]

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
            "--encoding=UTF8", "--locale=C", "--no-sync",
        ]  # fmt: skip
        pwfile = self.home / "initdb.pw"
        if self.security is None:
            argv.append("--auth=trust")
        else:
            # initdb reads the superuser's password from a file the server user can read,
            # removed right after; never from the command line.
            pwfile.write_text(self.security.password(f"postgres-{POSTGRES_ADMIN}") + "\n")
            pwfile.chmod(0o600)
            run_as.own(pwfile)
            argv += ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
        try:
            result = run_as.run(argv)
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise ServerStartError("PostgreSQL", f"initdb failed: {result.stderr.strip()[-1000:]}")
        if self.security is not None:
            hba = self.data_dir / "pg_hba.conf"
            hba.write_text(_SECURE_HBA)
            run_as.own(hba)

    def _install_certificate(self, run_as: _RunAs) -> tuple[Path, Path]:
        """The server's certificate and key, copied where the server user owns them: PostgreSQL
        refuses a key file that others may read."""
        assert self.security is not None  # noqa: S101 - only called for a secured server
        issued = self.security.certificate("postgres")
        tls = self.home / "tls"
        tls.mkdir(mode=0o700, exist_ok=True)
        run_as.own(tls)
        installed = (tls / "server.pem", tls / "server.key")
        for source, target in zip((issued.cert, issued.key), installed, strict=True):
            target.write_bytes(source.read_bytes())
            target.chmod(0o600)
            run_as.own(target)
        return installed

    def _secure_roles(self) -> None:
        """The consumer's role, as `consumer_role_statements` makes it."""
        assert self.security is not None  # noqa: S101 - only called for a secured server
        verifier = scram_sha_256_verifier(self.security.password(f"postgres-{POSTGRES_CONSUMER}"))
        with psycopg.connect(self.dsn, dbname=POSTGRES_DATABASE, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", (POSTGRES_CONSUMER,)
            ).fetchone()
            for statement in consumer_role_statements(verifier, exists=exists is not None):
                conn.execute(statement)

    def _create_database(self) -> None:
        with psycopg.connect(self.dsn, dbname="postgres", autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (POSTGRES_DATABASE,)
            ).fetchone()
            if exists is None:
                conn.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(POSTGRES_DATABASE))
                )


def consumer_role_statements(
    verifier: str | None, *, exists: bool = False, database: str = POSTGRES_DATABASE
) -> list[sql.Composed]:
    """The consumer's role (run in `database`): it logs in, owns its state schema, and may use
    what it is granted (`grant_table`), nothing else: no CREATE on the database or on
    `public`. The local stack runs them; `bridge stack credentials` writes them for the
    compose postgres service's first start. `verifier` None: the role exists as it is."""
    role = sql.Identifier(POSTGRES_CONSUMER)
    verb = sql.SQL("ALTER" if exists else "CREATE")
    # The verifier, not the password, so that the password is never in a statement.
    login = [sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(verb, role, sql.Literal(verifier))]
    return [
        *(login if verifier is not None else []),
        sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(database)),
        # TEMPORARY: an upsert stages its rows in a temporary table.
        sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
            sql.Identifier(database), role
        ),
        sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC").format(),
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
            sql.Identifier(DEFAULT_STATE_SCHEMA), role
        ),
    ]


def scram_sha_256_verifier(password: str, *, iterations: int = 4096) -> str:
    """What PostgreSQL stores for a SCRAM-SHA-256 password (RFC 5803's form), so that a role's
    password can be set without the password itself in any statement or log."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    encode = base64.b64encode
    return (
        f"SCRAM-SHA-256${iterations}:{encode(salt).decode()}"
        f"${encode(stored_key).decode()}:{encode(server_key).decode()}"
    )


def role_of(dsn: str) -> str:
    """The role a DSN logs in as."""
    return str(psycopg.conninfo.conninfo_to_dict(dsn).get("user") or "")


def grant_table(
    dsn: str, table: str, role: str, *, upsert: bool = False, deletes: bool = False
) -> None:
    """Let `role` write `table` (`schema.table`) as a route of mode `insert` or `upsert` needs
    (bridge.acls.table_rights says which rights)."""
    schema, name = split_table(table)
    target = sql.Identifier(schema or "public", name)
    mode = "upsert" if upsert else "insert"
    rights = sql.SQL(", ".join(table_rights(mode, deletes=deletes or upsert)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema or "public"), sql.Identifier(role)))  # fmt: skip
        conn.execute(sql.SQL("GRANT {} ON {} TO {}").format(rights, target, sql.Identifier(role)))
