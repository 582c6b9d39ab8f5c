"""A paused BrokerCluster inside kopf against kmock: reported, and no child written, until resumed.

kmock runs no kubelet, so the engine heartbeats nobody here; what the pause does to heartbeats and
failovers is tests/unit/core/test_pause.py's (the decision core), the integration test's (real
brokers) and tests/e2e/test_pause.py's (the local cluster under traffic).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest

from broker_operator.controller.kube import KubeApi
from broker_operator.core.pause import PAUSE_ANNOTATION
from tests.unit.controller.conftest import (
    NAMESPACE,
    RECONCILE_SECONDS,
    cluster_body,
    events_of,
    eventually,
    objects_of,
    running_operator,
)
from tests.unit.controller.test_operator_kmock import (
    CLUSTERS_URL,
    cluster_status,
    create_cluster,
    mark_ready,
    template_of,
)

pytestmark = pytest.mark.looptime


def paused_condition(api: kmock.KubernetesEmulator) -> dict[str, Any] | None:
    conditions = cluster_status(api, "orders").get("conditions") or []
    return next((c for c in conditions if c["type"] == "ReconciliationPaused"), None)


async def annotate(api: kmock.KubernetesEmulator, value: str | None) -> None:
    response = await api.patch(
        f"{CLUSTERS_URL}/orders", json={"metadata": {"annotations": {PAUSE_ANNOTATION: value}}}
    )
    assert response.status == 200, await response.text()


def reasons(api: kmock.KubernetesEmulator) -> list[str]:
    return [e["reason"] for e in events_of(api, "orders")]


async def test_a_paused_cluster_keeps_its_children_as_they_are_until_resumed(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("orders", replicas=2))
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 2)
        for pod in ("orders-0", "orders-1"):
            await mark_ready(kmock, pod)
        old = template_of(kmock, "orders-1")
        await annotate(kmock, "true")
        await eventually(lambda: (paused_condition(kmock) or {}).get("status") == "True")
        paused = paused_condition(kmock)
        assert paused is not None
        assert paused["reason"] == "PausedNoActive"  # no engine activated anyone here (no kubelet)
        assert "no failover, switchover, failback, rollout" in paused["message"]
        since = paused["lastTransitionTime"]
        assert f"paused since {since}" in paused["message"]
        await eventually(lambda: "ReconciliationPaused" in reasons(kmock))

        # A pod deleted by hand stays deleted, a Service too, and a spec change rolls nothing.
        response = await kmock.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/orders-1")
        assert response.status == 200
        response = await kmock.delete(f"/api/v1/namespaces/{NAMESPACE}/services/orders-brokers")
        assert response.status == 200
        response = await kmock.patch(
            f"{CLUSTERS_URL}/orders", json={"spec": {"image": "broker-failover/broker:0.2.0"}}
        )
        assert response.status == 200
        await asyncio.sleep(4 * RECONCILE_SECONDS)  # four reconcile passes, in loop time
        assert sorted(objects_of(kmock, "v1/pods")) == ["orders-0"]
        assert "orders-brokers" not in objects_of(kmock, "v1/services")
        assert "RollingUpdate" not in reasons(kmock)
        # The condition still says since when: a later pass did not move its transition time.
        assert (paused_condition(kmock) or {}).get("lastTransitionTime") == since
        assert reasons(kmock).count("ReconciliationPaused") == 1

        await annotate(kmock, None)  # removed: resumed
        await eventually(lambda: (paused_condition(kmock) or {}).get("status") == "False")
        resumed = paused_condition(kmock)
        assert resumed is not None and resumed["reason"] == "Resumed"
        assert f"it was paused since {since}" in resumed["message"]
        await eventually(lambda: "ReconciliationResumed" in reasons(kmock))
        await eventually(lambda: "orders-brokers" in objects_of(kmock, "v1/services"))
        await eventually(lambda: template_of(kmock, "orders-1") not in (None, old))


async def test_a_cluster_created_paused_gets_no_children_and_a_bad_value_is_named(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        body = cluster_body("orders", replicas=2)
        body["metadata"]["annotations"] = {PAUSE_ANNOTATION: "true"}
        await create_cluster(kmock, body)
        await eventually(lambda: (paused_condition(kmock) or {}).get("status") == "True")
        await asyncio.sleep(3 * RECONCILE_SECONDS)
        assert objects_of(kmock, "v1/pods") == {}
        assert objects_of(kmock, "v1/services") == {}
        assert objects_of(kmock, "v1/secrets") == {}
        # "yes" does not pause (only "true" does): it resumes, and the Warning says why.
        await annotate(kmock, "yes")
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 2)
        (warning,) = [e for e in events_of(kmock, "orders") if e["reason"] == "InvalidPauseAnnotation"]
        assert warning["type"] == "Warning" and "'yes'" in warning["message"]
        assert (paused_condition(kmock) or {}).get("status") == "False"
