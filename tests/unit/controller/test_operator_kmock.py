"""The controller inside kopf against kmock: children, ownership, conflicts, invalid specs, endpoints mode.

Time is looptime's: the reconcile timer and the daemons' waits pass in loop
time, so the suite takes seconds. kmock runs no kubelet: pods never start
here, so the engine finds no broker to heartbeat in pods mode; heartbeats,
label moves and failovers against real brokers are in tests/e2e.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest

from broker_operator.controller import names
from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import (
    CLUSTERS,
    NAMESPACE,
    RECONCILE_SECONDS,
    cluster_body,
    events_of,
    eventually,
    objects_of,
    running_operator,
)

pytestmark = pytest.mark.looptime

CLUSTERS_URL = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{NAMESPACE}/{names.PLURAL}"


async def create_cluster(api: kmock.KubernetesEmulator, body: dict[str, Any]) -> None:
    response = await api.post(CLUSTERS_URL, json=body)
    assert response.status < 300, await response.text()


def cluster_status(api: kmock.KubernetesEmulator, name: str) -> dict[str, Any]:
    return dict(objects_of(api, CLUSTERS)[name].get("status") or {})


async def test_a_new_cluster_gets_owned_pods_services_and_token_and_its_claims(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("orders", replicas=3))
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 3)
        pods = objects_of(kmock, "v1/pods")
        assert sorted(pods) == ["orders-0", "orders-1", "orders-2"]
        claims = objects_of(kmock, "v1/persistentvolumeclaims")
        await eventually(lambda: len(objects_of(kmock, "v1/persistentvolumeclaims")) == 3)
        claims = objects_of(kmock, "v1/persistentvolumeclaims")
        services = objects_of(kmock, "v1/services")
        secrets = objects_of(kmock, "v1/secrets")
        assert sorted(claims) == ["journal-orders-0", "journal-orders-1", "journal-orders-2"]
        assert sorted(services) == ["orders-active", "orders-brokers"]
        assert sorted(secrets) == [
            "orders-backend-token",
            "orders-broker-token",
            "orders-broker-verifiers",
            "orders-ca",  # mode Operator, the default: the cluster's CA, the brokers' certificate
            "orders-operator-client",  # and the operator's client certificate
            "orders-tls",
        ]
        for child in [*pods.values(), *services.values(), *secrets.values()]:
            (owner,) = child["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"]) == ("BrokerCluster", "orders", "uid-orders")
        # persistentVolumeClaimRetentionPolicy.whenDeleted defaults to Retain: journals outlive the cluster.
        assert all(not claim["metadata"].get("ownerReferences") for claim in claims.values())
        # Nobody is active before the engine has activated someone.
        assert {p["metadata"]["labels"][names.LABEL_ROLE] for p in pods.values()} == {"standby"}
        await eventually(lambda: cluster_status(kmock, "orders").get("phase") is not None)
        conditions = cluster_status(kmock, "orders").get("conditions") or []
        # No broker answers here (kmock runs no pods): valid, and not Ready yet, saying why.
        assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [
            ("SpecValid", "True", "Valid"),
            ("PodSecurityAllowed", "True", "Allowed"),
            ("CredentialsAllowed", "True", "OptedIn"),
            ("CertificatesValid", "True", "Valid"),
            ("DrainAllowed", "True", "NotDraining"),
            ("Ready", "False", "WaitingForBrokers"),
        ]
        tls = cluster_status(kmock, "orders")["tls"]
        assert tls["mode"] == "Operator"
        assert [(c["name"], c["secret"]) for c in tls["certificates"]] == [
            ("ca", "orders-ca"),
            ("server", "orders-tls"),
            ("operatorClient", "orders-operator-client"),
        ]
        issued = [e for e in events_of(kmock, "orders") if e["reason"] == "CertificateIssued"]
        assert len(issued) == 3 and all("BEGIN" not in e["message"] for e in issued)
        # The budget that holds back a drain's eviction of the active, owned like every child.
        (budget,) = objects_of(kmock, "policy/v1/poddisruptionbudgets").values()
        assert budget["metadata"]["name"] == "orders-active" and budget["spec"]["minAvailable"] == 1
        assert budget["metadata"]["ownerReferences"][0]["uid"] == "uid-orders"
        assert any(e["reason"] == "Created" for e in events_of(kmock, "orders"))


async def test_a_deleted_pod_comes_back(kmock: kmock.KubernetesEmulator, kube_api: KubeApi) -> None:
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("orders", replicas=2))
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 2)
        response = await kmock.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/orders-1")
        assert response.status == 200
        await eventually(lambda: "orders-1" not in objects_of(kmock, "v1/pods"))
        await eventually(lambda: "orders-1" in objects_of(kmock, "v1/pods"))


async def test_the_later_cluster_for_a_pair_is_a_conflict_and_runs_nothing(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("first", replicas=1, created="2026-11-22T10:00:00Z"))
        await eventually(lambda: "first-0" in objects_of(kmock, "v1/pods"))
        await create_cluster(kmock, cluster_body("second", replicas=1, created="2026-11-22T11:00:00Z"))
        await eventually(lambda: cluster_status(kmock, "second").get("phase") == "Conflict")
        assert cluster_status(kmock, "second")["conflictsWith"] == "first"
        (warning,) = [e for e in events_of(kmock, "second") if e["reason"] == "Conflict"]
        assert warning["type"] == "Warning"
        assert "first already serves account 'acme', company '1000'" in warning["message"]
        assert not [name for name in objects_of(kmock, "v1/pods") if name.startswith("second")]
        assert not [name for name in objects_of(kmock, "v1/secrets") if name.startswith("second")]
        assert cluster_status(kmock, "first").get("phase") != "Conflict"


async def test_an_invalid_spec_is_reported_and_nothing_is_created(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        # The CRD's CEL rule refuses this on a real API server; kmock has no admission, so the
        # operator's own check must catch it.
        body = cluster_body("bad", heartbeat={"leaseSeconds": 2, "intervalSeconds": 1, "failureThreshold": 3})
        await create_cluster(kmock, body)
        await eventually(lambda: bool(cluster_status(kmock, "bad").get("conditions")))
        conditions = cluster_status(kmock, "bad")["conditions"]
        assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [
            ("SpecValid", "False", "InvalidSpec"),
            ("Ready", "False", "InvalidSpec"),
        ]
        assert all("spec.heartbeat.leaseSeconds (2) must exceed" in c["message"] for c in conditions)
        assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in events_of(kmock, "bad"))
        assert objects_of(kmock, "v1/pods") == {}
        assert objects_of(kmock, "v1/services") == {}


async def test_endpoints_mode_manages_no_pods_and_reports_unreachable_brokers(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api) as context:
        # Port 9 on loopback (discard) is closed here: each heartbeat is refused at once.
        endpoints = [
            {"name": "ext-a", "url": "http://127.0.0.1:9/soap", "priority": 0},
            {"name": "ext-b", "url": "http://127.0.0.2:9/soap", "priority": 1},
        ]
        await create_cluster(kmock, cluster_body("ext", endpoints=endpoints))
        await eventually(lambda: len(cluster_status(kmock, "ext").get("brokers") or []) == 2)
        assert objects_of(kmock, "v1/pods") == {}
        assert objects_of(kmock, "v1/services") == {}
        # The credentials are still made: the external brokers and the backend are configured with them.
        assert sorted(objects_of(kmock, "v1/secrets")) == [
            "ext-backend-token",
            "ext-broker-token",
            "ext-broker-verifiers",
            "ext-ca",  # mode Operator: the CA, the operator's client certificate
            "ext-operator-client",
            "ext-tls",
        ]
        status = cluster_status(kmock, "ext")
        assert [b["name"] for b in status["brokers"]] == ["ext-a", "ext-b"]
        # The engine got the endpoints as its targets: it allocated an epoch through the API server
        # and reports why it could not activate them.
        await eventually(lambda: unreachable(cluster_status(kmock, "ext")))
        assert cluster_status(kmock, "ext")["epoch"] >= 1
        assert cluster_status(kmock, "ext").get("active") is None
        # The running engine's heartbeat client tells the certificates controller what it saw of
        # TLS (status.tls.served[], HeartbeatTLSFailed events): nothing here, over plain HTTP.
        observations = context.observations_for(NAMESPACE, "ext")
        assert observations.served_serials is not None and observations.tls_problems is not None
        assert observations.served_serials() == {} and observations.tls_problems() == {}
        assert "served" not in cluster_status(kmock, "ext")["tls"]
    assert observations.served_serials is None and observations.tls_problems is None  # engine stopped


def unreachable(status: dict[str, Any]) -> bool:
    return any(b.get("state") == "Unavailable" for b in status.get("brokers") or [])


async def mark_ready(api: kmock.KubernetesEmulator, pod: str) -> None:
    """Stand in for the kubelet, which kmock does not run: the pod's container is up and ready."""
    status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    response = await api.patch(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}", json=status)
    assert response.status == 200, await response.text()


def template_of(api: kmock.KubernetesEmulator, pod: str) -> str | None:
    pods = objects_of(api, "v1/pods")
    return pods[pod]["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH] if pod in pods else None


async def test_a_spec_change_replaces_one_pod_at_a_time_lowest_priority_first(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("orders", replicas=2))
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 2)
        old = template_of(kmock, "orders-0")
        for pod in ("orders-0", "orders-1"):
            await mark_ready(kmock, pod)
        url = f"{CLUSTERS_URL}/orders"
        response = await kmock.patch(url, json={"spec": {"image": "broker-failover/broker:0.2.0"}})
        assert response.status == 200

        # orders-1 (priority 1) goes first and comes back with the new template ...
        await eventually(lambda: template_of(kmock, "orders-1") not in (None, old))
        # ... and orders-0 is left alone while its replacement is not ready yet.
        assert template_of(kmock, "orders-0") == old
        await asyncio.sleep(3 * RECONCILE_SECONDS)  # three reconcile periods, in loop time
        assert template_of(kmock, "orders-0") == old
        await mark_ready(kmock, "orders-1")
        await eventually(lambda: template_of(kmock, "orders-0") not in (None, old))
        assert any(e["reason"] == "RollingUpdate" for e in events_of(kmock, "orders"))


def claim_owners(api: kmock.KubernetesEmulator, claim: str) -> list[str]:
    return [
        ref["uid"]
        for ref in objects_of(api, "v1/persistentvolumeclaims")[claim]["metadata"].get("ownerReferences")
        or []
    ]


async def scale_down_three_to_two(api: kmock.KubernetesEmulator, **spec: Any) -> None:
    """A cluster of three ready pods scaled to two; returns once the operator has deleted orders-2."""
    await create_cluster(api, cluster_body("orders", replicas=3, **spec))
    await eventually(lambda: len(objects_of(api, "v1/pods")) == 3)
    await eventually(lambda: len(objects_of(api, "v1/persistentvolumeclaims")) == 3)
    for pod in ("orders-0", "orders-1", "orders-2"):
        await mark_ready(api, pod)
    response = await api.patch(f"{CLUSTERS_URL}/orders", json={"spec": {"replicas": 2}})
    assert response.status == 200
    await eventually(lambda: "orders-2" not in objects_of(api, "v1/pods"))


async def test_scale_down_with_when_scaled_delete_deletes_the_removed_brokers_claim(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        policy = {"whenScaled": "Delete"}
        await scale_down_three_to_two(kmock, persistentVolumeClaimRetentionPolicy=policy)
        await eventually(lambda: "journal-orders-2" not in objects_of(kmock, "v1/persistentvolumeclaims"))
        assert sorted(objects_of(kmock, "v1/persistentvolumeclaims")) == [
            "journal-orders-0",
            "journal-orders-1",
        ]
        assert any(e["reason"] == "ClaimDeleted" for e in events_of(kmock, "orders"))
        # Deleted, not re-created: ordinal 2 is no longer wanted.
        await asyncio.sleep(3 * RECONCILE_SECONDS)
        assert "journal-orders-2" not in objects_of(kmock, "v1/persistentvolumeclaims")


async def test_scale_down_retains_the_removed_brokers_claim_by_default(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await scale_down_three_to_two(kmock)
        await asyncio.sleep(3 * RECONCILE_SECONDS)  # three reconcile periods, in loop time
        assert sorted(objects_of(kmock, "v1/persistentvolumeclaims")) == [
            "journal-orders-0",
            "journal-orders-1",
            "journal-orders-2",
        ]
        assert not any(e["reason"] == "ClaimDeleted" for e in events_of(kmock, "orders"))


async def test_when_deleted_sets_and_takes_back_the_claims_owner_reference(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("orders", replicas=2))
        await eventually(lambda: len(objects_of(kmock, "v1/persistentvolumeclaims")) == 2)
        assert claim_owners(kmock, "journal-orders-0") == []
        policy = {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"}}
        response = await kmock.patch(f"{CLUSTERS_URL}/orders", json={"spec": policy})
        assert response.status == 200
        # Existing claims are adopted, so deleting the cluster now garbage-collects them.
        for name in ("journal-orders-0", "journal-orders-1"):
            await eventually(lambda name=name: claim_owners(kmock, name) == ["uid-orders"])
        policy = {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain"}}
        response = await kmock.patch(f"{CLUSTERS_URL}/orders", json={"spec": policy})
        assert response.status == 200
        for name in ("journal-orders-0", "journal-orders-1"):
            await eventually(lambda name=name: claim_owners(kmock, name) == [])


POLICIES = "networking.k8s.io/v1/networkpolicies"


async def test_the_network_policy_follows_spec_network_policy_and_names_the_operators_pods(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    erp = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "erp-backend"}}}
    operator = {
        "pod_namespace": "broker-system",
        "pod_labels": (("app.kubernetes.io/name", "broker-failover"),),
    }
    async with running_operator(kmock, kube_api, **operator):
        await create_cluster(
            kmock, cluster_body("orders", networkPolicy={"enabled": True, "sendMessagesFrom": [erp]})
        )
        await eventually(lambda: "orders-brokers-ingress" in objects_of(kmock, POLICIES))
        policy = objects_of(kmock, POLICIES)["orders-brokers-ingress"]
        (owner,) = policy["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("BrokerCluster", "orders")
        admin, main = policy["spec"]["ingress"]
        operator_peer = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "broker-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "broker-failover"}},
        }
        assert admin == {"from": [operator_peer], "ports": [{"protocol": "TCP", "port": "admin"}]}
        assert main == {"from": [erp, operator_peer], "ports": [{"protocol": "TCP", "port": "soap"}]}

        # A changed source list reaches the policy; turning it off deletes it. (kmock does not count
        # generations; the API server would, and the operator applies the policy once per generation.)
        response = await kmock.patch(
            f"{CLUSTERS_URL}/orders",
            json={"metadata": {"generation": 2}, "spec": {"networkPolicy": {"sendMessagesFrom": None}}},
        )
        assert response.status < 300, await response.text()
        await eventually(
            lambda: "from" not in objects_of(kmock, POLICIES)["orders-brokers-ingress"]["spec"]["ingress"][1]
        )
        response = await kmock.patch(
            f"{CLUSTERS_URL}/orders",
            json={"metadata": {"generation": 3}, "spec": {"networkPolicy": {"enabled": False}}},
        )
        assert response.status < 300, await response.text()
        await eventually(lambda: "orders-brokers-ingress" not in objects_of(kmock, POLICIES))


async def test_without_its_namespace_the_operator_makes_no_policy_and_says_why(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("orders", networkPolicy={"enabled": True}))
        await eventually(
            lambda: any(e["reason"] == "NetworkPolicyNotCreated" for e in events_of(kmock, "orders"))
        )
        (event,) = [e for e in events_of(kmock, "orders") if e["reason"] == "NetworkPolicyNotCreated"]
        assert "OPERATOR_POD_NAMESPACE" in event["message"]
        assert len(objects_of(kmock, "v1/pods")) == 2  # the brokers run all the same
        assert objects_of(kmock, POLICIES) == {}
