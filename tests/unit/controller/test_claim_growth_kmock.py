"""A larger ``spec.storage.size`` grows the journal claims, through kopf against kmock.

kmock runs no resizer and no kubelet: the tests stand in for them by writing the claims' status
(bound, their capacity), as the tests of the retention policy stand in for the kubelet's pod
status. What is checked is what the operator asks of the API server: which claims it patches and
to what, which StorageClass it reads and how often, and what the status and the events say.
tests/e2e/test_claim_growth.py runs it on the local cluster's real provisioner.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp.web
import attrs
import kmock
import pytest

from broker_operator.controller.claim_sizes import CONDITION_STORAGE
from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import (
    CLUSTERS,
    NAMESPACE,
    RECONCILE_SECONDS,
    VERBS,
    NamingEmulator,
    cluster_body,
    events_of,
    eventually,
    objects_of,
    running_operator,
)
from tests.unit.controller.test_operator_kmock import CLUSTERS_URL, create_cluster

pytestmark = pytest.mark.looptime

CLAIMS = "v1/persistentvolumeclaims"
CLASSES_URL = "/apis/storage.k8s.io/v1/storageclasses"


@attrs.define(kw_only=True)
class ReadCountingEmulator(NamingEmulator):
    """Also records every read of a StorageClass, and every patch of a claim's requested size (the
    tests' own patches, standing in for the PV controller, write only its status and class)."""

    class_reads: list[str] = attrs.field(factory=list, init=False)
    resizes: list[tuple[str, str]] = attrs.field(factory=list, init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        path = str(request.url.path)
        if request.method == "GET" and path.startswith(CLASSES_URL):
            self.class_reads.append(path)
        data = request.data
        if request.method == "PATCH" and "/persistentvolumeclaims/" in path and isinstance(data, dict):
            size = data.get("spec", {}).get("resources", {}).get("requests", {}).get("storage")
            if size is not None:
                self.resizes.append((path.rsplit("/", 1)[-1], size))
        return await super()._handle(request)


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return {**kmock_options, "cls": ReadCountingEmulator}


async def with_storage_classes(api: kmock.KubernetesEmulator) -> None:
    api.resources["storage.k8s.io/v1/storageclasses"] = kmock.ResourceInfo(
        kind="StorageClass", namespaced=False, verbs=VERBS
    )
    for name, expandable in (("expandable", True), ("fixed", None)):
        body: dict[str, Any] = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "example.com/disk",
        }
        if expandable is not None:
            body["allowVolumeExpansion"] = expandable
        response = await api.post(CLASSES_URL, json=body)
        assert response.status < 300, await response.text()


async def bind(api: kmock.KubernetesEmulator, claim: str, capacity: str, storage_class: str) -> None:
    """Stand in for the PV controller (and, later, the resizer): the claim is bound and holds ``capacity``."""
    patch = {
        "spec": {"storageClassName": storage_class},
        "status": {"phase": "Bound", "capacity": {"storage": capacity}},
    }
    response = await api.patch(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{claim}", json=patch)
    assert response.status == 200, await response.text()


def requested(api: kmock.KubernetesEmulator, claim: str) -> str:
    return str(objects_of(api, CLAIMS)[claim]["spec"]["resources"]["requests"]["storage"])


def condition(api: kmock.KubernetesEmulator) -> tuple[str, str, str]:
    """``StorageResized`` as (status, reason, message); empty strings while there is none."""
    status = objects_of(api, CLUSTERS)["orders"].get("status") or {}
    for c in status.get("conditions") or []:
        if c["type"] == CONDITION_STORAGE:
            return c["status"], c["reason"], c["message"]
    return "", "", ""


async def two_bound_claims(api: kmock.KubernetesEmulator, storage_class: str) -> None:
    await create_cluster(api, cluster_body("orders", replicas=2, storage={"size": "1Gi"}))
    await eventually(lambda: len(objects_of(api, CLAIMS)) == 2)
    for claim in ("journal-orders-0", "journal-orders-1"):
        await bind(api, claim, "1Gi", storage_class)
    await eventually(
        lambda: [c.get("capacity") for c in cluster_status_storage(api).get("claims", [])] == ["1Gi", "1Gi"]
    )


def cluster_status_storage(api: kmock.KubernetesEmulator) -> dict[str, Any]:
    return dict((objects_of(api, CLUSTERS)["orders"].get("status") or {}).get("storage") or {})


async def grow_to(api: kmock.KubernetesEmulator, size: str) -> None:
    response = await api.patch(f"{CLUSTERS_URL}/orders", json={"spec": {"storage": {"size": size}}})
    assert response.status == 200, await response.text()


async def test_a_larger_size_raises_each_claim_and_the_status_follows_the_resize(
    kmock: ReadCountingEmulator, kube_api: KubeApi
) -> None:
    await with_storage_classes(kmock)
    async with running_operator(kmock, kube_api):
        await two_bound_claims(kmock, "expandable")
        # Never resized: no condition, and status.storage shows what each claim holds.
        assert condition(kmock) == ("", "", "")
        assert cluster_status_storage(kmock) == {
            "requested": "1Gi",
            "claims": [
                {"name": "journal-orders-0", "requested": "1Gi", "capacity": "1Gi"},
                {"name": "journal-orders-1", "requested": "1Gi", "capacity": "1Gi"},
            ],
        }
        await grow_to(kmock, "1536Mi")
        for claim in ("journal-orders-0", "journal-orders-1"):
            await eventually(lambda claim=claim: requested(kmock, claim) == "1536Mi")
        await eventually(lambda: condition(kmock)[1] == "Resizing")
        status, _, message = condition(kmock)
        assert status == "False"
        assert "journal-orders-0 holds 1Gi of 1536Mi" in message
        asked = [e["message"] for e in events_of(kmock, "orders") if e["reason"] == "ClaimResizeRequested"]
        assert len(asked) == 2
        for claim in ("journal-orders-0", "journal-orders-1"):
            assert any(f"PersistentVolumeClaim/{claim} (it asked for 1Gi)" in m for m in asked), asked
        # The resizer grows one; the driver reports the other's file system still to grow.
        await bind(kmock, "journal-orders-0", "1.5Gi", "expandable")  # the same quantity, another form
        response = await kmock.patch(
            f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/journal-orders-1",
            json={"status": {"conditions": [{"type": "FileSystemResizePending", "status": "True"}]}},
        )
        assert response.status == 200
        await eventually(lambda: "FileSystemResizePending" in condition(kmock)[2])
        assert "journal-orders-0" not in condition(kmock)[2]
        await bind(kmock, "journal-orders-1", "1536Mi", "expandable")
        await eventually(lambda: condition(kmock)[:2] == ("True", "Resized"))
        assert [e["reason"] for e in events_of(kmock, "orders")].count("Resized") == 1
        # One read of the class covered both claims; each claim was asked once.
        assert len(kmock.class_reads) == 1
        assert sorted(kmock.resizes) == [("journal-orders-0", "1536Mi"), ("journal-orders-1", "1536Mi")]


async def test_a_class_without_expansion_is_reported_once_and_asked_again_only_when_due(
    kmock: ReadCountingEmulator, kube_api: KubeApi
) -> None:
    await with_storage_classes(kmock)
    async with running_operator(kmock, kube_api):
        await two_bound_claims(kmock, "fixed")
        await grow_to(kmock, "2Gi")
        await eventually(lambda: condition(kmock)[1] == "ExpansionNotAllowed")
        status, _, message = condition(kmock)
        assert status == "False"
        assert message.startswith("StorageClass fixed does not allow volume expansion")
        assert "journal-orders-0 (1Gi), journal-orders-1 (1Gi) cannot grow to 2Gi" in message
        await asyncio.sleep(5 * RECONCILE_SECONDS)  # five more passes, in loop time
        # No retry storm: one read of the class, no claim patched, one warning.
        assert len(kmock.class_reads) == 1
        assert kmock.resizes == []
        warned = [e for e in events_of(kmock, "orders") if e["reason"] == "ExpansionNotAllowed"]
        assert len(warned) == 1 and warned[0]["type"] == "Warning"
        assert requested(kmock, "journal-orders-0") == "1Gi"
        # Set back to what the claims hold: nothing stands in the way any more.
        await grow_to(kmock, "1Gi")
        await eventually(lambda: condition(kmock)[:2] == ("True", "Resized"))


async def test_a_smaller_size_is_refused_and_no_claim_is_touched(
    kmock: ReadCountingEmulator, kube_api: KubeApi
) -> None:
    await with_storage_classes(kmock)
    async with running_operator(kmock, kube_api):
        await two_bound_claims(kmock, "expandable")
        await grow_to(kmock, "512Mi")
        await eventually(lambda: condition(kmock)[1] == "ShrinkRefused")
        _, _, message = condition(kmock)
        assert (
            "spec.storage.size (512Mi) is below what a claim already asks for, and a claim cannot " in message
        )
        assert "shrink: journal-orders-0 (1Gi), journal-orders-1 (1Gi)" in message
        assert "Set spec.storage.size to 1Gi or more" in message
        await asyncio.sleep(3 * RECONCILE_SECONDS)
        assert kmock.resizes == []
        assert kmock.class_reads == []  # nothing to grow: no class asked
        assert [e["reason"] for e in events_of(kmock, "orders")].count("ShrinkRefused") == 1


async def test_an_unbound_claim_waits_and_a_deprecated_schedule_is_warned_about(
    kmock: ReadCountingEmulator, kube_api: KubeApi
) -> None:
    await with_storage_classes(kmock)
    async with running_operator(kmock, kube_api):
        spec = {"storage": {"size": "1Gi"}, "messageLog": {"schedule": "0 * * * *"}}
        await create_cluster(kmock, cluster_body("orders", replicas=1, **spec))
        await eventually(lambda: len(objects_of(kmock, CLAIMS)) == 1)
        await grow_to(kmock, "2Gi")
        await eventually(lambda: condition(kmock)[1] == "Resizing")
        assert "journal-orders-0 not bound yet: raised to 2Gi once bound" in condition(kmock)[2]
        assert kmock.resizes == []  # a claim that is not bound cannot be resized
        await bind(kmock, "journal-orders-0", "1Gi", "expandable")
        await eventually(lambda: requested(kmock, "journal-orders-0") == "2Gi")
        deprecated = [e for e in events_of(kmock, "orders") if e["reason"] == "DeprecatedField"]
        assert len(deprecated) == 1 and deprecated[0]["type"] == "Warning"
        assert "validator.schedule" in deprecated[0]["message"]
