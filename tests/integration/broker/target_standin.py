"""A backend or cloud stand-in on loopback whose behaviour a test switches while a broker calls it.

The broker's relay calls hit the real network stack: the stand-in is a plain TCP server in a thread
that reads one HTTP request per connection and then, by its current :class:`Mode`, answers as a
healthy target, refuses with 401 and echoes the whole request back (a verbose target that repeats
what it was sent: the URL, the query, the ``Authorization`` header), never answers (so the broker's
timeout fires), or answers a body far larger than any relay reply. A TLS ClientHello (an
``https://`` URL pointed at this plain listener) gets a plain-text 400, so the broker's TLS
handshake fails. :meth:`close` stops it; afterwards its port refuses connections.

Every read is bounded (size and a socket timeout) and a silent answer waits at most
``SILENT_SECONDS``; everything it started stops in :meth:`close`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
from enum import Enum
from typing import Final

HEAD_LIMIT: Final = 64 * 1024
SILENT_SECONDS: Final = 15.0


class Mode(Enum):
    OK = "ok"
    ECHO_401 = "echo401"
    SILENT = "silent"
    HUGE = "huge"


class TargetStandIn:
    def __init__(self, *, huge_bytes: int = 64 * 1024 * 1024) -> None:
        self.mode = Mode.OK
        self.huge_bytes = huge_bytes
        self.requests: list[str] = []  # every request head received, for the test to look at
        self.huge_sent = 0  # bytes of the last huge body that went out before the client hung up
        self._release = threading.Event()
        standin = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                standin._answer(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, *, scheme: str = "http", userinfo: str = "", path: str = "", query: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{at}127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < HEAD_LIMIT:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                if not head and chunk[:1] == b"\x16":  # a TLS ClientHello on a plain listener
                    conn.sendall(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    return
                head += chunk
            text = head.decode("latin-1")
            self.requests.append(text)
            length = 0
            for line in text.split("\r\n"):
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < min(length, HEAD_LIMIT):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
            self._respond(conn, text)

    def _respond(self, conn: socket.socket, head: str) -> None:
        mode = self.mode
        if mode is Mode.SILENT:
            self._release.wait(SILENT_SECONDS)
            return
        if mode is Mode.ECHO_401:
            self._send(conn, 401, f"unauthorized; you sent:\n{head}".encode("latin-1"))
            return
        if mode is Mode.HUGE:
            self._send_huge(conn)
            return
        path = head.split(" ", 2)[1] if " " in head else ""
        if "/relay/resend" in path:
            self._send(conn, 200, json.dumps({"streams": {}}).encode())
        elif "/relay/poll" in path:
            self._send(conn, 200, json.dumps({"messages": []}).encode())
        elif "/healthz" in path:
            self._send(conn, 200, b"ok")
        else:
            self._send(conn, 200, json.dumps({"results": [], "reasons": {}}).encode())

    @staticmethod
    def _send(conn: socket.socket, status: int, body: bytes) -> None:
        head = (
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        conn.sendall(head.encode() + body)

    def _send_huge(self, conn: socket.socket) -> None:
        """A JSON reply of ``huge_bytes`` bytes without a Content-Length (chunk after chunk until the
        client hangs up): the broker must stop reading at its limit, not at the end."""
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        filler = b'{"messages": [' + b" " * (1024 * 1024 - 14)
        self.huge_sent = 0
        with contextlib.suppress(OSError):
            while self.huge_sent < self.huge_bytes and not self._release.is_set():
                conn.sendall(filler)
                self.huge_sent += len(filler)
                filler = b" " * len(filler)
