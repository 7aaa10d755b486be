"""An HTTP proxy that asks for basic auth in front of the stack's schema registry.

Apicurio 2.6 authenticates only through OIDC (Keycloak), so a registry behind basic auth, which
Confluent's registry and most managed ones are, is this proxy in front of the real registry:
each request must carry the one user:password it was given, and goes through unchanged. It
counts the requests it let through and those it refused, so that a test can tell that a client
authenticated rather than reached the registry another way.
"""

from __future__ import annotations

import base64
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit


class RegistryAuthProxy:
    def __init__(self, upstream_url: str, *, user: str, password: str) -> None:
        parts = urlsplit(upstream_url)
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._path = parts.path
        self._expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.passed = 0
        self.refused = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The registry's API through the proxy, as clients take it."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{self._path}"

    def __enter__(self) -> RegistryAuthProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # the test's output is not the place

            def _forward(self) -> None:
                if self.headers.get("Authorization") != proxy._expected:
                    proxy.refused += 1
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="registry"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                proxy.passed += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                request = urllib.request.Request(  # noqa: S310 - the stack's own registry
                    proxy._origin + self.path, data=body, method=self.command
                )
                for name in ("Content-Type", "Accept"):
                    if self.headers.get(name):
                        request.add_header(name, self.headers[name])
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
                        status, data, kind = answer.status, answer.read(), answer.headers
                except urllib.error.HTTPError as exc:
                    status, data, kind = exc.code, exc.read(), exc.headers
                self.send_response(status)
                self.send_header("Content-Type", kind.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        return Handler
