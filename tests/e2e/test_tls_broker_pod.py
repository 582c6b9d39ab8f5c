"""A broker pod as the operator builds it under ``spec.tls``, on the real kubelet (issue 41, part 3a).

The pod is made from ``builders`` with TLS served (``serve_tls=True``, what the operator does once
it issues certificates and speaks TLS), in mode Secrets with backend client certificates, its
Secrets of cert-manager's shape made here with ``local_cluster.broker_certificates``. What only
the real kubelet and broker can show: the projected volume gives the broker a TLS directory it
starts with (it refuses to start on a broken one), the kubelet's HTTPS probes make it Ready, the
main port serves the Secret's certificate, and a pod whose Secret does not exist stays in
ContainerCreating with the kubelet naming the Secret.

Waits are bounded failure limits, not performance assertions.
"""

from __future__ import annotations

import json
import socket
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_operator.controller import builders, names, verifiers
from broker_operator.controller.spec import ClusterSpec, parse_spec
from local_cluster import netns
from local_cluster.broker_certificates import create_ca, tls_secret
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import wait_for

pytestmark = pytest.mark.e2e

CLUSTER = "secure"
SERVER_NAME = "secure-active.example"
TLS = {
    "mode": "Secrets",
    "secrets": {"server": "secure-broker-tls", "operatorClient": "secure-operator-tls"},
    "backendClients": {
        "caSecretRef": {"name": "secure-sap-ca"},
        "allowedSubjects": ["CN=SAP-ERP-PRD,O=Example"],
    },
}


@pytest.fixture(scope="module")
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    name = f"tls-pod-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", name)
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def secret(namespace: str, name: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls" if "tls.key" in data else "Opaque",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {key: value.decode() for key, value in data.items()},
    }


def broker_pod(namespace: str, name: str, spec: ClusterSpec) -> list[dict[str, Any]]:
    """Pod ``name`` from the operator's builders with TLS served, and its journal claim."""
    container = builders.broker_container(CLUSTER, spec, serve_tls=True)
    container["imagePullPolicy"] = "Never"
    volumes = builders.pod_volumes(CLUSTER, 0, spec, serve_tls=True)
    for volume in volumes:  # one claim per pod here
        if "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] = f"journal-{name}"
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"journal-{name}", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": builders.pod_security_context(spec),
            "containers": [container],
            "volumes": volumes,
        },
    }
    return [claim, pod]


def apply(cluster: SealedCluster, objects: list[dict[str, Any]]) -> None:
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )


def served_certificate(cluster: SealedCluster, address: str, ca: Path) -> str:
    """``GET /healthz`` over TLS on the main port, verifying the certificate against ``ca`` under
    its DNS name (the pod is dialled by IP, as the operator does), from the cluster's network."""

    def call() -> str:
        context = ssl.create_default_context(cafile=str(ca))
        with (
            socket.create_connection((address, names.BROKER_PORT), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls,
        ):
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: broker\r\nConnection: close\r\n\r\n")
            return tls.recv(4096).decode(errors="replace")

    return cluster.call_in_network(call, timeout=40)


def test_a_tls_broker_pod_starts_serves_its_certificate_and_waits_for_a_missing_secret(
    sealed_cluster: SealedCluster, namespace: str, tmp_path: Path
) -> None:
    operator_ca = create_ca(tmp_path / "operator", "secure-operator")
    server = operator_ca.issue_server("server", [SERVER_NAME])
    client = operator_ca.issue_client("operator", "/CN=broker-failover-operator")
    sap_ca = create_ca(tmp_path / "sap", "sap-customer")
    spec = parse_spec(
        CLUSTER,
        {
            "account": "acme",
            "company": "1000",
            "backend": {"url": f"http://{netns.NODE_ADDRESS}:9"},
            "cloud": {"url": f"http://{netns.NODE_ADDRESS}:9"},
            "tls": TLS,
        },
    )
    objects = [
        secret(namespace, "secure-broker-tls", tls_secret(server, [operator_ca.cert])),
        secret(namespace, "secure-operator-tls", tls_secret(client, [operator_ca.cert])),
        secret(namespace, "secure-sap-ca", {"ca.crt": sap_ca.cert.read_bytes()}),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": names.verifier_secret_name(CLUSTER), "namespace": namespace},
            "stringData": verifiers.verifier_data("o" * 32, "b" * 32),
        },
        *broker_pod(namespace, "broker-0", spec),
    ]
    apply(sealed_cluster, objects)

    def status(name: str) -> dict[str, Any]:
        body = sealed_cluster.get_json(namespace, "pod", name) or {}
        statuses = body.get("status", {}).get("containerStatuses") or [{}]
        return {"pod": body, **statuses[0]}

    # Ready by the kubelet's HTTPS readiness probe: the broker started with the projected TLS
    # directory, the backend clients' CA and the subjects (it refuses to start on any bad one).
    wait_for("broker-0 Ready over HTTPS probes", lambda: status("broker-0").get("ready"), 120)
    assert status("broker-0").get("restartCount") == 0
    probe = status("broker-0")["pod"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["scheme"] == "HTTPS"
    address = status("broker-0")["pod"]["status"]["podIP"]
    assert served_certificate(sealed_cluster, address, operator_ca.cert).startswith("HTTP/1.1 200")

    # A Secret that does not exist: the kubelet does not start the container, and says which.
    missing = parse_spec(
        CLUSTER,
        {
            "account": "acme",
            "company": "1000",
            "tls": {**TLS, "secrets": {"server": "no-such-tls", "operatorClient": "secure-operator-tls"}},
        },
    )
    apply(sealed_cluster, broker_pod(namespace, "broker-1", missing))

    def mount_failure() -> str | None:
        events = sealed_cluster.get_json(
            namespace, "events", "--field-selector", "involvedObject.name=broker-1,reason=FailedMount"
        )
        messages = [e.get("message", "") for e in (events or {}).get("items", [])]
        return next((m for m in messages if "no-such-tls" in m), None)

    assert "not found" in wait_for("the kubelet's FailedMount naming the Secret", mount_failure, 120)
    waiting = status("broker-1").get("state", {}).get("waiting", {}).get("reason")
    assert waiting in (None, "ContainerCreating"), status("broker-1")
    assert status("broker-1")["pod"]["status"]["phase"] == "Pending"
