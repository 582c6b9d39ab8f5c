"""A BrokerCluster's metric series say which one it is, namespace included, and go with it alone.

Against kmock with the real handlers, daemon and engine (see ``conftest.py``). Two clusters of
one name run in two namespaces, in endpoints mode at closed loopback ports, so their engines
heartbeat (refused at once) and set their per-cluster series. Before issue 43 the series were
labelled with the name alone: both clusters shared them, and deleting one dropped the other's.
Now each has its own (``brokercluster_namespace``, ``brokercluster``); the validator's verdict and
the certificates' ends written into one's status become its gauges at the next reconcile; and
after one is deleted no series in prometheus_client's default registry names it, while the
other's are all still there.
"""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from prometheus_client import REGISTRY

from broker_operator.controller import names
from broker_operator.controller.kube import KubeApi
from broker_operator.core.status import parse_time
from tests.unit.controller.conftest import (
    CLUSTERS,
    NAMESPACE,
    cluster_body,
    eventually,
    objects_of,
    running_operator,
)

pytestmark = pytest.mark.looptime

OTHER_NAMESPACE = f"{NAMESPACE}-b"
CLUSTER = "metrics-gone"
ENDPOINTS = [
    {"name": "ext-a", "url": "http://127.0.0.1:9/soap", "priority": 0},
    {"name": "ext-b", "url": "http://127.0.0.2:9/soap", "priority": 1},
]
CHECKED = "2026-11-27T10:15:00Z"
NOT_AFTER = "2027-02-25T10:00:00Z"


def clusters_url(namespace: str) -> str:
    return f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{names.PLURAL}"


CLUSTERS_URL = clusters_url(NAMESPACE)  # the other kmock tests' (test_sharding.py, ...)


def series_of(namespace: str, cluster: str) -> dict[str, float]:
    """Every sample in the default registry of this BrokerCluster, as ``name{other labels}``."""
    found = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            labels = dict(sample.labels)
            if (
                labels.pop("brokercluster", None) == cluster
                and labels.pop("brokercluster_namespace", None) == namespace
            ):
                found[f"{sample.name}{sorted(labels.items())}"] = sample.value
    return found


def process_sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def reconciles() -> float:
    return process_sample("broker_failover_reconciles_total", outcome="ok")


def named(series: dict[str, float], prefix: str) -> dict[str, float]:
    return {key: value for key, value in series.items() if key.startswith(prefix)}


def in_namespace(namespace: str) -> dict[str, Any]:
    body = cluster_body(CLUSTER, endpoints=ENDPOINTS)
    body["metadata"]["namespace"] = namespace
    body["metadata"]["uid"] = f"uid-{namespace}-{CLUSTER}"  # kopf keeps what it knows by uid
    return body


async def test_same_named_clusters_of_two_namespaces_keep_their_own_series(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    driven, reconciled = process_sample("broker_failover_clusters_driven"), reconciles()
    async with running_operator(kmock, kube_api, namespaces=(NAMESPACE, OTHER_NAMESPACE)):
        for namespace in (NAMESPACE, OTHER_NAMESPACE):
            response = await kmock.post(clusters_url(namespace), json=in_namespace(namespace))
            assert response.status < 300, await response.text()
        for namespace in (NAMESPACE, OTHER_NAMESPACE):
            # Each engine ran: heartbeats counted, epoch and phase set, under its own labels.
            await eventually(
                lambda ns=namespace: bool(named(series_of(ns, CLUSTER), "broker_failover_heartbeats_total"))
            )
            await eventually(
                lambda ns=namespace: bool(named(series_of(ns, CLUSTER), "broker_failover_epoch"))
            )
        # Per process: both clusters driven here, their reconciles counted.
        assert process_sample("broker_failover_clusters_driven") == driven + 2
        assert reconciles() > reconciled
        # Refused: failures counted by broker, each a broker of this cluster.
        failures = "broker_failover_heartbeat_failures_total"
        await eventually(lambda: named(series_of(NAMESPACE, CLUSTER), failures) != {})
        assert set(named(series_of(NAMESPACE, CLUSTER), failures)) <= {
            f"{failures}[('broker', '{broker['name']}')]" for broker in ENDPOINTS
        }

        # The validator writes its verdict, the certificates pass the ends: gauges of that cluster.
        status = {
            "ordering": {"lastCheckTime": CHECKED, "result": "Failed", "violations": 3, "report": "r"},
            "tls": {
                "certificates": [{"name": "server", "secret": "s", "serial": "0a", "notAfter": NOT_AFTER}]
            },
        }
        url = f"{clusters_url(OTHER_NAMESPACE)}/{CLUSTER}/status"
        response = await kmock.patch(url, json={"status": status})
        assert response.status < 300, await response.text()
        verdict = "broker_failover_ordering_verdict"
        await eventually(lambda: named(series_of(OTHER_NAMESPACE, CLUSTER), verdict) != {})
        other = series_of(OTHER_NAMESPACE, CLUSTER)
        assert named(other, verdict) == {
            f"{verdict}[('verdict', 'Failed')]": 1.0,
            f"{verdict}[('verdict', 'Passed')]": 0.0,
        }
        assert other["broker_failover_ordering_checked_timestamp_seconds[]"] == parse_time(CHECKED)
        assert other["broker_failover_ordering_violations[]"] == 3
        end = "broker_failover_certificate_not_after_seconds"
        assert named(other, end) == {f"{end}[('certificate', 'server')]": parse_time(NOT_AFTER)}
        assert named(series_of(NAMESPACE, CLUSTER), verdict) == {}  # the other cluster's alone

        response = await kmock.delete(f"{clusters_url(NAMESPACE)}/{CLUSTER}")
        assert response.status < 300, await response.text()
        await eventually(lambda: CLUSTER not in objects_of(kmock, CLUSTERS))
        await eventually(lambda: series_of(NAMESPACE, CLUSTER) == {})
        assert process_sample("broker_failover_clusters_driven") == driven + 1
        # The same-named cluster of the other namespace lost none of its series.
        left = series_of(OTHER_NAMESPACE, CLUSTER)
        assert {key.split("[")[0] for key in left} >= {
            "broker_failover_heartbeats_total",
            "broker_failover_heartbeat_failures_total",
            "broker_failover_epoch",
            "broker_failover_phase",
            "broker_failover_failovers_total",
            verdict,
            end,
        }
