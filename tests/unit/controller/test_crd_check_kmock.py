"""An outdated CRD stops the reconciles, not the heartbeats: the controller inside kopf against kmock.

The CRD is an object in kmock, as it is on an API server, with the revision annotation the
operator reads (controller/crd_check.py). Under revision 0 the operator creates nothing, sets
``CRDCurrent`` False with the fix in its message and warns once; an endpoints-mode cluster's
brokers (a loopback server) are heartbeated all the same. Upgraded (the annotation raised, as
``helm upgrade`` or ``kubectl apply`` would), the next pass creates the children and the condition
turns True. The heartbeat test runs in real time, not looptime: its calls cross a real socket.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp.web
import kmock
import pytest

from broker_operator.controller.crd_revision import (
    ANNOTATION_CRD_REVISION,
    CONDITION_CRD_CURRENT,
    CRD_NAME,
    REQUIRED_CRD_REVISION,
)
from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import (
    RECONCILE_SECONDS,
    cluster_body,
    events_of,
    eventually,
    objects_of,
    running_operator,
    serve_brokers,
)
from tests.unit.controller.test_credentials import OPTED_IN, OPTED_IN_TOKEN, condition, create_secret
from tests.unit.controller.test_operator_kmock import create_cluster

CRDS_URL = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def install_crd(api: kmock.KubernetesEmulator, revision: int) -> None:
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "annotations": {ANNOTATION_CRD_REVISION: str(revision)}},
        "spec": {"group": "broker.failover.dev", "scope": "Namespaced"},
    }
    response = await api.post(CRDS_URL, json=body)
    assert response.status < 300, await response.text()


async def upgrade_crd(api: kmock.KubernetesEmulator, revision: int) -> None:
    patch = {"metadata": {"annotations": {ANNOTATION_CRD_REVISION: str(revision)}}}
    response = await api.patch(f"{CRDS_URL}/{CRD_NAME}", json=patch)
    assert response.status < 300, await response.text()


def reasons(api: kmock.KubernetesEmulator, cluster: str) -> list[str]:
    return [event["reason"] for event in events_of(api, cluster)]


@pytest.mark.looptime  # the reconcile periods pass in loop time
async def test_an_outdated_crd_creates_nothing_until_it_is_upgraded(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    await install_crd(kmock, REQUIRED_CRD_REVISION - 1)
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("orders", replicas=2))
        await eventually(lambda: condition(kmock, "orders", CONDITION_CRD_CURRENT) is not None)
        refused = condition(kmock, "orders", CONDITION_CRD_CURRENT)
        assert refused is not None and (refused["status"], refused["reason"]) == ("False", "CRDOutdated")
        assert f"needs revision {REQUIRED_CRD_REVISION}" in refused["message"]
        assert "helm upgrade" in refused["message"] and "kubectl apply" in refused["message"]
        await asyncio.sleep(3 * RECONCILE_SECONDS)  # passes of the timer: each refuses again
        assert objects_of(kmock, "v1/pods") == {} and objects_of(kmock, "v1/services") == {}
        assert objects_of(kmock, "v1/secrets") == {} and objects_of(kmock, "v1/persistentvolumeclaims") == {}
        (warning,) = [e for e in events_of(kmock, "orders") if e["reason"] == "CRDOutdated"]  # once
        assert warning["type"] == "Warning" and warning["message"] == refused["message"]

        await upgrade_crd(kmock, REQUIRED_CRD_REVISION)
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 2, attempts=100)
        await eventually(
            lambda: (condition(kmock, "orders", CONDITION_CRD_CURRENT) or {}).get("status") == "True"
        )
        current = condition(kmock, "orders", CONDITION_CRD_CURRENT)
        assert current is not None and current["reason"] == "CRDCurrent"
        assert f"revision {REQUIRED_CRD_REVISION}" in current["message"]
        assert reasons(kmock, "orders").count("CRDUpgraded") == 1


async def test_an_outdated_crd_leaves_the_heartbeats_going(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    """Never fence a working active over a CRD: the daemon is not the reconcile, and keeps calling."""
    heard: list[str] = []

    async def heartbeat(request: aiohttp.web.Request) -> aiohttp.web.Response:
        heard.append(request.match_info["broker"])
        return aiohttp.web.Response(status=503, text="not a broker")

    runner, port = await serve_brokers(heartbeat)
    try:
        await install_crd(kmock, REQUIRED_CRD_REVISION - 1)
        async with running_operator(kmock, kube_api):
            await create_secret(kmock, "broker-token", {"token": OPTED_IN_TOKEN}, labels=OPTED_IN)
            endpoints: list[dict[str, Any]] = [
                {"name": "a", "url": f"http://127.0.0.1:{port}/remote/a/soap", "priority": 0}
            ]
            body = cluster_body(
                "remote", endpoints=endpoints, auth={"tokenSecretRef": {"name": "broker-token"}}
            )
            await create_cluster(kmock, body)
            await eventually(lambda: condition(kmock, "remote", CONDITION_CRD_CURRENT) is not None)
            await eventually(lambda: len(heard) >= 2)
            assert set(heard) == {"a"}
            refused = condition(kmock, "remote", CONDITION_CRD_CURRENT)
            assert refused is not None and refused["status"] == "False"
    finally:
        await runner.cleanup()
