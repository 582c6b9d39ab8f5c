"""A deleted BrokerCluster's metric series are dropped once its heartbeat daemon has stopped.

Against kmock with the real handlers, daemon and engine (see ``conftest.py``). The
cluster runs in endpoints mode at closed loopback ports, so its engine heartbeats
(refused at once) and sets its per-cluster series; after the BrokerCluster is
deleted, no series in prometheus_client's default registry names it any more.
"""

from __future__ import annotations

import kmock
import pytest
from prometheus_client import REGISTRY

from broker_operator.controller import names
from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import (
    CLUSTERS,
    NAMESPACE,
    cluster_body,
    eventually,
    objects_of,
    running_operator,
)

pytestmark = pytest.mark.looptime

CLUSTERS_URL = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{NAMESPACE}/{names.PLURAL}"
CLUSTER = "metrics-gone"


def series_of(cluster: str) -> list[str]:
    """Every sample in the default registry labelled with this cluster, as ``name{labels}``."""
    return [
        f"{sample.name}{sample.labels}"
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.labels.get("cluster") == cluster
    ]


async def test_deleting_a_cluster_drops_its_metric_series(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        endpoints = [
            {"name": "ext-a", "url": "http://127.0.0.1:9/soap", "priority": 0},
            {"name": "ext-b", "url": "http://127.0.0.2:9/soap", "priority": 1},
        ]
        response = await kmock.post(CLUSTERS_URL, json=cluster_body(CLUSTER, endpoints=endpoints))
        assert response.status < 300, await response.text()
        # The engine ran: heartbeats counted, epoch and phase set for this cluster.
        await eventually(lambda: any("broker_failover_heartbeats_total" in s for s in series_of(CLUSTER)))
        await eventually(lambda: any("broker_failover_epoch" in s for s in series_of(CLUSTER)))
        response = await kmock.delete(f"{CLUSTERS_URL}/{CLUSTER}")
        assert response.status < 300, await response.text()
        await eventually(lambda: CLUSTER not in objects_of(kmock, CLUSTERS))
        await eventually(lambda: series_of(CLUSTER) == [])
