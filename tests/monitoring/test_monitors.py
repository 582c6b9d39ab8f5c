"""The chart's ServiceMonitor and PodMonitor select what the operator and the brokers really are, and
give the brokers' series the BrokerCluster identity the operator's carry.

The selectors and relabellings are compared with the code that makes the objects (the broker pods'
labels and port in ``controller/builders.py`` and ``names.py``; the metrics Service and the operator's
container port in the chart), so that a label renamed there fails here rather than leaving a
Prometheus scraping nothing.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from broker_operator import metrics
from broker_operator.controller import builders, names
from tests.monitoring.chart import NAMESPACE, RELEASE, documents, one

pytestmark = pytest.mark.needs("tools")  # helm (make tools)

ON = ("monitoring.serviceMonitor.enabled=true", "monitoring.podMonitor.enabled=true")


def meta_label(pod_label: str) -> str:
    """Prometheus's Kubernetes discovery label for a pod label (each character outside [a-zA-Z0-9_]
    becomes ``_``)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def test_the_service_monitor_scrapes_the_operators_metrics_service() -> None:
    docs = documents(*ON)
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert "honorLabels" not in endpoint  # the series name their cluster with labels of their own
    # The job the alerts name (files/alerts.yaml, ${operatorJob}) is the Service's name.
    assert service["metadata"]["name"] == f"{RELEASE}-broker-failover-metrics"


def test_the_pod_monitor_selects_the_broker_pods_the_operator_makes() -> None:
    monitor = one(documents(*ON), "PodMonitor")
    pod_labels = builders.cluster_labels("orders")
    selector = monitor["spec"]["selector"]
    assert selector["matchLabels"].items() <= pod_labels.items()
    assert selector["matchExpressions"] == [{"key": names.LABEL_CLUSTER, "operator": "Exists"}]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == names.BROKER_PORT_NAME  # /metrics is on the main port (docs/broker.md)
    assert endpoint["path"] == "/metrics"


def relabelled(endpoint: dict[str, Any]) -> dict[str, list[str]]:
    return {step["targetLabel"]: step["sourceLabels"] for step in endpoint["relabelings"]}


def test_the_pod_monitor_gives_broker_series_the_operators_cluster_labels() -> None:
    [endpoint] = one(documents(*ON), "PodMonitor")["spec"]["podMetricsEndpoints"]
    namespace_label, cluster_label = metrics.CLUSTER_LABELS
    assert relabelled(endpoint) == {
        cluster_label: [meta_label(names.LABEL_CLUSTER)],
        namespace_label: ["__meta_kubernetes_namespace"],
        # The operator's heartbeat failures name a broker by this label too: the pod's name.
        "broker": ["__meta_kubernetes_pod_name"],
    }
    assert builders.cluster_labels("orders")[names.LABEL_CLUSTER] == "orders"
    assert names.pod_name("orders", 0) == "orders-0"  # what `broker` will read


@pytest.mark.parametrize(
    ("values", "selector"),
    [
        ((), {"matchNames": [NAMESPACE]}),
        (("operator.watchNamespaces={shop,erp}",), {"matchNames": ["shop", "erp"]}),
        (("operator.clusterWide=true",), {"any": True}),
    ],
)
def test_the_pod_monitor_looks_where_the_operator_watches(
    values: tuple[str, ...], selector: dict[str, Any]
) -> None:
    monitor = one(documents(*ON, *values), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == selector


@pytest.mark.parametrize(
    ("values", "scheme"),
    [
        ((), "https"),  # brokers serve TLS by default (operator.brokerTls)
        (("operator.brokerTls=false",), "http"),
        (("monitoring.podMonitor.scheme=http",), "http"),
    ],
)
def test_the_pod_monitor_speaks_what_the_brokers_serve(values: tuple[str, ...], scheme: str) -> None:
    [endpoint] = one(documents(*ON, *values), "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == scheme
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_monitor_labels_intervals_and_timeouts_are_values() -> None:
    docs = documents(
        *ON,
        "monitoring.serviceMonitor.labels.release=prometheus",
        "monitoring.serviceMonitor.scrapeTimeout=10s",
        "monitoring.podMonitor.labels.release=prometheus",
        "monitoring.podMonitor.interval=15s",
    )
    service_monitor, pod_monitor = one(docs, "ServiceMonitor"), one(docs, "PodMonitor")
    assert service_monitor["metadata"]["labels"]["release"] == "prometheus"
    assert pod_monitor["metadata"]["labels"]["release"] == "prometheus"
    assert service_monitor["spec"]["endpoints"][0]["scrapeTimeout"] == "10s"
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "15s"
    assert "scrapeTimeout" not in pod_monitor["spec"]["podMetricsEndpoints"][0]
