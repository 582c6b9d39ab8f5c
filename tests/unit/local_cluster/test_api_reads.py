"""kubectl's ``get`` arguments turned into API requests, and what is left to kubectl."""

from __future__ import annotations

import pytest

from local_cluster.api_reads import api_path, table_rows


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


def test_a_table_becomes_the_rows_kubectl_prints() -> None:
    # As the API server printed a BrokerCluster with no status yet (2026-11-26), plus a wide-only column.
    table = {
        "kind": "Table",
        "columnDefinitions": [
            {"name": "Name", "type": "string", "priority": 0},
            {"name": "Active", "type": "string", "priority": 0},
            {"name": "Epoch", "type": "integer", "priority": 0},
            {"name": "Node", "type": "string", "priority": 1},
            {"name": "Age", "type": "date"},
        ],
        "rows": [{"cells": ["orders", None, None, "node-1", "5s"]}, {"cells": ["b", "b-1", 3, None, "1m"]}],
    }
    assert table_rows(table) == [
        {"NAME": "orders", "ACTIVE": "", "EPOCH": "", "AGE": "5s"},
        {"NAME": "b", "ACTIVE": "b-1", "EPOCH": "3", "AGE": "1m"},
    ]
    assert table_rows({"kind": "Table", "columnDefinitions": [{"name": "Name"}], "rows": None}) == []
