"""The relay's TLS on the local cluster, without a cluster: what ``deploy_relay`` and the demo apply
(``local_cluster.relay``, ``relay_tls``) for each switch, and the harness's verification of a
simulator reached by address under its Service's name. The e2e side is
``tests/e2e/test_service_failover.py``."""

from __future__ import annotations

import contextlib
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from local_cluster.relay import (
    BACKEND_IMAGE,
    CLOUD_IMAGE,
    RelayTls,
    relay_brokercluster,
    relay_secrets,
    relay_simulators,
    simulator_objects,
)
from local_cluster.relay_tls import SimulatorsPki, create_simulators_pki, service_context

NAMESPACE = "ns1"
BACKEND_ARGS = ["--account=acme", "--streams=2"]
CLOUD_ARGS = ["--inbound-streams=2"]
PLAIN = RelayTls(upstream=False, broker=False)


@pytest.fixture(scope="module")
def pki() -> SimulatorsPki:
    return create_simulators_pki(NAMESPACE, backend_client=True)


def _by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {item["metadata"]["name"]: item for item in objects if item["kind"] == kind}


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["spec"]["containers"][0])


def test_the_plain_http_opt_out_applies_what_the_relay_applied_before_tls() -> None:
    token_env = [
        {
            "name": "BROKER_BACKEND_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "erp-broker-credential", "key": "token"}},
        }
    ]
    before = [
        *simulator_objects("cloud", CLOUD_IMAGE, CLOUD_ARGS),
        *simulator_objects(
            "backend",
            BACKEND_IMAGE,
            [f"--broker-url=http://orders-active.{NAMESPACE}.svc:8080", *BACKEND_ARGS],
            token_env,
        ),
    ]
    assert relay_simulators(NAMESPACE, PLAIN, backend_args=BACKEND_ARGS, cloud_args=CLOUD_ARGS) == before
    assert "volumes" not in before[0]["spec"] and "volumeMounts" not in _container(before[0])
    secrets = _by_kind(relay_secrets(NAMESPACE, PLAIN, PLAIN.pki(NAMESPACE)), "Secret")
    assert sorted(secrets) == ["erp-broker-credential", "erp-cloud-key", "erp-endpoints", "erp-login"]
    assert secrets["erp-endpoints"]["stringData"] == {
        "backend": f"http://backend.{NAMESPACE}.svc:8080",
        "cloud": f"http://cloud.{NAMESPACE}.svc:8080",
    }
    assert "tls" not in relay_brokercluster(PLAIN)["spec"]


def test_by_default_the_simulators_serve_https_and_the_brokers_trust_their_ca(pki: SimulatorsPki) -> None:
    tls = RelayTls()
    assert (tls.upstream, tls.broker) == (True, True)  # BROKER_TLS: the operator's brokers serve TLS
    objects = relay_simulators(NAMESPACE, tls, backend_args=BACKEND_ARGS, cloud_args=CLOUD_ARGS)
    for name, pod in _by_kind(objects, "Pod").items():
        container = _container(pod)
        assert "--tls-dir=/etc/simulator-tls" in container["args"]
        # The backend also mounts the brokers' CA (BROKER_TLS; below); the serving Secret is the same.
        serving_mount = {"name": "tls", "mountPath": "/etc/simulator-tls", "readOnly": True}
        assert container["volumeMounts"][0] == serving_mount
        assert pod["spec"]["volumes"][0] == {"name": "tls", "secret": {"secretName": f"{name}-simulator-tls"}}
        assert container["readinessProbe"] == {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    backend = _container(_by_kind(objects, "Pod")["backend"])
    assert f"--broker-url=https://orders-active.{NAMESPACE}.svc:8080" in backend["args"]  # BROKER_TLS
    assert "--broker-ca-file=/etc/broker-ca/ca.crt" in backend["args"]

    secrets = _by_kind(relay_secrets(NAMESPACE, tls, pki), "Secret")
    assert secrets["erp-endpoints"]["stringData"] == {
        "backend": f"https://backend.{NAMESPACE}.svc:8080",
        "cloud": f"https://cloud.{NAMESPACE}.svc:8080",
    }
    ca = secrets["simulators-ca"]
    assert ca["metadata"]["labels"] == {"broker.failover.dev/credential": "true"}
    assert ca["stringData"] == {"ca.crt": pki.ca.decode()}
    for name in ("cloud", "backend"):
        serving = secrets[f"{name}-simulator-tls"]
        assert serving["type"] == "kubernetes.io/tls" and "labels" not in serving["metadata"]
        assert set(serving["stringData"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert relay_brokercluster(tls)["spec"]["tls"] == {"upstreamCASecretRef": {"name": "simulators-ca"}}
    # A spec's own tls replaces the relay's whole, as any top-level field does.
    assert relay_brokercluster(tls, {"tls": {"mode": "Disabled"}})["spec"]["tls"] == {"mode": "Disabled"}


def test_broker_tls_verifies_the_active_service_against_the_operators_ca_alone() -> None:
    tls = RelayTls(broker=True, backend_client_certificate=True)
    pods = _by_kind(relay_simulators(NAMESPACE, tls, backend_args=BACKEND_ARGS, cloud_args=CLOUD_ARGS), "Pod")
    backend = _container(pods["backend"])
    assert backend["args"][2] == f"--broker-url=https://orders-active.{NAMESPACE}.svc:8080"
    assert {
        "--broker-ca-file=/etc/broker-ca/ca.crt",
        "--client-cert-file=/etc/backend-client-tls/tls.crt",
        "--client-key-file=/etc/backend-client-tls/tls.key",
    } <= set(backend["args"])
    volumes = {volume["name"]: volume["secret"] for volume in pods["backend"]["spec"]["volumes"]}
    # Only ca.crt of the operator's Secret: tls.key beside it is the brokers' private key.
    assert volumes["broker-ca"] == {
        "secretName": "orders-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert volumes["client-tls"] == {"secretName": "backend-client-tls"}
    assert not any("subPath" in mount for pod in pods.values() for mount in _container(pod)["volumeMounts"])
    assert relay_brokercluster(tls)["spec"]["tls"]["backendClients"] == {
        "caSecretRef": {"name": "simulators-ca"},
        "allowedSubjects": ["CN=sap-erp-local,OU=Basis,O=ACME"],
    }
    with pytest.raises(ValueError, match="needs broker=True"):
        RelayTls(broker=False, backend_client_certificate=True)


@contextlib.contextmanager
def _serving(cert: bytes, key: bytes) -> Iterator[int]:
    """A TLS listener on 127.0.0.1 with ``cert``, answering each handshake with one byte."""
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "c.pem").write_bytes(cert)
        (Path(directory) / "k.pem").write_bytes(key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(Path(directory) / "c.pem", Path(directory) / "k.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with (
                contextlib.suppress(OSError),
                listener.accept()[0] as raw,
                context.wrap_socket(raw, server_side=True) as tls,
            ):
                tls.sendall(b"!")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def _handshake(context: ssl.SSLContext, port: int) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return tls.recv(1)


def test_the_harness_verifies_a_simulator_dialled_by_address_under_its_service_name(
    pki: SimulatorsPki,
) -> None:
    with _serving(*pki.servers["cloud"]) as port:
        for name in (
            "cloud",
            f"cloud.{NAMESPACE}",
            f"cloud.{NAMESPACE}.svc",
            f"cloud.{NAMESPACE}.svc.cluster.local",
        ):
            assert _handshake(service_context(pki.ca, name), port) == b"!", name
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            _handshake(service_context(pki.ca, f"backend.{NAMESPACE}.svc"), port)
        other = create_simulators_pki("other")
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            _handshake(service_context(other.ca, f"cloud.{NAMESPACE}.svc"), port)
