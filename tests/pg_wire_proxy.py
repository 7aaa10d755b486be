"""A TCP proxy in front of PostgreSQL that understands just enough of the wire protocol to lose
the server's reply to a COMMIT.

The client's bytes go through untouched. The server's are cut into messages (a type byte, then
a 4-byte length that counts itself); when armed, every `every`-th CommandComplete whose tag is
`COMMIT` is swallowed and both sides of the connection are closed. The server has committed by
then; the client only sees its connection drop, which is exactly the case where it must not
assume a rollback. Clients must connect with `sslmode=disable` (and `gssencmode=disable`): the
proxy reads plain messages only.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

_COMMAND_COMPLETE = b"C"
_COMMIT_TAG = b"COMMIT\x00"


class PgWireProxy:
    def __init__(self, upstream_dsn: str) -> None:
        params = conninfo_to_dict(upstream_dsn)
        self._upstream_params: dict[str, Any] = params
        host = str(params.get("host") or "/var/run/postgresql")
        port = int(params.get("port") or 5432)
        if host.startswith("/"):
            self._upstream: tuple[int, Any] = (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
        else:
            self._upstream = (socket.AF_INET, (host, port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._every = 0  # 0: disarmed
        self._commits = 0
        self.dropped = 0
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="pg-proxy", daemon=True)

    @property
    def dsn(self) -> str:
        """The upstream DSN, pointed at the proxy."""
        params = {k: v for k, v in self._upstream_params.items() if k not in ("host", "port")}
        return make_conninfo(
            **params,
            host="127.0.0.1",
            port=self._listener.getsockname()[1],
            sslmode="disable",
            gssencmode="disable",
        )

    def start(self) -> PgWireProxy:
        self._thread.start()
        return self

    def lose_commit_replies(self, *, every: int) -> None:
        """From now on, lose the reply of every `every`-th COMMIT and cut that connection."""
        with self._lock:
            self._every, self._commits = every, 0

    def heal(self) -> None:
        with self._lock:
            self._every = 0

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(self._upstream[0], socket.SOCK_STREAM)
            try:
                server.connect(self._upstream[1])
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets.update((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):  # either side closed: close the other
            while data := source.recv(65536):
                sink.sendall(data)
        self._cut(source, sink)

    def _replies(self, server: socket.socket, client: socket.socket) -> None:
        buffer = b""
        with contextlib.suppress(OSError):  # either side closed: close the other
            while data := server.recv(65536):
                buffer += data
                forward, buffer, lose = self._split(buffer)
                if forward:
                    client.sendall(forward)
                if lose:
                    break
        self._cut(server, client)

    def _split(self, buffer: bytes) -> tuple[bytes, bytes, bool]:
        """The whole messages to forward, the partial rest, and whether to cut here."""
        position = 0
        while len(buffer) - position >= 5:
            kind = buffer[position : position + 1]
            (length,) = struct.unpack("!I", buffer[position + 1 : position + 5])
            end = position + 1 + length
            if end > len(buffer):
                break
            body = buffer[position + 5 : end]
            if kind == _COMMAND_COMPLETE and body == _COMMIT_TAG and self._lose_this_one():
                return buffer[:position], b"", True
            position = end
        return buffer[:position], buffer[position:], False

    def _lose_this_one(self) -> bool:
        with self._lock:
            if not self._every:
                return False
            self._commits += 1
            if self._commits % self._every:
                return False
            self.dropped += 1
            return True

    def _cut(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            _close(sock)
            with self._lock:
                self._sockets.discard(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already shut by the other side
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
