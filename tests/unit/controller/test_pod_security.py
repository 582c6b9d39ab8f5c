"""Broker pods held to the "restricted" Pod Security Standard, and spec.image to the installer's
list (issue 39, finding 3). spec.podSecurityContext and spec.securityContext replace the
operator's restricted defaults whole, and spec.image is any image: a BrokerCluster's author could
run a privileged, root container of their choosing in a pod the operator creates, though they may
not create pods themselves. With ``broker_pod_security="restricted"`` (the chart's default) such a
spec is refused with a condition naming the field, and no pod is made."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest

from broker_operator.controller.kube import KubeApi
from broker_operator.controller.pod_security import BrokerImages, restricted_violations
from broker_operator.controller.settings import parse_settings
from tests.unit.controller.conftest import cluster_body, events_of, eventually, objects_of, running_operator
from tests.unit.controller.test_credentials import condition, create_cluster


@pytest.mark.parametrize(
    ("pod", "container", "complaint"),
    [
        (None, {"privileged": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
         "spec.securityContext.privileged"),
        (None, {"readOnlyRootFilesystem": True}, "spec.securityContext.allowPrivilegeEscalation"),
        (None, {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
         "spec.securityContext.capabilities.add"),
        (None, {"allowPrivilegeEscalation": False}, "spec.securityContext.capabilities.drop"),
        ({"runAsUser": 0}, None, "spec.podSecurityContext.runAsUser"),
        ({"runAsNonRoot": False, "seccompProfile": {"type": "RuntimeDefault"}}, None, "runAsNonRoot"),
        ({"runAsNonRoot": True, "seccompProfile": {"type": "Unconfined"}}, None, "seccompProfile"),
        ({"runAsNonRoot": True}, None, "seccompProfile"),  # the replaced default set it; now nothing does
        ({"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
          "sysctls": [{"name": "kernel.msgmax", "value": "1"}]}, None, "spec.podSecurityContext.sysctls"),
    ],
)  # fmt: skip
def test_what_the_restricted_profile_refuses_is_named(
    pod: dict[str, Any] | None, container: dict[str, Any] | None, complaint: str
) -> None:
    found = restricted_violations(pod, container)
    assert any(complaint in message for message in found), found


def test_the_operators_defaults_and_a_stricter_own_context_pass() -> None:
    assert restricted_violations(None, None) == []
    pod = {
        "runAsNonRoot": True,
        "runAsUser": 20000,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "p"},
    }
    container = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
    }
    assert restricted_violations(pod, container) == []


def test_image_patterns() -> None:
    images = BrokerImages.parse(("registry.example.com/broker-failover/*",))
    assert images.allows("registry.example.com/broker-failover/broker:0.1.0")
    assert not images.allows("evil.example/broker:0.1.0")
    assert BrokerImages.parse(()).allows("anything:1")  # empty: any image


def test_settings() -> None:
    assert parse_settings([], {}).broker_pod_security == "restricted"
    assert (
        parse_settings([], {"OPERATOR_BROKER_POD_SECURITY": "unchecked"}).broker_pod_security == "unchecked"
    )
    images = parse_settings([], {"OPERATOR_BROKER_IMAGES": "registry.example.com/*"}).broker_images
    assert images == BrokerImages.parse(("registry.example.com/*",))


@pytest.mark.looptime
async def test_a_privileged_broker_is_refused_and_no_pod_is_made(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        body = cluster_body("root", replicas=1, securityContext={"privileged": True, "runAsUser": 0})
        await create_cluster(kmock, body)
        await eventually(
            lambda: (
                condition(kmock, "root", "PodSecurityAllowed") is not None
                or bool(objects_of(kmock, "v1/pods"))
            )
        )
        await asyncio.sleep(3.0)
        assert objects_of(kmock, "v1/pods") == {}
        refused = condition(kmock, "root", "PodSecurityAllowed")
        assert refused is not None and refused["status"] == "False" and refused["reason"] == "NotRestricted"
        assert "spec.securityContext.privileged" in refused["message"]
        assert any(e["reason"] == "PodSecurityRefused" for e in events_of(kmock, "root"))


@pytest.mark.looptime
async def test_an_image_outside_the_installers_list_is_refused(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    images = BrokerImages.parse(("registry.example.com/*",))
    async with running_operator(kmock, kube_api, broker_images=images):
        await create_cluster(kmock, cluster_body("elsewhere", replicas=1, image="evil.example/broker:1"))
        await eventually(lambda: condition(kmock, "elsewhere", "PodSecurityAllowed") is not None)
        await asyncio.sleep(3.0)
        assert objects_of(kmock, "v1/pods") == {}
        refused = condition(kmock, "elsewhere", "PodSecurityAllowed")
        assert refused is not None and "spec.image (evil.example/broker:1)" in refused["message"]
