"""The stack's schema registry: Apicurio Registry 2.6 from Maven Central, on loopback.

It runs on the system's Java 17 (Apicurio 3.x needs Java 21, which Debian 12 does not ship) and
serves the Confluent-compatible API under `/apis/ccompat/v7`, the only API bridge's clients
speak, so that any registry with that API serves in production. Its schemas live in an H2 file
under its home: a stack restarted keeps every subject and schema id, as the records in Kafka,
which carry those ids, require.

On the secured stack it serves HTTPS only, with a certificate of the stack's own CA (Quarkus'
`quarkus.http.ssl.*`), and its clients verify it. This build has no authentication of its own
short of an OpenID Connect server (Keycloak), which the stack does not run: it listens on
loopback only.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.errors import MissingToolError, ServerStartError, StackError
from bridge_shell.maven import java_binary
from bridge_shell.stack import process

if TYPE_CHECKING:
    from bridge_shell.stack.secure import StackSecurity

REGISTRY_VERSION = "2.6.13.Final"
REGISTRY_ARTIFACT = f"io.apicurio:apicurio-registry-app:{REGISTRY_VERSION}:tar.gz:all"
CONFLUENT_API = "/apis/ccompat/v7"
ENV_REGISTRY_DIST = "BRIDGE_REGISTRY_DIST"
ENV_REGISTRY_HEAP = "BRIDGE_REGISTRY_HEAP"
_RUNNER = f"apicurio-registry-app-{REGISTRY_VERSION}-runner.jar"
_COMPLETE = ".complete"
REGISTRY_CERTIFICATE = "bridge-registry"  # its certificate's name on the secured stack


def registry_dist() -> Path:
    """The registry unpacked: `$BRIDGE_REGISTRY_DIST`, else
    `~/.cache/bridge/apicurio-registry-<version>/`, fetched from Maven Central once."""
    if os.environ.get(ENV_REGISTRY_DIST):
        return Path(os.environ[ENV_REGISTRY_DIST])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bridge"
    dist = cache / f"apicurio-registry-{REGISTRY_VERSION}"
    if (dist / _COMPLETE).exists():
        return dist
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingToolError("mvn", "install Apache Maven (Debian: apt-get install maven)")
    cache.mkdir(parents=True, exist_ok=True)
    # Fetched and unpacked in a scratch directory, then renamed: never half a distribution.
    scratch = Path(tempfile.mkdtemp(prefix=dist.name + ".", dir=cache))
    try:
        argv = [
            mvn, "-B", "-q", "dependency:copy", f"-Dartifact={REGISTRY_ARTIFACT}",
            f"-DoutputDirectory={scratch}",
        ]  # fmt: skip
        result = subprocess.run(  # noqa: S603 - our own arguments
            argv, cwd=scratch, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            tail = (result.stdout + result.stderr).strip()[-2000:]
            raise StackError(f"Maven could not fetch {REGISTRY_ARTIFACT}:\n{tail}")
        (archive,) = scratch.glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        archive.unlink()
        (scratch / _COMPLETE).touch()
        scratch.rename(dist)
    except OSError:
        if not (dist / _COMPLETE).exists():
            raise
        # Another process finished first; its copy is as good as ours.
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dist


class RegistryServer:
    """One registry whose files all live under `home`."""

    def __init__(
        self,
        *,
        home: Path,
        port: int,
        dist: Path | None = None,
        security: StackSecurity | None = None,
    ) -> None:
        self.home = home
        self.port = port
        self._dist = dist
        self.security = security
        self.data_dir = home / "data"
        self.log_path = home / "registry.log"
        self.pid_path = home / "registry.pid"

    @property
    def dist(self) -> Path:
        """Resolved on first use, so that `status` and `down` never download."""
        if self._dist is None:
            self._dist = registry_dist()
        return self._dist

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL, as clients take it."""
        scheme = "https" if self.security is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{CONFLUENT_API}"

    def client_properties(self) -> dict[str, str]:
        """confluent-kafka's registry client settings beyond the URL: the CA on the secured
        stack (nothing secret)."""
        if self.security is None:
            return {}
        return {"ssl.ca.location": str(self.security.ca.ca.cert)}

    @property
    def pid(self) -> int | None:
        return process.read_pid(self.pid_path)

    @property
    def _marker(self) -> str:
        # On the command line, so that a recycled pid is never taken for this registry.
        return f"-Dbridge.registry.home={self.home}"

    def running(self) -> bool:
        return process.alive(self.pid, self._marker)

    def start(self) -> None:
        """Start the registry without waiting for it; `wait_ready` does that."""
        if self.running():
            return
        if process.port_open("127.0.0.1", self.port):
            raise ServerStartError("schema registry", f"port {self.port} is already taken")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        heap = os.environ.get(ENV_REGISTRY_HEAP, "256m")
        argv = [
            java_binary(), f"-Xmx{heap}", "-XX:+UseSerialGC", self._marker,
            "-Dquarkus.http.host=127.0.0.1", *self._listener(), "-jar", str(self.dist / _RUNNER),
        ]  # fmt: skip
        env = {
            **os.environ,
            # WRITE_DELAY=0: H2 writes a commit to its file before it answers (by default up to
            # 500 ms later), so a schema the registry has given an id survives a SIGKILL;
            # records in Kafka already carry that id.
            "REGISTRY_DATASOURCE_URL": f"jdbc:h2:file:{self.data_dir / 'registry'};WRITE_DELAY=0",
        }
        pid = process.spawn_detached(argv, log_path=self.log_path, cwd=self.home, env=env)
        self.pid_path.write_text(f"{pid}\n")

    def _listener(self) -> list[str]:
        if self.security is None:
            return [f"-Dquarkus.http.port={self.port}"]
        certificate = self.security.certificate(REGISTRY_CERTIFICATE)
        return [
            f"-Dquarkus.http.ssl-port={self.port}",
            "-Dquarkus.http.insecure-requests=disabled",  # no plain HTTP port at all
            f"-Dquarkus.http.ssl.certificate.files={certificate.cert}",
            f"-Dquarkus.http.ssl.certificate.key-files={certificate.key}",
        ]

    def answers(self) -> bool:
        """Whether the Confluent-compatible API lists the subjects."""
        context = None
        if self.security is not None:
            context = ssl.create_default_context(cafile=str(self.security.ca.ca.cert))
        try:
            with urllib.request.urlopen(  # noqa: S310 - our own URL
                f"{self.url}/subjects", timeout=2, context=context
            ) as reply:
                return reply.status == 200 and isinstance(json.loads(reply.read()), list)
        except (OSError, ValueError):  # URLError is an OSError
            return False

    def wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            if process.gone(self.pid):
                raise ServerStartError(
                    "schema registry", "the process exited", log_path=str(self.log_path)
                )
            return self.answers()

        if not process.wait_until(ready, timeout=timeout, interval=0.2):
            raise ServerStartError(
                "schema registry", f"not ready after {timeout:.0f}s", log_path=str(self.log_path)
            )

    def stop(self, *, grace: float = 30.0) -> None:
        pid = self.pid
        if pid is not None:
            process.terminate(pid, self._marker, grace=grace)
        self.pid_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL, for fault-injection tests."""
        pid = self.pid
        if pid is not None:
            process.terminate(pid, self._marker, grace=0)
