"""``kubectl port-forward``, the kubelet's half: SPDY streams to a TCP port inside the pod.

``kubectl port-forward pod/p 18081:8081`` asks the API server for ``pods/p/portforward``; the
API server proxies that, as an HTTP upgrade, to ``/portForward/{namespace}/{pod}`` on the
pod's kubelet. kubectl v1.32 speaks WebSocket (subprotocol ``SPDY/3.1+portforward.k8s.io``)
and the API server, with ``PortForwardWebsockets`` on (the default since 1.31), tunnels the
SPDY inside it to the kubelet as a plain ``Upgrade: SPDY/3.1`` request with
``X-Stream-Protocol-Version: portforward.k8s.io``: the kubelet sees SPDY either way
(``kubelet_api`` logs the upgrade headers at INFO).

Per forwarded connection the client opens two SPDY streams with the same ``requestID``
header: ``streamType: error`` then ``streamType: data``, both with ``port``. The kubelet
answers each with SYN_REPLY, and once it has the pair connects to the port and copies bytes
both ways on the data stream; a failure is written to the error stream as text (kubectl
prints it: ``an error occurred forwarding 18081 -> 8081: ...``). As the kubelet's
``cri/streaming/portforward/httpstream.go``: pairs by ``requestID`` (or by stream ids when
it is missing), both streams closed (FIN) when the pod side ends, the data stream reset on an
error. kubectl resets the data stream once it has the pod side's FIN.

Where it connects: inside the pod's network namespace (``call_in_network_namespace`` makes
the socket on a thread that joined it; the socket stays there), to ``127.0.0.1:PORT`` as
containerd does, then to the pod IP for a server bound to its pod IP only (more lenient than
a real node, where such a server is unreachable by port-forward). Loopback mode has no pod
namespaces: the pod IP on the machine's loopback.

One session is one thread (the kubelet API's connection thread) running a ``select`` loop
over the TLS connection and the pod sockets: no concurrent reads and writes on one TLS
object, and every loop ends with the connection, the server's ``stopping`` or the idle
timeout. Writes block (bounded by the socket timeout): a stalled reader slows the session
down rather than growing buffers.

What it does not do: UDP (neither does Kubernetes), flow control (``spdy_frames``), the
WebSocket protocol toward the kubelet (the API server never sends it), authorization.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from local_cluster import netns
from local_cluster.container_logs import LogRequestError
from local_cluster.pod_runtime import PodRuntime
from local_cluster.spdy_frames import (
    ControlFrame,
    DataFrame,
    Frame,
    FrameReader,
    FrameType,
    HeaderCodec,
    RstStatus,
    SpdyProtocolError,
    control_frame,
    data_frame,
    goaway,
    rst_stream,
    stream_id_of,
    syn_reply,
    syn_stream_fields,
)

log = logging.getLogger("node-agent.port-forward")

PROTOCOL: Final = "portforward.k8s.io"
UPGRADE: Final = "SPDY/3.1"
CONNECT_TIMEOUT_SECONDS: Final = 10.0
IO_TIMEOUT_SECONDS: Final = 30.0  # any one blocking write, to the API server or to a pod
IDLE_TIMEOUT_SECONDS: Final = 4 * 3600.0  # the kubelet's --streaming-connection-idle-timeout
POLL_SECONDS: Final = 0.5  # how often the loop looks at ``stopping``
CHUNK_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class PodEndpoint:
    """Where a pod's ports are: its network namespace (None in loopback mode) and its IP."""

    name: str  # namespace/name, for messages
    uid: str
    pod_ip: str
    network_namespace: Path | None

    def addresses(self, port: int) -> list[tuple[str, int]]:
        if self.network_namespace is None:
            return [(self.pod_ip, port)]  # loopback mode: 127.0.0.1 would be the machine's
        return [("127.0.0.1", port), (self.pod_ip, port)]


PodEndpointLookup = Callable[[str, str], PodEndpoint]


class PodEndpointFinder:
    """Finds a running pod among the node agent's runtimes (read-only snapshot, as ``PodLogFinder``)."""

    def __init__(self, runtimes: Callable[[], Iterable[PodRuntime]]) -> None:
        self.runtimes = runtimes

    def __call__(self, namespace: str, pod: str) -> PodEndpoint:
        matches: list[PodRuntime] = []
        for _ in range(10):
            try:
                matches = [
                    runtime
                    for runtime in list(self.runtimes())
                    if runtime.pod["metadata"]["namespace"] == namespace
                    and runtime.pod["metadata"]["name"] == pod
                ]
                break
            except RuntimeError:  # the dict changed while being copied; the loop thread owns it
                time.sleep(0.01)
        if not matches:
            raise LogRequestError(404, f'pod "{pod}" does not exist')
        runtime = max(matches, key=lambda r: (r.terminating_deadline is None, r.start_time))
        sandbox = runtime.sandbox
        network = sandbox.network if sandbox.isolated else None
        return PodEndpoint(
            f"{namespace}/{pod}", runtime.uid, sandbox.pod_ip, network.namespace_path if network else None
        )


def negotiate(headers: dict[str, list[str]]) -> str:
    """Check an upgrade request as ``httpstream.Handshake`` and the SPDY upgrader do; the protocol.

    Raises ``LogRequestError`` with the kubelet's status and wording.
    """
    connection = ",".join(headers.get("connection", [])).lower()
    upgrade = ",".join(headers.get("upgrade", []))
    if "upgrade" not in connection or upgrade.lower() != UPGRADE.lower():
        raise LogRequestError(
            400,
            "unable to upgrade: missing upgrade headers in request: "
            f"Connection={connection!r} Upgrade={upgrade!r}",
        )
    offered = [v.strip() for value in headers.get("x-stream-protocol-version", []) for v in value.split(",")]
    if offered and PROTOCOL not in offered:
        raise LogRequestError(
            403,
            "unable to upgrade: unable to negotiate protocol: "
            f"client supports {offered}, server supports [{PROTOCOL}]",
        )
    return PROTOCOL if offered else ""


def upgrade_response(protocol: str) -> bytes:
    lines = ["HTTP/1.1 101 Switching Protocols", "Connection: Upgrade", f"Upgrade: {UPGRADE}"]
    if protocol:
        lines.append(f"X-Stream-Protocol-Version: {protocol}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def connect_in_pod(endpoint: PodEndpoint, port: int) -> socket.socket:
    """A TCP connection to ``port`` of the pod, made inside its network namespace."""

    def dial() -> socket.socket:
        failures = []
        for address in endpoint.addresses(port):
            try:
                return socket.create_connection(address, timeout=CONNECT_TIMEOUT_SECONDS)
            except OSError as error:
                failures.append(f"dial tcp {address[0]}:{address[1]}: {error.strerror or error}")
        raise OSError(errno.ECONNREFUSED, "; ".join(failures))

    if endpoint.network_namespace is None:
        return dial()
    return netns.call_in_network_namespace(
        endpoint.network_namespace, dial, timeout=CONNECT_TIMEOUT_SECONDS + 5
    )


@dataclass
class _Forward:
    """One forwarded connection: its two streams and, once both came, the pod-side socket."""

    request_id: str
    port: int
    error_stream: int | None = None
    data_stream: int | None = None
    pod_socket: socket.socket | None = None
    client_done: bool = False  # the client's FIN on the data stream: nothing more to the pod
    pod_done: bool = False  # the pod's EOF, sent on as FIN
    error_closed: bool = False


@dataclass
class PortForwardSession:
    """One upgraded connection from the API server, served until it closes."""

    connection: ssl.SSLSocket | socket.socket
    endpoint: PodEndpoint
    description: str
    stopping: threading.Event
    connect: Callable[[PodEndpoint, int], socket.socket] = connect_in_pod
    codec: HeaderCodec = field(default_factory=HeaderCodec)
    forwards: dict[str, _Forward] = field(default_factory=dict)
    by_stream: dict[int, _Forward] = field(default_factory=dict)
    last_stream: int = 0
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    end_reason: str = ""  # set when the session is over; what ``run`` returns

    def run(self) -> str:
        """Serve until the connection ends; why it ended, for the log."""
        self.connection.settimeout(IO_TIMEOUT_SECONDS)
        connection_key = self.selector.register(self.connection, selectors.EVENT_READ, None)
        reader = FrameReader()
        last_activity = time.monotonic()
        try:
            while not self.end_reason:
                if self.stopping.is_set() or time.monotonic() - last_activity > IDLE_TIMEOUT_SECONDS:
                    self.end_reason = (
                        "the kubelet API is stopping" if self.stopping.is_set() else "idle too long"
                    )
                    break
                # Bytes TLS already decrypted are invisible to select(): read them first.
                if isinstance(self.connection, ssl.SSLSocket) and self.connection.pending() > 0:
                    ready = [connection_key]
                else:
                    ready = [key for key, _ in self.selector.select(POLL_SECONDS)]
                for key in ready:
                    if self.end_reason:
                        break
                    last_activity = time.monotonic()
                    if key.data is None:
                        self._from_connection(reader)
                    else:
                        self._from_pod(key.data)
        except SpdyProtocolError as error:
            self.end_reason = f"protocol error: {error}"
            with contextlib.suppress(OSError):
                self.connection.sendall(goaway(self.last_stream))
        except OSError as error:  # the API server went away, or a write timed out (ssl.SSLError too)
            self.end_reason = f"connection error: {error}"
        finally:
            for forward in list(self.forwards.values()):
                self._close_pod_socket(forward)
            self.selector.close()
        return self.end_reason

    def _from_connection(self, reader: FrameReader) -> None:
        data = self.connection.recv(CHUNK_BYTES)
        if not data:
            self.end_reason = "closed by the API server"
            return
        for frame in reader.feed(data):
            self._on_frame(frame)

    # ---- frames from the API server --------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        if isinstance(frame, DataFrame):
            self._on_data(frame)
            return
        assert isinstance(frame, ControlFrame)
        if frame.type == FrameType.SYN_STREAM:
            stream_id, block = syn_stream_fields(frame.payload)
            self._on_new_stream(stream_id, self.codec.decode(block), bool(frame.flags & 0x01))
        elif frame.type == FrameType.RST_STREAM:
            self._on_reset(stream_id_of(frame.payload))
        elif frame.type == FrameType.PING:
            self._send(control_frame(FrameType.PING, frame.payload))  # kubectl pings every 10 s
        elif frame.type == FrameType.GOAWAY:
            self.end_reason = "GOAWAY from the API server"
        elif frame.type in (FrameType.SYN_REPLY, FrameType.HEADERS):
            self.codec.decode(frame.payload[4:])  # keeps the shared zlib context in step
        # SETTINGS, WINDOW_UPDATE, NOOP: nothing to do (no flow control, see spdy_frames).

    def _on_new_stream(self, stream_id: int, headers: dict[str, list[str]], fin: bool) -> None:
        self.last_stream = max(self.last_stream, stream_id)
        stream_type = (headers.get("streamtype") or [""])[0]
        port_text = (headers.get("port") or [""])[0]
        problem = None
        if not port_text:
            problem = '"port" header is required'
        elif not port_text.isdigit() or not 0 < int(port_text) < 65536:
            problem = f"unable to parse {port_text!r} as a port"
        elif stream_type not in ("error", "data"):
            problem = (
                f"invalid stream type {stream_type!r}" if stream_type else '"streamType" header is required'
            )
        if problem is not None:
            log.info("%s: stream %d refused: %s", self.description, stream_id, problem)
            self._send(rst_stream(stream_id, RstStatus.CANCEL))
            return
        self._send(syn_reply(stream_id, self.codec.encode({})))
        request_id = (headers.get("requestid") or [""])[0]
        if not request_id:  # old clients: the error stream's id, the data stream's id minus 2
            request_id = str(stream_id if stream_type == "error" else stream_id - 2)
        forward = self.forwards.setdefault(request_id, _Forward(request_id, int(port_text)))
        if stream_type == "error":
            if forward.error_stream is not None:
                self._send(rst_stream(stream_id, RstStatus.PROTOCOL_ERROR))
                return
            forward.error_stream = stream_id
        else:
            if forward.data_stream is not None:
                self._send(rst_stream(stream_id, RstStatus.PROTOCOL_ERROR))
                return
            forward.data_stream = stream_id
            forward.client_done = fin
        self.by_stream[stream_id] = forward
        if forward.error_stream is not None and forward.data_stream is not None:
            self._start(forward)

    def _start(self, forward: _Forward) -> None:
        try:
            pod_socket = self.connect(self.endpoint, forward.port)
        except (OSError, TimeoutError) as error:
            # The kubelet's wording (httpstream.go), then containerd's.
            message = (
                f"error forwarding port {forward.port} to pod {self.endpoint.name}, uid {self.endpoint.uid}: "
                f"failed to connect to localhost:{forward.port} inside namespace of the pod: {error}"
            )
            log.info("%s: %s", self.description, message)
            self._fail(forward, message)
            return
        pod_socket.settimeout(IO_TIMEOUT_SECONDS)
        forward.pod_socket = pod_socket
        self.selector.register(pod_socket, selectors.EVENT_READ, forward)
        if forward.client_done:
            with contextlib.suppress(OSError):
                pod_socket.shutdown(socket.SHUT_WR)

    def _on_data(self, frame: DataFrame) -> None:
        forward = self.by_stream.get(frame.stream_id)
        if forward is None or frame.stream_id != forward.data_stream:
            return  # the error stream carries nothing from the client but its FIN
        if forward.pod_socket is not None and frame.payload and not forward.client_done:
            try:
                forward.pod_socket.sendall(frame.payload)
            except OSError as error:
                self._fail(forward, f"error writing to port {forward.port} of the pod: {error}")
                return
        if frame.fin:
            forward.client_done = True
            if forward.pod_socket is not None:
                with contextlib.suppress(OSError):
                    forward.pod_socket.shutdown(socket.SHUT_WR)
            self._finish_if_done(forward)

    def _on_reset(self, stream_id: int) -> None:
        forward = self.by_stream.get(stream_id)
        if forward is None:
            return
        if stream_id == forward.data_stream:
            # kubectl resets the data stream once it has the pod's FIN: nothing more either way.
            forward.client_done = forward.pod_done = True
            self._close_error_stream(forward)
            self._finish_if_done(forward)
        else:
            forward.error_closed = True

    # ---- bytes from the pod ------------------------------------------------------------------

    def _from_pod(self, forward: _Forward) -> None:
        if forward.pod_socket is None or forward.data_stream is None:
            return  # closed by a frame handled earlier in the same round
        try:
            data = forward.pod_socket.recv(CHUNK_BYTES)
        except OSError:  # reset by the pod: end the stream like an EOF
            data = b""
        if data:
            self._send(data_frame(forward.data_stream, data))
            return
        forward.pod_done = True
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(forward.pod_socket)
        self._send(data_frame(forward.data_stream, b"", fin=True))
        self._close_error_stream(forward)
        self._finish_if_done(forward)

    # ---- endings ---------------------------------------------------------------------------------

    def _fail(self, forward: _Forward, message: str) -> None:
        """As the kubelet: the message on the error stream, then both streams reset."""
        if forward.error_stream is not None and not forward.error_closed:
            self._send(data_frame(forward.error_stream, message.encode()[:CHUNK_BYTES], fin=True))
            forward.error_closed = True
        if forward.data_stream is not None:
            self._send(rst_stream(forward.data_stream, RstStatus.CANCEL))
        forward.client_done = forward.pod_done = True
        self._finish_if_done(forward)

    def _close_error_stream(self, forward: _Forward) -> None:
        if forward.error_stream is not None and not forward.error_closed:
            forward.error_closed = True
            self._send(data_frame(forward.error_stream, b"", fin=True))

    def _finish_if_done(self, forward: _Forward) -> None:
        if not (forward.client_done and forward.pod_done):
            return
        self._close_pod_socket(forward)
        self.forwards.pop(forward.request_id, None)
        for stream_id in (forward.error_stream, forward.data_stream):
            if stream_id is not None:
                self.by_stream.pop(stream_id, None)

    def _close_pod_socket(self, forward: _Forward) -> None:
        if forward.pod_socket is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(forward.pod_socket)
        forward.pod_socket.close()
        forward.pod_socket = None

    def _send(self, frame: bytes) -> None:
        self.connection.sendall(frame)
