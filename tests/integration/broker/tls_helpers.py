"""TLS for the broker's integration tests: a PKI made with openssl, a broker that serves it, clients.

:func:`make_pki` issues everything the tests need from three CAs, once per module: the operator's
(the broker's serving certificate and the operator's client certificate), a rogue one (a client
certificate with the operator's subject, from a CA the broker does not trust) and the customer's
(the SAP backend's client certificate, listed, and an intruder's, not). :func:`start_tls_broker`
starts a broker on those files with an admin port; :class:`TlsConnection` is ``http.client`` over a
TLS socket whose expected server name the test chooses (the brokers listen on 127.x.y.z, their
certificates name DNS names), kept alive across requests like any ``HTTPConnection``.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from broker_contracts import soap
from broker_contracts.tls import TlsDirectory, client_context
from broker_simulators.local_processes import (
    DEFAULT_BACKEND_TOKEN,
    DEFAULT_TOKEN,
    ProcessSet,
    RunningProcess,
    free_port,
    loopback_host,
)
from local_cluster.broker_certificates import (
    CertificateAuthority,
    CertificateFiles,
    create_ca,
    tls_secret,
    write_secret_volume,
)

SERVER_NAME = "acme-1000-0.acme-1000.erp.svc"
SERVICE_NAME = "acme-1000-active.erp.svc"
BACKEND_SUBJECT = "/C=DE/O=ACME/OU=Basis/CN=sap-erp-prod"
# The same subject as people write it: RFC 4514 order, other spellings of the types, spaces.
BACKEND_SUBJECT_ALLOWED = "cn=sap-erp-prod, OU=Basis, organizationName=ACME, C=DE"
INTRUDER_SUBJECT = "/C=DE/O=ACME/OU=Basis/CN=sap-erp-test"


@dataclass(frozen=True)
class Pki:
    operator_ca: CertificateAuthority
    rogue_ca: CertificateAuthority
    customer_ca: CertificateAuthority
    server: CertificateFiles
    operator: CertificateFiles
    rogue: CertificateFiles
    backend: CertificateFiles
    intruder: CertificateFiles

    def issue_server(self, name: str, *, days: int = 30) -> CertificateFiles:
        """Another serving certificate from the operator's CA (a rotation), with a new key."""
        return self.operator_ca.issue_server(name, [SERVER_NAME, SERVICE_NAME], days=days)

    def write_tls_dir(self, directory: Path, server: CertificateFiles | None = None) -> TlsDirectory:
        """``directory`` as the kubelet writes the broker's TLS Secret volume (again, for a rotation)."""
        write_secret_volume(directory, tls_secret(server or self.server, [self.operator_ca.cert]))
        return TlsDirectory(directory)


def make_pki(root: Path) -> Pki:
    operator_ca = create_ca(root / "operator", "broker-failover-operator")
    rogue_ca = create_ca(root / "rogue", "rogue")
    customer_ca = create_ca(root / "customer", "acme-sap-clients")
    return Pki(
        operator_ca=operator_ca,
        rogue_ca=rogue_ca,
        customer_ca=customer_ca,
        server=operator_ca.issue_server("broker", [SERVER_NAME, SERVICE_NAME]),
        operator=operator_ca.issue_client("operator", "/O=broker-failover/CN=broker-failover-operator"),
        rogue=rogue_ca.issue_client("rogue", "/O=broker-failover/CN=broker-failover-operator"),
        backend=customer_ca.issue_client("backend", BACKEND_SUBJECT),
        intruder=customer_ca.issue_client("intruder", INTRUDER_SUBJECT),
    )


def client_ssl(ca: Path, certificate: CertificateFiles | None = None) -> ssl.SSLContext:
    """A client context trusting ``ca`` and presenting ``certificate`` if given."""
    if certificate is None:
        return client_context(ca_file=ca)
    return client_context(ca_file=ca, cert_file=certificate.cert, key_file=certificate.key)


def readiness_ssl(ca: Path) -> ssl.SSLContext:
    """For readiness polls only: the chain is verified, the name is the tests' to check."""
    context = client_context(ca_file=ca)
    context.check_hostname = False
    return context


@dataclass
class TlsBroker:
    main: RunningProcess
    admin_port: int
    tls_dir: TlsDirectory

    @property
    def host(self) -> str:
        return self.main.host


def start_tls_broker(
    processes: ProcessSet,
    tmp_path: Path,
    pki: Pki,
    *,
    name: str = "broker-0",
    backend_url: str = "",
    cloud_url: str = "",
    allowed_subjects: bool = False,
    extra_args: tuple[str, ...] = (),
    reload_seconds: float = 0.2,
) -> TlsBroker:
    """A broker serving TLS on both ports from a fresh TLS directory, read every ``reload_seconds``;
    with ``allowed_subjects``, the main port asks for the customer's client certificates and lets
    only the backend's send."""
    tls_dir = pki.write_tls_dir(tmp_path / f"{name}-tls")
    host = loopback_host()
    admin_port = free_port(host)
    args = ["--admin-port", str(admin_port), "--tls-dir", str(tls_dir.path)]
    args += ["--tls-reload-seconds", str(reload_seconds), *extra_args]
    if allowed_subjects:
        args += ["--client-ca-file", str(pki.customer_ca.cert)]
        args += ["--allowed-client-subjects", BACKEND_SUBJECT_ALLOWED]
    main = processes.start_broker(
        tmp_path,
        name=name,
        host=host,
        backend_url=backend_url,
        cloud_url=cloud_url,
        extra_args=args,
        ready_context=readiness_ssl(pki.operator_ca.cert),
    )
    return TlsBroker(main=main, admin_port=admin_port, tls_dir=tls_dir)


class TlsConnection(http.client.HTTPConnection):
    """``http.client`` over TLS to ``host:port``, verifying the server as ``server_name``."""

    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext,
        *,
        server_name: str = SERVER_NAME,
        timeout: float = 10,
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._context = context
        self._server_name = server_name
        self.connects = 0

    def connect(self) -> None:
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)
        self.connects += 1

    @property
    def served_serial(self) -> str:
        """The serial of the certificate this connection was served."""
        assert isinstance(self.sock, ssl.SSLSocket)
        certificate = self.sock.getpeercert()
        assert certificate, "no verified server certificate"
        return str(certificate["serialNumber"])


def call(
    connection: TlsConnection, method: str, path: str, body: bytes = b"", token: str | None = None
) -> tuple[int, bytes]:
    """One request on ``connection`` (opened if it is not); ``(status, body)``."""
    headers = {"Content-Type": "text/xml; charset=utf-8"}
    if token is not None:
        headers[soap.AUTH_HEADER] = f"{soap.AUTH_SCHEME} {token}"
    connection.request(method, path, body=body or None, headers=headers)
    response = connection.getresponse()
    return response.status, response.read()


def once(  # noqa: PLR0917 - the request's parts, in the order call() takes them
    host: str,
    port: int,
    context: ssl.SSLContext,
    method: str,
    path: str,
    body: bytes = b"",
    token: str | None = None,
    *,
    server_name: str = SERVER_NAME,
) -> tuple[int, bytes]:
    """One request on a connection of its own."""
    connection = TlsConnection(host, port, context, server_name=server_name)
    try:
        return call(connection, method, path, body, token)
    finally:
        connection.close()


def served_serial(host: str, port: int, context: ssl.SSLContext) -> str:
    """The serial a new connection to ``host:port`` is served (a handshake and nothing else)."""
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls,
    ):
        certificate = tls.getpeercert()
        assert certificate
        return str(certificate["serialNumber"])


def metrics_text(broker: TlsBroker, pki: Pki) -> str:
    """``/metrics`` from the main port, over TLS without a client certificate (as a scraper)."""
    status, body = once(broker.host, broker.main.port, client_ssl(pki.operator_ca.cert), "GET", "/metrics")
    assert status == 200, body[:300]
    return body.decode()


def sample(text: str, name: str) -> float:
    """One sample (``name`` with its labels, as written) from a Prometheus text page; 0 if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


OPERATOR_TOKEN = DEFAULT_TOKEN
BACKEND_TOKEN = DEFAULT_BACKEND_TOKEN
