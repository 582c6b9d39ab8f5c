"""The ``-active`` Service's shape: built from ``spec.activeService``, brought back to it, others' keys kept.

Against kmock, which stores what it is sent and allocates nothing: where the real API server
would have allocated a node port, the test writes one in, as the API server would; the real
allocation and clearing rules are exercised in tests/e2e/test_tls_and_active_service_crd.py.
"""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from broker_operator.controller import active_service_shape, builders, names
from broker_operator.controller.active_service_shape import apply_active_service, shape_patch
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.spec import parse_spec
from tests.unit.controller.conftest import (
    CLUSTERS,
    NAMESPACE,
    cluster_body,
    events_of,
    eventually,
    objects_of,
    running_operator,
)

OWNER: dict[str, Any] = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "orders", "namespace": NAMESPACE, "uid": "uid-1"},
}
SERVICE_URL = f"/api/v1/namespaces/{NAMESPACE}/services/orders-active"
CLOUD_KEY = "service.beta.kubernetes.io/aws-load-balancer-type"  # as a cloud controller would write

pytestmark = pytest.mark.looptime


def template(**given: Any) -> Any:
    return parse_spec("orders", {"account": "a", "company": "c", "activeService": given}).active_service


def service_of(api: kmock.KubernetesEmulator) -> dict[str, Any]:
    return objects_of(api, "v1/services")["orders-active"]


async def shape(kube_api: KubeApi, **given: Any) -> Any:
    wanted = template(**given)
    return await apply_active_service(
        kube_api, active_service_shape.build_active_service(OWNER, wanted), wanted
    )


def test_the_default_service_is_the_clusterip_service_it_was_with_nothing_to_select() -> None:
    service = active_service_shape.build_active_service(OWNER)
    assert service["spec"] == {
        "type": "ClusterIP",
        "ports": [{"name": "soap", "port": 8080, "targetPort": "soap", "protocol": "TCP"}],
    }
    assert service["metadata"]["labels"] == builders.cluster_labels("orders")
    assert service["metadata"]["annotations"] == {}  # nothing managed, nothing recorded
    # A Service made by the operator before spec.activeService, as the API server stores it, is in
    # shape: an operator upgrade writes nothing.
    before = {
        "metadata": {"name": "orders-active", "labels": builders.cluster_labels("orders")},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "10.96.0.10",
            "ports": [{"name": "soap", "port": 8080, "targetPort": "soap", "protocol": "TCP"}],
        },
    }
    assert (
        shape_patch(
            before, service, parse_spec("orders", {"account": "a", "company": "c"}).active_service
        ).patch
        is None
    )


def test_a_node_port_template_fixes_the_port_and_the_policy() -> None:
    service = active_service_shape.build_active_service(
        OWNER, template(type="NodePort", nodePort=30443, labels={"team": "erp"})
    )
    assert service["spec"] == {
        "type": "NodePort",
        "ports": [{"name": "soap", "port": 8080, "targetPort": "soap", "protocol": "TCP", "nodePort": 30443}],
        "externalTrafficPolicy": "Cluster",  # spelled out, so that one set by hand is set back
    }
    assert "selector" not in service["spec"]
    assert service["metadata"]["labels"] == {**builders.cluster_labels("orders"), "team": "erp"}
    assert service["metadata"]["annotations"][names.ANNOTATION_MANAGED_LABELS] == "team"


def test_a_service_already_in_shape_needs_no_patch_whatever_the_api_server_added() -> None:
    wanted_template = template(type="LoadBalancer", externalTrafficPolicy="Local")
    wanted = active_service_shape.build_active_service(OWNER, wanted_template)
    stored = {
        **wanted,
        "metadata": {
            **wanted["metadata"],
            "annotations": {**wanted["metadata"]["annotations"], CLOUD_KEY: "nlb"},
        },
        "spec": {
            **wanted["spec"],
            "clusterIP": "10.96.0.17",
            "healthCheckNodePort": 31999,
            "ports": [{**wanted["spec"]["ports"][0], "nodePort": 31234}],  # allocated: kept
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}},
    }
    assert shape_patch(stored, wanted, wanted_template).patch is None


async def test_a_new_service_is_created_in_the_templates_shape(
    kube_api: KubeApi, kmock: kmock.KubernetesEmulator
) -> None:
    result = await shape(kube_api, type="NodePort", nodePort=30443, annotations={"a.example/x": "1"})
    assert result.created
    service = service_of(kmock)
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["ports"][0]["nodePort"] == 30443
    assert service["metadata"]["annotations"]["a.example/x"] == "1"
    assert (
        await shape(kube_api, type="NodePort", nodePort=30443, annotations={"a.example/x": "1"})
    ).patched is None


async def test_the_type_goes_clusterip_nodeport_loadbalancer_and_back(
    kube_api: KubeApi, kmock: kmock.KubernetesEmulator
) -> None:
    await shape(kube_api)
    result = await shape(kube_api, type="NodePort")
    assert result.patched == {"spec": {"type": "NodePort", "externalTrafficPolicy": "Cluster"}}
    # The API server allocates a node port; a later pass must keep it, not fight it.
    await kmock.patch(
        SERVICE_URL, json={"spec": {"ports": [{**service_of(kmock)["spec"]["ports"][0], "nodePort": 31234}]}}
    )
    result = await shape(
        kube_api,
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        loadBalancerSourceRanges=["203.0.113.0/24"],
        loadBalancerClass="example.com/internal-vip",
    )
    assert result.patched == {
        "spec": {
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "loadBalancerSourceRanges": ["203.0.113.0/24"],
            "loadBalancerClass": "example.com/internal-vip",
        }
    }
    assert service_of(kmock)["spec"]["ports"][0]["nodePort"] == 31234
    # Back to ClusterIP: the node port goes (the port list is sent without it), and every field a
    # ClusterIP Service must not carry is removed (null in the merge patch).
    result = await shape(kube_api)
    assert result.patched is not None
    assert result.patched["spec"] == {
        "type": "ClusterIP",
        "ports": [{"name": "soap", "port": 8080, "targetPort": "soap", "protocol": "TCP"}],
        "externalTrafficPolicy": None,
        "loadBalancerSourceRanges": None,
        "loadBalancerClass": None,
    }
    spec = service_of(kmock)["spec"]
    assert spec == {
        "type": "ClusterIP",
        "ports": [{"name": "soap", "port": 8080, "targetPort": "soap", "protocol": "TCP"}],
    }
    assert (await shape(kube_api)).patched is None


async def test_a_load_balancers_class_is_not_changed_in_place_but_reported(
    kube_api: KubeApi, kmock: kmock.KubernetesEmulator
) -> None:
    await shape(kube_api, type="LoadBalancer", loadBalancerClass="example.com/a")
    result = await shape(
        kube_api, type="LoadBalancer", loadBalancerClass="example.com/b", annotations={"k.example/x": "1"}
    )
    assert result.problem is not None
    assert "Delete the Service" in result.problem and "'example.com/a'" in result.problem
    assert service_of(kmock)["spec"]["loadBalancerClass"] == "example.com/a"
    assert service_of(kmock)["metadata"]["annotations"]["k.example/x"] == "1"  # the rest is applied


async def test_keys_of_others_are_left_alone_and_keys_dropped_from_the_template_are_removed(
    kube_api: KubeApi, kmock: kmock.KubernetesEmulator
) -> None:
    await shape(
        kube_api,
        type="LoadBalancer",
        annotations={"lb.example/idle-timeout": "60", "lb.example/internal": "true"},
        labels={"team": "erp", "tier": "edge"},
    )
    # A cloud controller adds its own keys; someone edits one of the template's.
    foreign = {
        "metadata": {
            "annotations": {CLOUD_KEY: "nlb", "lb.example/idle-timeout": "10"},
            "labels": {"cloud": "x"},
        }
    }
    await kmock.patch(SERVICE_URL, json=foreign)
    result = await shape(
        kube_api, type="LoadBalancer", annotations={"lb.example/idle-timeout": "60"}, labels={"team": "erp"}
    )
    assert result.patched == {
        "metadata": {
            "annotations": {
                "lb.example/idle-timeout": "60",  # the template's value, set back
                names.ANNOTATION_MANAGED_ANNOTATIONS: "lb.example/idle-timeout",
                names.ANNOTATION_MANAGED_LABELS: "team",
                "lb.example/internal": None,  # set by the operator before, no longer wanted
            },
            "labels": {"tier": None},
        }
    }
    metadata = service_of(kmock)["metadata"]
    assert metadata["annotations"][CLOUD_KEY] == "nlb"
    assert "lb.example/internal" not in metadata["annotations"]
    assert metadata["labels"] == {**builders.cluster_labels("orders"), "team": "erp", "cloud": "x"}


async def test_the_operator_shapes_the_service_brings_it_back_after_deletion_and_on_a_spec_change(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    node_port = {"type": "NodePort", "nodePort": 30443, "annotations": {"lb.example/x": "1"}}
    async with running_operator(kmock, kube_api):
        response = await kmock.post(
            f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{NAMESPACE}/{names.PLURAL}",
            json=cluster_body("orders", replicas=1, activeService=node_port),
        )
        assert response.status < 300, await response.text()
        await eventually(lambda: "orders-active" in objects_of(kmock, "v1/services"))
        assert service_of(kmock)["spec"]["ports"][0]["nodePort"] == 30443
        await kmock.delete(SERVICE_URL)
        await eventually(lambda: "orders-active" not in objects_of(kmock, "v1/services"))
        await eventually(lambda: "orders-active" in objects_of(kmock, "v1/services"))
        service = service_of(kmock)
        assert (service["spec"]["type"], service["spec"]["ports"][0]["nodePort"]) == ("NodePort", 30443)
        assert service["metadata"]["annotations"]["lb.example/x"] == "1"
        assert "selector" not in service["spec"]
        # A spec change (a new generation: kmock does not count them) reshapes it in place.
        url = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{NAMESPACE}/{names.PLURAL}/orders"
        change = {
            "metadata": {"generation": 2},
            "spec": {"activeService": {"type": "ClusterIP", "nodePort": None, "annotations": None}},
        }
        response = await kmock.patch(url, json=change)
        assert response.status < 300, await response.text()
        await eventually(lambda: service_of(kmock)["spec"]["type"] == "ClusterIP")
        assert "nodePort" not in service_of(kmock)["spec"]["ports"][0]
        # The template's key goes, and with it the record of what the operator managed.
        assert service_of(kmock)["metadata"].get("annotations") == {}
        assert any(e["reason"] == "Updated" for e in events_of(kmock, "orders"))
        assert objects_of(kmock, CLUSTERS)["orders"]
