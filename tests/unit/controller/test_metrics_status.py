"""What status says as gauges (``metrics.record_status``), and the Kubernetes calls counted.

The validator's verdict and the certificates' ends become the series the chart's alerts read
(docs/monitoring.md): they must follow status exactly (a verdict or a certificate gone from status
is gone from /metrics), and nothing outside the known values may become a label, whatever a
writer of status put there.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from broker_operator import metrics
from broker_operator.controller.kube import _raw_json
from broker_operator.core.status import parse_time

KEY = metrics.ClusterKey("shop", "orders")
WHICH = {"brokercluster_namespace": "shop", "brokercluster": "orders"}
CHECKED = "2026-11-27T10:15:00Z"


def series() -> dict[str, float]:
    """This cluster's samples as ``name{other labels}`` (no ``_created``)."""
    found = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            labels = dict(sample.labels)
            if all(labels.pop(name, None) == value for name, value in WHICH.items()):
                extra = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                found[f"{sample.name}{{{extra}}}"] = sample.value
    return found


@pytest.fixture(autouse=True)
def forgotten() -> Any:
    yield
    metrics.forget_cluster(KEY)
    assert series() == {}


def test_a_verdict_becomes_its_gauges_and_goes_when_status_drops_it() -> None:
    metrics.record_status(KEY, {"ordering": {"lastCheckTime": CHECKED, "result": "Passed", "violations": 0}})
    assert series() == {
        "broker_failover_ordering_verdict{verdict=Passed}": 1.0,
        "broker_failover_ordering_verdict{verdict=Failed}": 0.0,
        "broker_failover_ordering_checked_timestamp_seconds{}": parse_time(CHECKED),
        "broker_failover_ordering_violations{}": 0.0,
    }
    later = "2026-11-27T10:30:00Z"
    metrics.record_status(KEY, {"ordering": {"lastCheckTime": later, "result": "Failed", "violations": 2}})
    assert series()["broker_failover_ordering_verdict{verdict=Failed}"] == 1.0
    assert series()["broker_failover_ordering_verdict{verdict=Passed}"] == 0.0
    assert series()["broker_failover_ordering_checked_timestamp_seconds{}"] == parse_time(later)
    assert series()["broker_failover_ordering_violations{}"] == 2.0
    metrics.record_status(KEY, {"phase": "Healthy"})
    assert series() == {}


def test_a_result_or_time_outside_the_schema_makes_no_series() -> None:
    metrics.record_status(KEY, {"ordering": {"lastCheckTime": CHECKED, "result": "Maybe", "violations": 1}})
    assert series() == {}
    metrics.record_status(
        KEY, {"ordering": {"lastCheckTime": "yesterday", "result": "Passed", "violations": "x"}}
    )
    assert series() == {
        "broker_failover_ordering_verdict{verdict=Passed}": 1.0,
        "broker_failover_ordering_verdict{verdict=Failed}": 0.0,
    }


def test_certificate_ends_by_known_name_only_and_gone_with_their_entry() -> None:
    tls = {
        "certificates": [
            {"name": "ca", "notAfter": "2036-11-25T10:00:00Z"},
            {"name": "server", "notAfter": "2027-02-25T10:00:00Z", "serial": "0a"},
            {"name": "someone-elses", "notAfter": "2027-02-25T10:00:00Z"},  # not a label value
            {"name": "operatorClient", "notAfter": "soon"},
            "not an entry",
        ]
    }
    metrics.record_status(KEY, {"tls": tls})
    assert series() == {
        "broker_failover_certificate_not_after_seconds{certificate=ca}": parse_time("2036-11-25T10:00:00Z"),
        "broker_failover_certificate_not_after_seconds{certificate=server}": parse_time(
            "2027-02-25T10:00:00Z"
        ),
    }
    metrics.record_status(
        KEY, {"tls": {"certificates": [{"name": "ca", "notAfter": "2036-11-25T10:00:00Z"}]}}
    )
    assert list(series()) == ["broker_failover_certificate_not_after_seconds{certificate=ca}"]


def requests(verb: str, code: str) -> float:
    return (
        REGISTRY.get_sample_value("broker_failover_kube_requests_total", {"verb": verb, "code": code}) or 0.0
    )


def test_kubernetes_calls_are_counted_by_verb_and_code() -> None:
    def patch_namespaced_service(*_: Any) -> None:
        return None

    def read_namespaced_pod(*_: Any, **__: Any) -> None:
        raise ApiException(status=404, reason="Not Found")

    before = (requests("patch", "2xx"), requests("read", "404"), requests("list", "error"))
    with metrics.kube_request(patch_namespaced_service, ()):
        patch_namespaced_service()
    # kube._raw_json wraps the client's method: the verb is the wrapped one's.
    with pytest.raises(ApiException), metrics.kube_request(_raw_json, (read_namespaced_pod, "p", "ns")):
        _raw_json(read_namespaced_pod, "p", "ns")

    def list_namespaced_pod() -> None:
        raise ConnectionRefusedError("no API server")

    with pytest.raises(ConnectionRefusedError), metrics.kube_request(list_namespaced_pod, ()):
        list_namespaced_pod()
    after = (requests("patch", "2xx"), requests("read", "404"), requests("list", "error"))
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]
