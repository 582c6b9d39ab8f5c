"""Epoch allocation's requests to the API server: the read, the conditional write, the refusals;
and the engine's status patch, which must never write the epoch (the allocation is its only writer).

kmock does not enforce resourceVersion preconditions, so the 409 a real API
server returns on a stale version is injected here as a reaction; that the
real server does return it, and what a stale live view then costs, is checked
in tests/e2e/test_operator.py.
"""

from __future__ import annotations

import kmock
import pytest

from broker_operator.controller.epochs import allocate_epoch
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.observed import ClusterObservations
from broker_operator.controller.shell import KubernetesClusterShell
from broker_operator.core.status import BrokerStatus, ClusterStatus
from broker_operator.engine import EpochConflict
from tests.unit.controller.conftest import CLUSTERS, NAMESPACE, cluster_body


def store(api: kmock.KubernetesEmulator, epoch: int, version: str = "41") -> None:
    body = cluster_body("orders")
    body["metadata"]["resourceVersion"] = version
    body["status"] = {"epoch": epoch}
    api.objects[CLUSTERS, NAMESPACE, "orders"] = body


def status_patches(api: kmock.KubernetesEmulator) -> list[object]:
    return [r.data for r in api if r.method == "PATCH" and str(r.url).endswith("/orders/status")]


async def test_the_write_is_conditional_on_the_version_read(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    store(kmock, epoch=4)
    assert await allocate_epoch(kube_api, NAMESPACE, "orders", current=4) == 5
    assert status_patches(kmock) == [{"metadata": {"resourceVersion": "41"}, "status": {"epoch": 5}}]


async def test_a_stored_epoch_above_ours_means_someone_else_allocated(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    store(kmock, epoch=9)
    with pytest.raises(EpochConflict) as caught:
        await allocate_epoch(kube_api, NAMESPACE, "orders", current=4)
    assert caught.value.current == 9
    assert "status.epoch is 9, above 4" in str(caught.value)
    assert status_patches(kmock) == []  # nothing written


async def test_a_409_from_the_api_server_is_an_epoch_conflict(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    store(kmock, epoch=4)
    kmock["patch", kmock.resource(CLUSTERS), kmock.subresource("status")][:1] << 409
    with pytest.raises(EpochConflict) as caught:
        await allocate_epoch(kube_api, NAMESPACE, "orders", current=4)
    assert "resourceVersion 41" in str(caught.value)
    # kmock records a write even when a reaction refuses it; put back what a real server would hold,
    # at the version the rival's write left, and the next round re-reads and succeeds.
    store(kmock, epoch=4, version="42")
    assert await allocate_epoch(kube_api, NAMESPACE, "orders", current=4) == 5
    assert status_patches(kmock)[-1] == {"metadata": {"resourceVersion": "42"}, "status": {"epoch": 5}}


async def test_an_object_without_a_version_is_never_written(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    store(kmock, epoch=1, version="")
    with pytest.raises(RuntimeError, match="resourceVersion"):
        await allocate_epoch(kube_api, NAMESPACE, "orders", current=1)
    assert status_patches(kmock) == []


async def test_a_jump_above_a_remembered_epoch_is_one_conditional_write(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    store(kmock, epoch=1)
    assert await allocate_epoch(kube_api, NAMESPACE, "orders", current=1, epoch=95) == 95
    assert status_patches(kmock) == [{"metadata": {"resourceVersion": "41"}, "status": {"epoch": 95}}]
    with pytest.raises(ValueError, match="must be above the current epoch"):
        await allocate_epoch(kube_api, NAMESPACE, "orders", current=95, epoch=95)


def reads(api: kmock.KubernetesEmulator) -> int:
    return sum(1 for r in api if r.method == "GET" and str(r.url).endswith("/orders"))


def seen(epoch: int, version: str) -> dict[str, object]:
    """The BrokerCluster as the daemon's live view last showed it."""
    body = cluster_body("orders")
    body["metadata"]["resourceVersion"] = version
    body["status"] = {"epoch": epoch}
    return body


async def test_with_the_live_view_the_allocation_is_one_conditional_write_and_no_read(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    store(kmock, epoch=4)
    assert await allocate_epoch(kube_api, NAMESPACE, "orders", current=4, known=seen(4, "41")) == 5
    assert status_patches(kmock) == [{"metadata": {"resourceVersion": "41"}, "status": {"epoch": 5}}]
    assert reads(kmock) == 0


async def test_a_live_view_showing_a_higher_epoch_is_a_conflict_without_a_request(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    store(kmock, epoch=9)
    with pytest.raises(EpochConflict) as caught:
        await allocate_epoch(kube_api, NAMESPACE, "orders", current=4, known=seen(9, "41"))
    assert caught.value.current == 9
    assert status_patches(kmock) == [] and reads(kmock) == 0


async def test_the_engines_status_patch_never_carries_the_epoch(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    store(kmock, epoch=7)
    shell = KubernetesClusterShell(
        kube_api, cluster_body("orders"), ClusterObservations(), {}, manages_pods=False
    )
    # An engine that still believes in epoch 4 (it stalled while another allocated 7).
    status = ClusterStatus(
        phase="Unavailable", epoch=4, brokers=(BrokerStatus("b0", 0, "Unavailable", "STALE_EPOCH"),)
    )
    await shell.record_status(status)
    (patch,) = status_patches(kmock)
    assert isinstance(patch, dict) and "epoch" not in patch["status"], patch
    assert patch["status"]["brokers"][0]["unavailabilityCode"] == "STALE_EPOCH"
