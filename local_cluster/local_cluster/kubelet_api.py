"""The node agent's kubelet API: enough for ``kubectl logs`` and ``port-forward``, over mutual TLS.

``kubectl logs`` asks the apiserver, which proxies to the kubelet of the pod's node
(the Node's InternalIP and ``status.daemonEndpoints.kubeletEndpoint.Port``) as
``GET /containerLogs/{namespace}/{pod}/{container}?follow=..&previous=..``; ``kubectl
port-forward`` as an upgrade of ``/portForward/{namespace}/{pod}`` to SPDY/3.1. This module
serves those endpoints over HTTPS from a thread of the node agent (stdlib ``http.server``
with one thread per connection, TLS handshake in that thread):

- TLS with the kubelet serving certificate (``pki.py``: SANs 127.0.0.1, 10.244.0.1,
  localhost), and clients must present a certificate signed by the cluster CA (the
  apiserver's ``--kubelet-client-certificate``); others fail the handshake. There is
  no authorization step (a real kubelet asks the apiserver with a
  SubjectAccessReview): any CA-signed client may read any log.
- Which file a request means is ``container_logs`` (404 ``pod "p" does not exist``,
  ``container "c" not found in pod "p"``); what it gets from it, and following it, is
  ``log_streaming``.
- ``/portForward`` checks the upgrade, answers 101 and hands the connection (and its thread)
  to ``port_forward``, which connects to the pod's ports inside its network namespace. The
  upgrade request's headers are logged at INFO: which protocol reaches the kubelet is visible
  in the node agent's log.

What it does not do: ``exec``, ``attach``, ``/stats``, ``/metrics``, ``/pods``: only
``/containerLogs``, ``/portForward`` and ``/healthz``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from local_cluster.container_logs import ContainerLogSource, LogLookup, LogRequestError
from local_cluster.log_streaming import LogOptions, LogStream, select_log
from local_cluster.port_forward import (
    PodEndpointLookup,
    PortForwardSession,
    negotiate,
    upgrade_response,
)

log = logging.getLogger("node-agent.kubelet-api")

CONNECTION_TIMEOUT_SECONDS = 30.0  # TLS handshake, request, and any one write to a stalled client


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
        if len(parts) >= 2 and parts[1] == "portForward":
            self._port_forward([unquote(part) for part in parts[2:4]])
            return
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

    def do_POST(self) -> None:
        # kubectl's SPDY dialer (and the API server after it) upgrade with POST; WebSocket with GET.
        if urlsplit(self.path).path.split("/")[1:2] == ["portForward"]:
            self.do_GET()
        else:
            self._reply_text(404, "404 page not found")

    def _port_forward(self, names: list[str]) -> None:
        namespace, pod = ([*names, "", ""])[:2]
        upgrade_headers = {
            name: self.headers.get_all(name) or []
            for name in ("Connection", "Upgrade", "X-Stream-Protocol-Version", "Sec-WebSocket-Protocol")
        }
        log.info("port-forward %s %s: %s", self.command, self.path, upgrade_headers)
        try:
            if not (namespace and pod):
                raise LogRequestError(
                    400, "pod namespace and name are required: /portForward/{namespace}/{pod}"
                )
            if self.server.endpoints is None:
                raise LogRequestError(501, "port-forward is not served by this node agent")
            protocol = negotiate({name.lower(): values for name, values in upgrade_headers.items()})
            endpoint = self.server.endpoints(namespace, pod)
        except LogRequestError as error:
            self._reply_text(error.status, error.message)
            return
        self.close_connection = True
        self.wfile.write(upgrade_response(protocol))
        description = f"port-forward {namespace}/{pod} from {self.client_address[0]}:{self.client_address[1]}"
        log.info("%s: upgraded (%s)", description, protocol or "no protocol version")
        reason = PortForwardSession(self.connection, endpoint, description, self.server.stopping).run()
        log.info("%s: ended: %s", description, reason)

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
        selection = select_log(pod, container, source, options)  # refusals come before any reply
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        stream = LogStream(
            self.wfile.write,
            self.connection,
            lookup=self.server.lookup,
            stopping=self.server.stopping,
            connection_timeout=CONNECTION_TIMEOUT_SECONDS,
        )
        budget = stream.emit(selection.content, options.limit_bytes)
        if selection.follow_pgid is None or budget == 0:
            return
        stream.follow((namespace, pod, container), source.path, selection.end, selection.follow_pgid, budget)


class KubeletApiServer(ThreadingHTTPServer):
    """HTTPS, client certificates required; the TLS handshake runs in each connection's thread."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        address: tuple[str, int],
        context: ssl.SSLContext,
        lookup: LogLookup,
        endpoints: PodEndpointLookup | None = None,
    ) -> None:
        super().__init__(address, _LogHandler)
        self.context = context
        self.lookup = lookup
        self.endpoints = endpoints
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
    *,
    host: str,
    port: int,
    cert: Path,
    key: Path,
    client_ca: Path,
    lookup: LogLookup,
    endpoints: PodEndpointLookup | None = None,
) -> KubeletApi:
    """Serve ``/containerLogs`` and ``/portForward`` on ``host:port`` (0: a free port) in a daemon thread.

    ``endpoints`` finds a pod's network for port-forward (None: port-forward answers 501).
    """
    server = KubeletApiServer((host, port), server_tls_context(cert, key, client_ca), lookup, endpoints)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="kubelet-api")
    thread.daemon = True
    thread.start()
    log.info("kubelet API (container logs, port-forward) on https://%s:%d", host, server.server_address[1])
    return KubeletApi(server=server, thread=thread)
