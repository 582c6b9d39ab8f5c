"""kubectl's ``get`` arguments turned into API requests, and what is left to kubectl."""

from __future__ import annotations

import pytest

from local_cluster.api_reads import api_path


@pytest.mark.parametrize(
    ("what", "expected"),
    [
        (("pod", "broker-0"), ("/api/v1/namespaces/ns/pods/broker-0", {})),
        (("pods", "-l", "app=x,role=a"), ("/api/v1/namespaces/ns/pods", {"labelSelector": "app=x,role=a"})),
        (("bc", "orders"), ("/apis/broker.failover.dev/v1alpha1/namespaces/ns/brokerclusters/orders", {})),
        (
            ("events", "--field-selector", "involvedObject.name=orders"),
            ("/api/v1/namespaces/ns/events", {"fieldSelector": "involvedObject.name=orders"}),
        ),
        (("pdb", "orders-active"), ("/apis/policy/v1/namespaces/ns/poddisruptionbudgets/orders-active", {})),
        (("endpointslices",), ("/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices", {})),
    ],
)
def test_polled_kinds_become_one_get(what: tuple[str, ...], expected: tuple[str, dict[str, str]]) -> None:
    assert api_path("ns", what) == expected


@pytest.mark.parametrize(
    "what",
    [
        ("clusterrole", "x"),  # cluster-scoped: not in the table
        ("pod/broker-0",),  # kind/name form
        ("pods", "-o", "wide"),  # any other flag
        ("pod", "a", "b"),  # two names
        ("pod", "a", "-l", "x=y"),  # a name and a selector, which kubectl refuses
        ("pods", "-l"),  # a selector flag without its value
        (),
    ],
)
def test_anything_else_is_left_to_kubectl(what: tuple[str, ...]) -> None:
    assert api_path("ns", what) is None
