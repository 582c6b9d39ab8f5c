"""The operator inside kopf against kmock, on nodes of two zones (issue 42): the zones listed at
start reach the first pods it makes, and its settings' broker image and pull secrets reach every
pod. Where the real scheduler puts such pods is tests/e2e/test_three_nodes_spread_and_drain.py's."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from broker_operator.controller import names
from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import (
    NAMESPACE,
    cluster_body,
    events_of,
    eventually,
    objects_of,
    running_operator,
)

pytestmark = pytest.mark.looptime

CLUSTERS_URL = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{NAMESPACE}/{names.PLURAL}"


def node(name: str, zone: str) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {}}


async def test_pods_made_right_after_the_start_are_spread_over_the_zones_of_the_nodes(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    kmock.resources["v1/nodes"] = kmock.ResourceInfo(
        kind="Node", namespaced=False, verbs={"list", "watch", "get", "create"}
    )
    for name, zone in (("n1", "eu-1a"), ("n2", "eu-1b")):
        response = await kmock.post("/api/v1/nodes", json=node(name, zone))
        assert response.status < 300, await response.text()
    settings = {
        "broker_image": "registry.example.com/broker-failover/broker:0.1.0",
        "broker_image_pull_secrets": ("regcred",),
    }
    async with running_operator(kmock, kube_api, **settings) as context:
        assert context.node_zones.zones() == {"eu-1a", "eu-1b"}  # listed before any handler ran
        body = cluster_body("orders", replicas=2, imagePullSecrets=[{"name": "erp-registry"}])
        response = await kmock.post(CLUSTERS_URL, json=body)
        assert response.status < 300, await response.text()
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 2)
        for pod in objects_of(kmock, "v1/pods").values():
            (constraint,) = pod["spec"]["topologySpreadConstraints"]
            assert (constraint["topologyKey"], constraint["whenUnsatisfiable"]) == (
                "topology.kubernetes.io/zone",
                "DoNotSchedule",
            )
            assert pod["spec"]["containers"][0]["image"] == settings["broker_image"]
            assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "erp-registry"}]
        created = [e["message"] for e in events_of(kmock, "orders") if e["reason"] == "Created"]
        assert "created Pod/orders-0 (priority 0, spread over zones and hosts)" in created, created
