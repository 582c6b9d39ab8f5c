"""TLS for the relay on the local cluster (``relay.deploy_relay``, the demo): the simulators' PKI,
the Secrets that carry it and the parts of the simulator pods that mount them.

ARCHITECTURE.md "Channels and trust": every channel is TLS by default, and the simulators speak it
too, so the demo, the e2e tests, the soak and the benchmarks run the path users run. Per run, the
openssl helpers of :mod:`local_cluster.broker_certificates` make a CA that stands for the targets'
(SAP's and the cloud's) public or company PKI, and from it:

* a serving certificate for each simulator, naming its Service as a pod reaches it
  (``cloud``, ``cloud.<ns>``, ``cloud.<ns>.svc``, ``cloud.<ns>.svc.cluster.local``; the same for
  ``backend``), in a ``kubernetes.io/tls`` Secret ``<simulator>-simulator-tls`` that the simulator's
  pod mounts whole (never ``subPath``) and serves with ``--tls-dir``;
* the CA alone, ``ca.crt`` of Secret ``simulators-ca``, labelled as a credential: the BrokerCluster's
  ``spec.tls.upstreamCASecretRef``, the bundle its brokers verify the ``https://`` URLs of
  ``erp-endpoints`` against;
* the SAP backend's client certificate (``/O=ACME/OU=Basis/CN=sap-erp-local``), in Secret
  ``backend-client-tls``: made only when the backend is to present one to brokers that serve TLS,
  with ``simulators-ca`` as the brokers' ``spec.tls.backendClients`` CA.

The backend → broker leg needs the brokers to serve TLS, which the operator's
``ControllerSettings.broker_tls`` does by default (the chart's ``operator.brokerTls``). Given
``broker_tls``, the backend pod
mounts ``ca.crt`` alone of the operator-written ``<cluster>-tls`` (``items``: never the key beside
it) and calls ``https://<cluster>-active.<ns>.svc:8080`` verified against it.

The harness calls the simulators' ``/sim`` API from the cluster's network namespace, where there is
no cluster DNS: it dials the ClusterIP and verifies the certificate for the Service's DNS name
(:func:`service_context`), as a pod that dials the name would. Verification is never turned off.

Not here: applying anything (``relay.deploy_relay``), and the operator's own certificates
(``broker_operator.pki``).
"""

from __future__ import annotations

import socket
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from broker_contracts.tls import MINIMUM_VERSION, TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE
from broker_operator.controller.names import tls_secret_name
from local_cluster.broker_certificates import create_ca
from local_cluster.netns import CLUSTER_DOMAIN
from local_cluster.run_pki import BACKEND_SUBJECT, BACKEND_SUBJECT_ALLOWED

Manifest = dict[str, Any]

SIMULATORS: Final = ("backend", "cloud")  # each its pod and a Service of the same name
SIMULATORS_CA_SECRET: Final = "simulators-ca"
BACKEND_CLIENT_SECRET: Final = "backend-client-tls"
CREDENTIAL_LABEL: Final = {"broker.failover.dev/credential": "true"}  # docs/operator.md, "Credentials"

SERVING_MOUNT: Final = "/etc/simulator-tls"
BROKER_CA_MOUNT: Final = "/etc/broker-ca"
BACKEND_CLIENT_MOUNT: Final = "/etc/backend-client-tls"


def serving_secret_name(simulator: str) -> str:
    return f"{simulator}-simulator-tls"


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a pod reaches a Service by, shortest first (the search path's forms)."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}",
    ]


def service_host(service: str, namespace: str) -> str:
    """The name the harness verifies a simulator's certificate for (and a pod would dial)."""
    return f"{service}.{namespace}.svc"


@dataclass(frozen=True)
class SimulatorsPki:
    """One relay's PKI, as PEM bytes (the files openssl wrote are gone)."""

    namespace: str
    ca: bytes
    servers: Mapping[str, tuple[bytes, bytes]]  # simulator: (certificate, key)
    backend_client: tuple[bytes, bytes] | None  # (certificate, key), or None: none made


def create_simulators_pki(namespace: str, *, backend_client: bool = False) -> SimulatorsPki:
    """The CA and the simulators' serving certificates for ``namespace`` (about a second), and with
    ``backend_client`` the backend's client certificate."""
    with tempfile.TemporaryDirectory(prefix="relay-pki-") as directory:
        ca = create_ca(Path(directory), "broker-failover-simulators")
        servers = {}
        for simulator in SIMULATORS:
            files = ca.issue_server(f"{simulator}-server", service_dns_names(simulator, namespace))
            servers[simulator] = (files.cert.read_bytes(), files.key.read_bytes())
        client = None
        if backend_client:
            files = ca.issue_client("backend-client", BACKEND_SUBJECT)
            client = (files.cert.read_bytes(), files.key.read_bytes())
        return SimulatorsPki(
            namespace=namespace, ca=ca.cert.read_bytes(), servers=servers, backend_client=client
        )


def _secret(name: str, namespace: str, data: Mapping[str, bytes], *, kind: str, credential: bool) -> Manifest:
    meta: Manifest = {"name": name, "namespace": namespace}
    if credential:
        meta["labels"] = dict(CREDENTIAL_LABEL)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": kind,
        "metadata": meta,
        "stringData": {key: value.decode() for key, value in data.items()},
    }


def pki_secrets(pki: SimulatorsPki) -> list[Manifest]:
    """The Secrets of :class:`SimulatorsPki`. The serving ones are the simulators' alone, so they do
    not opt in as credentials; ``simulators-ca`` does, for the operator to mount it into brokers."""
    secrets = [
        _secret(SIMULATORS_CA_SECRET, pki.namespace, {TLS_CA_FILE: pki.ca}, kind="Opaque", credential=True)
    ]
    for simulator, (cert, key) in pki.servers.items():
        files = {TLS_CERT_FILE: cert, TLS_KEY_FILE: key, TLS_CA_FILE: pki.ca}
        secrets.append(
            _secret(
                serving_secret_name(simulator),
                pki.namespace,
                files,
                kind="kubernetes.io/tls",
                credential=False,
            )
        )
    if pki.backend_client is not None:
        cert, key = pki.backend_client
        files = {TLS_CERT_FILE: cert, TLS_KEY_FILE: key}
        secrets.append(
            _secret(BACKEND_CLIENT_SECRET, pki.namespace, files, kind="kubernetes.io/tls", credential=False)
        )
    return secrets


@dataclass(frozen=True)
class SecretMount:
    """A Secret as a read-only volume of a simulator pod, whole or only ``keys`` (never ``subPath``:
    a volume is what the kubelet keeps in step with its Secret)."""

    volume: str
    secret: str
    path: str
    keys: tuple[str, ...] = ()

    def pod_volume(self) -> Manifest:
        source: Manifest = {"secretName": self.secret}
        if self.keys:
            source["items"] = [{"key": key, "path": key} for key in self.keys]
        return {"name": self.volume, "secret": source}

    def container_mount(self) -> Manifest:
        return {"name": self.volume, "mountPath": self.path, "readOnly": True}


def serving(simulator: str) -> tuple[SecretMount, list[str]]:
    """A simulator serving HTTPS with its certificate: the mount and its flag."""
    mount = SecretMount("tls", serving_secret_name(simulator), SERVING_MOUNT)
    return mount, [f"--tls-dir={SERVING_MOUNT}"]


def calling_brokers(cluster: str, *, client_certificate: bool) -> tuple[list[SecretMount], list[str]]:
    """The backend calling ``https://`` brokers: the operator-written CA of ``<cluster>-tls`` (its
    ``ca.crt`` only; the Secret holds the brokers' key as well) and, with ``client_certificate``,
    the backend's own certificate: the mounts and their flags."""
    mounts = [SecretMount("broker-ca", tls_secret_name(cluster), BROKER_CA_MOUNT, (TLS_CA_FILE,))]
    args = [f"--broker-ca-file={BROKER_CA_MOUNT}/{TLS_CA_FILE}"]
    if client_certificate:
        mounts.append(SecretMount("client-tls", BACKEND_CLIENT_SECRET, BACKEND_CLIENT_MOUNT))
        args += [
            f"--client-cert-file={BACKEND_CLIENT_MOUNT}/{TLS_CERT_FILE}",
            f"--client-key-file={BACKEND_CLIENT_MOUNT}/{TLS_KEY_FILE}",
        ]
    return mounts, args


def brokercluster_tls(*, upstream: bool, backend_client_certificate: bool) -> Manifest | None:
    """The BrokerCluster's ``spec.tls`` for the relay, or None (the example's default, unchanged):
    ``upstream``: trust the simulators' CA for the ``https://`` URLs; ``backend_client_certificate``:
    let only the backend's certificate send (brokers that serve TLS require it)."""
    tls: Manifest = {}
    if upstream:
        tls["upstreamCASecretRef"] = {"name": SIMULATORS_CA_SECRET}
    if backend_client_certificate:
        tls["backendClients"] = {
            "caSecretRef": {"name": SIMULATORS_CA_SECRET},
            "allowedSubjects": [BACKEND_SUBJECT_ALLOWED],
        }
    return tls or None


class _ServiceNameContext(ssl.SSLContext):
    """A client context that verifies every peer for one fixed name, whatever address was dialled."""

    service_name: str

    def wrap_socket(  # noqa: PLR0917 (ssl.SSLContext.wrap_socket's own signature)
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        del server_hostname  # the ClusterIP the caller dialled: not what the certificate names
        return super().wrap_socket(
            sock, server_side, do_handshake_on_connect, suppress_ragged_eofs, self.service_name, session
        )


def service_context(ca: bytes, service_name: str) -> ssl.SSLContext:
    """How the harness calls a simulator through its ClusterIP: the chain verified against ``ca``
    and the host name against ``service_name`` (the Service's DNS name, which the host cannot
    resolve: cluster DNS is for pods), as a pod that dials the name would verify them."""
    context = _ServiceNameContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    context.minimum_version = MINIMUM_VERSION  # the floor every channel shares
    context.load_verify_locations(cadata=ca.decode())
    context.service_name = service_name
    return context
