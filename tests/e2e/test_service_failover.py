"""Failover through the ``<cluster>-active`` Service, on the sealed pod network, as users run it.

The chart's operator runs as a pod (in-cluster config through the ``kubernetes`` Service), the
brokers are the example's pods, and the SAP backend and the cloud are simulator pods: the
backend sends to ``http://orders-active.<namespace>.svc:8080`` through CoreDNS and kube-proxy,
and the brokers reach both simulators by their Service names. The active broker is killed
with kill -9 mid-stream; the Service follows the ``role=active`` label to the other broker.
Proof comes from the simulators' own records: every message arrived, none twice, each
stream in order, in both directions. The same story runs with a real network partition of the
active pod (nftables drops on its interface, both directions) instead of kill -9.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from local_cluster.cluster import REPO_ROOT
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import get_json, wait_for

CHART = REPO_ROOT / "charts" / "broker-failover"
EXAMPLE = REPO_ROOT / "examples" / "brokercluster-pods.yaml"
STREAMS, MESSAGES = 4, 150  # per stream, per direction
SIM_PORT = 8080


def _simulator(name: str, image: str, args: list[str]) -> list[dict[str, Any]]:
    labels = {"app": name}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "args": ["--host=0.0.0.0", f"--port={SIM_PORT}", *args],
                    "readinessProbe": {"tcpSocket": {"port": SIM_PORT}, "periodSeconds": 1},
                }
            ]
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": labels, "ports": [{"port": SIM_PORT, "targetPort": SIM_PORT}]},
    }
    return [pod, service]


@pytest.fixture
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    name = f"svc-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", name)
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _http_json(cluster: SealedCluster, url: str, payload: dict[str, Any] | None = None) -> Any:
    def call() -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())

    return cluster.call_in_network(call)


def _service_url(cluster: SealedCluster, namespace: str, name: str) -> str:
    ip = get_json(cluster, namespace, "service", name)["spec"]["clusterIP"]
    return f"http://{ip}:{SIM_PORT}"


def _kill_9(cluster: SealedCluster, pod: dict[str, Any]) -> None:
    container = pod["status"]["containerStatuses"][0]["containerID"]
    os.killpg(int(container.removeprefix("local://")), signal.SIGKILL)


def _partition(cluster: SealedCluster, pod: dict[str, Any]) -> None:
    cluster.partition_pod(pod["metadata"]["uid"], "both")


def test_a_kill_9_of_the_active_broker_fails_over_through_the_active_service(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    _fail_over_under_traffic(sealed_cluster, namespace, _kill_9)


def test_a_network_partition_of_the_active_broker_fails_over_through_the_active_service(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    _fail_over_under_traffic(sealed_cluster, namespace, _partition)


def _fail_over_under_traffic(
    cluster: SealedCluster, namespace: str, fault: Callable[[SealedCluster, dict[str, Any]], None]
) -> None:
    wait_for("default ServiceAccount", lambda: get_json(cluster, namespace, "serviceaccount", "default"))
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "broker-message-logs"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(claim))
    # The chart's operator as a pod: in-cluster config through the `kubernetes` Service.
    cluster.helm(
        "install", f"bf-{namespace}", str(CHART), "--namespace", namespace,
        "--set", f"operator.watchNamespaces={{{namespace}}}", "--wait", "--timeout=180s",
    )  # fmt: skip
    token = os.urandom(16).hex()
    cluster.kubectl("-n", namespace, "create", "secret", "generic", "erp-broker-credential",
                    f"--from-literal=token={token}")  # fmt: skip
    cluster.kubectl("-n", namespace, "create", "secret", "generic", "backend-token",
                    f"--from-literal=token={token}")  # fmt: skip
    backend_service = f"http://backend.{namespace}.svc:{SIM_PORT}"
    cloud_service = f"http://cloud.{namespace}.svc:{SIM_PORT}"
    cluster.kubectl("-n", namespace, "create", "secret", "generic", "erp-endpoints",
                    f"--from-literal=backend={backend_service}",
                    f"--from-literal=cloud={cloud_service}")  # fmt: skip
    objects = [
        *_simulator(
            "cloud",
            "broker-failover/cloud-simulator",
            [f"--inbound-streams={STREAMS}", f"--inbound-messages-per-stream={MESSAGES}"],
        ),
        *_simulator(
            "backend",
            "broker-failover/backend-simulator",
            [
                # The one address a producer follows: the -active Service, by its DNS name.
                f"--broker-url=http://orders-active.{namespace}.svc:8080",
                "--account=acme",
                "--company=1000",
                f"--streams={STREAMS}",
                f"--messages-per-stream={MESSAGES}",
                "--bundle-size=20",
                "--lanes=2",
            ],
        ),
    ]
    objects[2]["spec"]["containers"][0]["env"] = [
        {
            "name": "BROKER_BACKEND_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "backend-token", "key": "token"}},
        }
    ]
    cluster.kubectl(
        "-n",
        namespace,
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )
    cluster.kubectl("-n", namespace, "apply", "-f", str(EXAMPLE))

    def status() -> dict[str, Any]:
        body = get_json(cluster, namespace, "brokercluster", "orders") or {}
        return body.get("status") or {}

    first = wait_for(
        "the cluster Healthy with an active broker",
        lambda: (s := status()).get("phase") == "Healthy" and s.get("active") and s,
        timeout=180,
    )
    active = str(first["active"])
    wait_for(
        "both simulators ready",
        lambda: all(
            (get_json(cluster, namespace, "pod", name) or {}).get("status", {}).get("conditions")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in get_json(cluster, namespace, "pod", name)["status"]["conditions"]
            )
            for name in ("cloud", "backend")
        ),
        timeout=120,
    )
    backend = _service_url(cluster, namespace, "backend")
    cloud = _service_url(cluster, namespace, "cloud")
    _http_json(cluster, f"{backend}/sim/start", {})
    total = STREAMS * MESSAGES
    wait_for(
        "a third of the outbound messages confirmed through the Service",
        lambda: int(_http_json(cluster, f"{backend}/sim/status")["confirmed"]) >= total // 3,
        timeout=120,
        interval=0.1,
    )
    fault(cluster, get_json(cluster, namespace, "pod", active))
    after = wait_for(
        "a failover to the other broker",
        lambda: (s := status()).get("active") not in (None, active) and s,
        timeout=90,
    )
    wait_for(
        "every message confirmed, both ways",
        lambda: (
            bool(_http_json(cluster, f"{backend}/sim/status")["allConfirmed"])
            and bool(_http_json(cluster, f"{cloud}/sim/status")["inboundAllConfirmed"])
        ),
        timeout=240,
        interval=1,
    )
    slices = get_json(cluster, namespace, "endpointslices", "-l", "kubernetes.io/service-name=orders-active")
    addresses = [
        address
        for item in slices["items"]
        for endpoint in item.get("endpoints") or []
        for address in endpoint["addresses"]
    ]
    new_active = get_json(cluster, namespace, "pod", str(after["active"]))
    assert addresses == [new_active["status"]["podIP"]]

    outbound = _http_json(cluster, f"{cloud}/sim/received")
    inbound = _http_json(cluster, f"{backend}/sim/received")
    cluster.helm("uninstall", f"bf-{namespace}", "--namespace", namespace, "--wait", check=False)
    cluster.kubectl("-n", namespace, "delete", "brokercluster", "orders", "--wait=false", check=False)
    assert len(outbound) == STREAMS and len(inbound) == STREAMS
    for stream, seqs in [*outbound.items(), *inbound.items()]:
        assert seqs == list(range(1, MESSAGES + 1)), f"{stream}: lost, duplicated or out of order"
