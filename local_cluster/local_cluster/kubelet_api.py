"""The node agent's kubelet API: enough of it for ``kubectl logs``.

``kubectl logs`` asks the apiserver, which proxies to the kubelet of the pod's node
(the Node's InternalIP and ``status.daemonEndpoints.kubeletEndpoint.Port``) as
``GET /containerLogs/{namespace}/{pod}/{container}?follow=..&previous=..``. This module
serves that endpoint over HTTPS from a thread of the node agent (stdlib ``http.server``
with one thread per connection, TLS handshake in that thread):

- TLS with the kubelet serving certificate (``pki.py``: SANs 127.0.0.1, 10.244.0.1,
  localhost), and clients must present a certificate signed by the cluster CA (the
  apiserver's ``--kubelet-client-certificate``); others fail the handshake. There is
  no authorization step (a real kubelet asks the apiserver with a
  SubjectAccessReview): any CA-signed client may read any log.
- Logs come from ``pods/<ns>_<name>_<uid>/logs/<container>.log``, one file per
  container that every restart appends to after a marker line the runtime writes
  (``=== node agent: start #N argv=[...]``, ``pod_runtime``). The markers split the
  file into instances and are never shown: the current instance is the last one,
  ``previous`` the one before it, or the last one while the container waits to be
  restarted (what the kubelet's ``lastState.terminated`` names then).
- ``follow`` polls the file (0.2 s) and ends when that instance exits, the client goes
  away, ``limitBytes`` is reached or the server stops.
- ``tailLines`` and ``limitBytes`` are exact; ``sinceSeconds``/``sinceTime`` are
  approximate: the file holds no per-line times, so an instance's log is returned
  whole if the file was written to within the window, and not at all otherwise (lines
  written while following are always new). ``timestamps=true`` is refused with 400
  for the same reason: a time made up at read time would be a lie.
- stdout and stderr are one file, so ``stream=Stdout``/``Stderr`` are refused (400).
- Errors use the kubelet's status codes and wording (404 ``pod "p" does not exist``,
  ``container "c" not found in pod "p"``; 400 ``previous terminated container "c" in
  pod "p" not found``, ``... is waiting to start: ...``; 422 for invalid values).

What it does not do: ``exec``, ``attach``, ``port-forward``, ``/stats``,
``/metrics``, ``/pods``: only ``/containerLogs`` and ``/healthz``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from local_cluster.pod_runtime import PodRuntime, container_log_path

log = logging.getLogger("node-agent.kubelet-api")

# pod_runtime writes one before each start of a container (even a failed one).
START_MARKER = re.compile(rb"=== node agent: start #\d+ argv=[^\n]*\n")
START_MARKER_PREFIX = b"=== node agent: start #"
DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # namespace and pod names
FOLLOW_POLL_SECONDS = 0.2
READ_CHUNK_BYTES = 1 << 20
CONNECTION_TIMEOUT_SECONDS = 30.0  # TLS handshake, request, and any one write to a stalled client


class LogRequestError(Exception):
    """A request the kubelet would refuse: HTTP status and its message (plain text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ContainerLogSource:
    """One container's log file and what the runtime knows of it at this moment."""

    path: Path
    running_pgid: int | None = None  # the current instance's process group, if it runs
    waiting_to_restart: bool = False  # exited, and restartPolicy will start it again
    waiting_reason: str = ""  # why it has not started yet (no log instance at all)


LogLookup = Callable[[str, str, str], ContainerLogSource]


# ---- reading the log file ----------------------------------------------------------------


def safe_length(data: bytes) -> int:
    """How much of ``data`` may be shown: all but a start marker still being written at its end."""
    line_start = data.rfind(b"\n") + 1
    position = data.find(b"=", line_start)
    while position != -1:
        candidate = data[position:]
        if START_MARKER_PREFIX.startswith(candidate) or candidate.startswith(START_MARKER_PREFIX):
            return position
        position = data.find(b"=", position + 1)
    return len(data)


def instance_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte offsets of each container instance's output, oldest first, markers left out."""
    markers = list(START_MARKER.finditer(data))
    spans = []
    for index, marker in enumerate(markers):
        end = markers[index + 1].start() if index + 1 < len(markers) else safe_length(data)
        spans.append((marker.end(), max(marker.end(), end)))
    return spans


def tail_lines(data: bytes, count: int) -> bytes:
    if count <= 0:
        return b""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-count:])


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_epoch: float | None = None  # from sinceSeconds or sinceTime

    @classmethod
    def from_query(cls, query: str, now: float) -> LogOptions:
        values = {key: items[-1] for key, items in parse_qs(query, keep_blank_values=True).items()}
        if "tail" in values:  # the kubelet's backwards-compatible spelling
            tail = values.pop("tail")
            if tail != "all":
                values["tailLines"] = tail
        try:
            follow, previous, timestamps = (
                _boolean(values.get(name)) for name in ("follow", "previous", "timestamps")
            )
            tail_count, limit, since_seconds = (
                _integer(values.get(name)) for name in ("tailLines", "limitBytes", "sinceSeconds")
            )
            since_time = _rfc3339(values["sinceTime"]) if values.get("sinceTime") else None
        except ValueError:
            raise LogRequestError(400, '{"message": "Unable to decode query."}') from None
        if (
            (tail_count is not None and tail_count < 0)
            or (limit is not None and limit < 1)
            or (since_seconds is not None and since_seconds < 1)
            or (since_seconds is not None and since_time is not None)
        ):
            raise LogRequestError(422, '{"message": "Invalid request."}')
        if timestamps:
            raise LogRequestError(
                400,
                "timestamps are not available from the local node agent: "
                "its container log files carry no per-line times",
            )
        stream = values.get("stream") or "All"
        if stream != "All":
            raise LogRequestError(
                400, f"unable to return the given log stream: {stream!r}: stdout and stderr are one file here"
            )
        since = now - since_seconds if since_seconds is not None else since_time
        return cls(follow, previous, tail_count, limit, since)


def _boolean(value: str | None) -> bool:
    if value is None or value == "":
        return False
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ValueError(value)


def _integer(value: str | None) -> int | None:
    return None if value is None or value == "" else int(value)


def _rfc3339(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # removed meanwhile
        return 0.0


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read(READ_CHUNK_BYTES)
    except FileNotFoundError:
        return b""


# ---- mapping (namespace, pod, container) to a log file: the node agent's pods ---------------


class PodLogFinder:
    """Finds a container's log among the agent's pod runtimes, then among pod directories on disk.

    ``runtimes`` returns a snapshot of the agent's ``pods`` (the agent's loop thread owns
    them; this only reads). A pod that finished (a Job's Succeeded/Failed pod) keeps its
    runtime there until its object is deleted; a pod the agent no longer runs (finished
    before an agent restart) is found by its directory ``<ns>_<name>_<uid>``, the newest if
    several: the apiserver only asks for pods whose object exists.
    """

    def __init__(self, runtimes: Callable[[], Iterable[PodRuntime]], pods_dir: Path) -> None:
        self.runtimes = runtimes
        self.pods_dir = pods_dir

    def __call__(self, namespace: str, pod: str, container: str) -> ContainerLogSource:
        matches = [
            runtime
            for runtime in self._snapshot()
            if runtime.pod["metadata"]["namespace"] == namespace and runtime.pod["metadata"]["name"] == pod
        ]
        if matches:
            runtime = max(matches, key=lambda r: (r.terminating_deadline is None, r.start_time))
            return self._from_runtime(runtime, pod, container)
        if not (DNS_NAME.fullmatch(namespace) and DNS_NAME.fullmatch(pod)):  # no glob patterns below
            raise LogRequestError(404, f'pod "{pod}" does not exist')
        directories = sorted(
            (d for d in self.pods_dir.glob(f"{namespace}_{pod}_*") if d.name.count("_") == 2),
            key=_mtime,
        )
        if not directories:
            raise LogRequestError(404, f'pod "{pod}" does not exist')
        path = container_log_path(directories[-1], container)
        if not path.is_file():
            raise LogRequestError(404, f'container "{container}" not found in pod "{pod}"')
        return ContainerLogSource(path=path)

    def _snapshot(self) -> list[PodRuntime]:
        for _ in range(10):
            try:
                return list(self.runtimes())
            except RuntimeError:  # the dict changed while being copied; the loop thread owns it
                time.sleep(0.01)
        return list(self.runtimes())

    @staticmethod
    def _from_runtime(runtime: PodRuntime, pod: str, container: str) -> ContainerLogSource:
        for candidate in runtime.containers:
            if candidate.name != container:
                continue
            process = candidate.process
            return ContainerLogSource(
                path=container_log_path(runtime.sandbox.pod_dir, container),
                running_pgid=process.pid if process is not None else None,
                waiting_to_restart=(
                    process is None and candidate.current is not None and runtime._will_start(candidate)
                ),
                waiting_reason=candidate.waiting_reason or "ContainerCreating",
            )
        raise LogRequestError(404, f'container "{container}" not found in pod "{pod}"')


# ---- the server -----------------------------------------------------------------------------


class _LogHandler(BaseHTTPRequestHandler):
    server: KubeletApiServer
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: simple streaming
    server_version = "local-node-agent-kubelet"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.client_address[0], format % args)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._reply_text(200, "ok")
            return
        parts = url.path.split("/")
        if len(parts) < 2 or parts[1] != "containerLogs":
            self._reply_text(404, "404 page not found")
            return
        namespace, pod, container = ([*(unquote(part) for part in parts[2:5]), "", "", ""])[:3]
        try:
            if not pod:
                raise LogRequestError(400, '{"message": "Missing podID."}')
            if not container:
                raise LogRequestError(400, '{"message": "Missing container name."}')
            if not namespace:
                raise LogRequestError(400, '{"message": "Missing podNamespace."}')
            options = LogOptions.from_query(url.query, time.time())
            source = self.server.lookup(namespace, pod, container)
            self._serve_log(namespace, pod, container, source, options)
        except LogRequestError as error:
            self._reply_text(error.status, error.message)
        except (BrokenPipeError, ConnectionResetError, TimeoutError, ssl.SSLError):
            pass  # the client went away

    def _reply_text(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve_log(
        self, namespace: str, pod: str, container: str, source: ContainerLogSource, options: LogOptions
    ) -> None:
        data = source.path.read_bytes() if source.path.is_file() else b""
        spans = instance_spans(data)
        follow_pgid = None
        if options.previous:
            index = len(spans) - 1 if source.waiting_to_restart else len(spans) - 2
            if index < 0:
                raise LogRequestError(
                    400, f'previous terminated container "{container}" in pod "{pod}" not found'
                )
        else:
            if not spans:
                reason = source.waiting_reason
                if reason == "ErrImagePull":
                    reason = "image can't be pulled"
                raise LogRequestError(
                    400, f'container "{container}" in pod "{pod}" is waiting to start: {reason}'
                )
            index = len(spans) - 1
            if options.follow and source.running_pgid is not None:
                follow_pgid = source.running_pgid
        start, end = spans[index]
        content = data[start:end]
        if options.since_epoch is not None and _mtime(source.path) < options.since_epoch:
            content = b""
        if options.tail_lines is not None:
            content = tail_lines(content, options.tail_lines)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        budget = options.limit_bytes
        budget = self._emit(content, budget)
        if follow_pgid is None or budget == 0:
            return
        self._follow((namespace, pod, container), source.path, end, follow_pgid, budget)

    def _emit(self, data: bytes, budget: int | None) -> int | None:
        """Write ``data`` within ``budget`` bytes (None: no limit); returns what is left of it."""
        if budget is not None:
            data = data[:budget]
            budget -= len(data)
        if data:
            self.wfile.write(data)
        return budget

    def _follow(
        self, target: tuple[str, str, str], path: Path, offset: int, pgid: int, budget: int | None
    ) -> None:
        """Stream what instance ``pgid`` of container ``target`` (namespace, pod, name) appends."""
        pending = b""
        while not self.server.stopping.is_set():
            ended = not self._still_running(target, pgid)
            chunk = _read_from(path, offset)  # read after the check: nothing the instance wrote is lost
            offset += len(chunk)
            pending += chunk
            marker = START_MARKER.search(pending)
            if marker is not None:  # the container restarted: this instance is over
                self._emit(pending[: marker.start()], budget)
                return
            shown = safe_length(pending)
            budget = self._emit(pending[:shown], budget)
            pending = pending[shown:]
            if budget == 0 or ended or self._client_gone():
                return
            if len(chunk) < READ_CHUNK_BYTES:
                self.server.stopping.wait(FOLLOW_POLL_SECONDS)

    def _still_running(self, target: tuple[str, str, str], pgid: int) -> bool:
        try:
            return self.server.lookup(*target).running_pgid == pgid
        except LogRequestError:
            return False

    def _client_gone(self) -> bool:
        """True once the client closed its side (kubectl -f interrupted): readable with nothing to read."""
        connection = self.connection
        try:
            readable, _, _ = select.select([connection], [], [], 0)
            if not readable:
                return False
            connection.settimeout(0.05)
            try:
                return connection.recv(1) == b""
            finally:
                connection.settimeout(CONNECTION_TIMEOUT_SECONDS)
        except (ssl.SSLWantReadError, TimeoutError):
            return False  # a partial TLS record: still there
        except (OSError, ValueError):
            return True


class KubeletApiServer(ThreadingHTTPServer):
    """HTTPS, client certificates required; the TLS handshake runs in each connection's thread."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext, lookup: LogLookup) -> None:
        super().__init__(address, _LogHandler)
        self.context = context
        self.lookup = lookup
        self.stopping = threading.Event()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(CONNECTION_TIMEOUT_SECONDS)
        try:
            connection = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as error:
            log.info("kubelet API: refused %s: %s", client_address[0], error)
            return
        try:
            _LogHandler(connection, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()


@dataclass
class KubeletApi:
    """A started server: ``port`` is what the Node reports; ``stop()`` ends it and every follow."""

    server: KubeletApiServer
    thread: threading.Thread

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def server_tls_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    context.load_verify_locations(cafile=str(client_ca))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def start_kubelet_api(
    *, host: str, port: int, cert: Path, key: Path, client_ca: Path, lookup: LogLookup
) -> KubeletApi:
    """Serve ``/containerLogs`` on ``host:port`` (0: a free port) in a daemon thread."""
    server = KubeletApiServer((host, port), server_tls_context(cert, key, client_ca), lookup)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="kubelet-api")
    thread.daemon = True
    thread.start()
    log.info("kubelet API (container logs) on https://%s:%d", host, server.server_address[1])
    return KubeletApi(server=server, thread=thread)
