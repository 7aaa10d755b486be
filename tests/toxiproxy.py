"""Toxiproxy for the network fault tests: its server as a process, and a small client of its API.

The server is built by the set-up (`scripts/ensure-toxiproxy.sh`, which `make setup` runs) from
Shopify's Go module. A test puts a proxy between a client and a server and adds toxics to it:
a link that goes silent without a reset (`timeout` with 0: data is held back for as long as
the toxic stays), a reset, latency on every packet. Through a proxy, TCP keepalives cannot see
a silent peer (the proxy's kernel answers them): only the client's own bounds can.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bridge_shell.stack.process import free_port

ENSURE_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ensure-toxiproxy.sh"


class ToxiproxyMissing(RuntimeError):
    pass


def toxiproxy_binary() -> Path:
    """The server binary, built on first use by the set-up script (it prints the path)."""
    result = subprocess.run(
        ["bash", str(ENSURE_SCRIPT)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ToxiproxyMissing(
            f"Toxiproxy is not available ({result.stderr.strip()}); run `make setup`, "
            "which builds it with Go"
        )
    return Path(result.stdout.strip().splitlines()[-1])


class Toxiproxy:
    """A running Toxiproxy server on loopback."""

    def __init__(self, binary: Path, log: Path) -> None:
        self.port = free_port()
        self._log = log.open("ab")
        self._process = subprocess.Popen(
            [str(binary), "-host", "127.0.0.1", "-port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self._call("GET", "/version")
                return
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"Toxiproxy did not start; see {log}") from None
                time.sleep(0.1)

    def proxy(self, name: str, upstream: str, *, listen: str = "127.0.0.1:0") -> Proxy:
        """A new proxy to `upstream` (host:port), on `listen` (a free loopback port unless
        given)."""
        created = self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )
        return Proxy(self, name, created["listen"])

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._log.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            payload = response.read()
        return json.loads(payload) if payload else None


class Proxy:
    def __init__(self, server: Toxiproxy, name: str, listen: str) -> None:
        self._server = server
        self.name = name
        self.listen = listen  # host:port clients connect to

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def silence(self) -> None:
        """Hold back every byte in both directions, on every connection, new ones included,
        without closing anything: a link gone silent."""
        for stream in ("upstream", "downstream"):
            self._toxic(f"silent-{stream}", "timeout", stream, {"timeout": 0})

    def latency(self, ms: int) -> None:
        """Delay every packet from the server by `ms`."""
        self._toxic("latency", "latency", "downstream", {"latency": ms, "jitter": 0})

    def reset_peer(self) -> None:
        """Reset every connection (TCP RST) as soon as data arrives."""
        self._toxic("reset", "reset_peer", "upstream", {"timeout": 0})

    def delete(self) -> None:
        self._server._call("DELETE", f"/proxies/{self.name}")

    def heal(self) -> None:
        """Remove every toxic."""
        toxics = self._server._call("GET", f"/proxies/{self.name}/toxics")
        for toxic in toxics:
            self._server._call("DELETE", f"/proxies/{self.name}/toxics/{toxic['name']}")

    def _toxic(self, name: str, kind: str, stream: str, attributes: dict[str, Any]) -> None:
        self._server._call(
            "POST",
            f"/proxies/{self.name}/toxics",
            {"name": name, "type": kind, "stream": stream, "toxicity": 1.0,
             "attributes": attributes},
        )  # fmt: skip
