"""The ``<cluster>-active`` Service's endpoints, written by the operator (issue 23), on the sealed cluster.

Two halves:
- the fenced write itself (``active_service.point_active_service``) against the real API server:
  epochs only go up, a lower one is refused and changes nothing, concurrent writers end on the
  highest epoch;
- the operator as users run it (the chart's pod, ``local_cluster.relay``): the Service selects
  nothing and its one slice follows a kill -9 of the active; a slice deleted by hand comes back;
  a Service of the selector era is converted while traffic flows, and no moment has two
  endpoints (a poller reads every slice of the Service while it happens).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from broker_operator.controller import active_service, names
from broker_operator.controller.active_service import KnownSlice, point_active_service, slice_epoch
from broker_operator.controller.kube import KubeApi
from broker_operator.engine import ServiceFenced
from local_cluster.relay import CLUSTER_NAME, Relay, deploy_relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import wait_for

SERVICE = f"{CLUSTER_NAME}-active"
STREAMS, MESSAGES = 2, 100


# ---- the fenced write, against the API server ------------------------------------------------


@pytest.fixture
def owner(sealed_cluster: SealedCluster) -> Iterator[dict[str, Any]]:
    """A namespace and an object named ``orders`` to own the slice, as the BrokerCluster does (the
    garbage collector deletes a dependent whose owner is gone, so the owner must be real)."""
    namespace = f"fence-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    sealed_cluster.kubectl("-n", namespace, "create", "configmap", CLUSTER_NAME)
    made = sealed_cluster.get_json(namespace, "configmap", CLUSTER_NAME)
    yield {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CLUSTER_NAME, "namespace": namespace, "uid": made["metadata"]["uid"]},
    }
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _slice(cluster: SealedCluster, namespace: str) -> dict[str, Any]:
    return dict(cluster.get_json(namespace, "endpointslice", SERVICE))


def test_the_slice_is_written_only_upwards_in_epoch(
    sealed_cluster: SealedCluster, owner: dict[str, Any]
) -> None:
    namespace = owner["metadata"]["namespace"]
    api = KubeApi(sealed_cluster.api_client())
    b0 = active_service.ActiveEndpoint(pod="orders-0", address="10.244.0.10")
    b1 = active_service.ActiveEndpoint(pod="orders-1", address="10.244.0.11")

    async def story() -> None:
        assert await point_active_service(api, owner, b0, 5) is True  # created
        assert await point_active_service(api, owner, b0, 5) is False  # nothing to change: no write
        with pytest.raises(ServiceFenced, match="epoch 5, above 4"):
            await point_active_service(api, owner, b1, 4)
        written = _slice(sealed_cluster, namespace)
        assert slice_epoch(written) == 5 and written["endpoints"][0]["addresses"] == ["10.244.0.10"]
        assert await point_active_service(api, owner, None, 6) is True  # nobody, under the cluster's epoch
        assert _slice(sealed_cluster, namespace).get("endpoints") in (None, [])
        # Two writers at once (two operators during a leader change): the higher epoch stays.
        results = await asyncio.gather(
            point_active_service(api, owner, b0, 7),
            point_active_service(api, owner, b1, 8),
            return_exceptions=True,
        )
        assert not [r for r in results if not isinstance(r, bool | ServiceFenced)], results

    asyncio.run(story())
    final = _slice(sealed_cluster, namespace)
    assert slice_epoch(final) == 8 and final["endpoints"][0]["addresses"] == ["10.244.0.11"]
    labels = final["metadata"]["labels"]
    assert labels[names.LABEL_SLICE_MANAGED_BY] == names.SLICE_MANAGER
    assert labels[names.LABEL_SERVICE_NAME] == SERVICE


class CountingReads(KubeApi):
    """The real API client, counting the slice reads (the failover path should make none)."""

    reads = 0

    async def read_endpoint_slice(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return await super().read_endpoint_slice(namespace, name)


def test_a_write_after_the_engines_own_skips_the_read_and_a_stale_memory_still_fences(
    sealed_cluster: SealedCluster, owner: dict[str, Any]
) -> None:
    namespace = owner["metadata"]["namespace"]
    api = CountingReads(sealed_cluster.api_client())
    b0 = active_service.ActiveEndpoint(pod="orders-0", address="10.244.0.10")
    b1 = active_service.ActiveEndpoint(pod="orders-1", address="10.244.0.11")
    known = KnownSlice()

    async def story() -> None:
        assert await point_active_service(api, owner, b0, 2, known) is True  # created
        assert await point_active_service(api, owner, b1, 3, known) is True  # read once: created last
        before = api.reads
        assert await point_active_service(api, owner, b0, 4, known) is True
        assert api.reads == before  # the precondition came from the last write, not a read
        # Another operator writes under a higher epoch behind this one's back: its memory is stale.
        assert await point_active_service(api, owner, b1, 6) is True
        with pytest.raises(ServiceFenced, match="epoch 6, above 5"):
            await point_active_service(api, owner, None, 5, known)
        # Unchanged content is never taken from memory: a slice deleted by hand is written again.
        assert await point_active_service(api, owner, b1, 6, known) is False
        sealed_cluster.kubectl("-n", namespace, "delete", "endpointslice", SERVICE)
        assert await point_active_service(api, owner, b1, 6, known) is True

    asyncio.run(story())
    final = _slice(sealed_cluster, namespace)
    assert slice_epoch(final) == 6 and final["endpoints"][0]["addresses"] == ["10.244.0.11"]


# ---- the operator as users run it ----------------------------------------------------------------


@pytest.fixture
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    namespace = f"active-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    relay = deploy_relay(sealed_cluster, namespace, streams=STREAMS, messages_per_stream=MESSAGES)
    yield relay
    relay.uninstall()
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _slices(relay: Relay) -> list[dict[str, Any]]:
    found = relay.get("endpointslices", "-l", f"{names.LABEL_SERVICE_NAME}={SERVICE}") or {}
    return list(found.get("items") or [])


def _ours(relay: Relay) -> dict[str, Any] | None:
    return next((s for s in _slices(relay) if s["metadata"]["name"] == SERVICE), None)


def _pointed_at_active(relay: Relay) -> bool:
    status = relay.status()
    ours = _ours(relay)
    if ours is None or not status.get("active"):
        return False
    return relay.active_service_addresses() == [relay.pod(str(status["active"]))["status"]["podIP"]]


def _kill_the_active_until_the_slice_follows(relay: Relay, before: dict[str, Any]) -> dict[str, Any]:
    """kill -9 of the active ``before`` names; the status once another broker is active, after the
    slice names it too."""
    relay.kill_9(str(before["active"]))
    after: dict[str, Any] = wait_for(
        "a failover",
        lambda: (s := relay.status()).get("active") not in (None, before["active"]) and s,
        timeout=90,
    )
    wait_for("the slice naming the new active", lambda: _pointed_at_active(relay), timeout=30)
    return after


def test_the_service_selects_nothing_and_its_slice_follows_a_kill_9(relay: Relay) -> None:
    service = relay.get("service", SERVICE)
    assert "selector" not in service["spec"], service["spec"]
    wait_for("the slice naming the active", lambda: _pointed_at_active(relay), timeout=60)
    before = relay.status()
    (only,) = _slices(relay)  # ours alone: the EndpointSlice controller writes none
    assert only["metadata"]["labels"][names.LABEL_SLICE_MANAGED_BY] == names.SLICE_MANAGER
    assert slice_epoch(only) == before["epoch"]
    after = _kill_the_active_until_the_slice_follows(relay, before)
    ours = _ours(relay)
    assert ours is not None and slice_epoch(ours) == after["epoch"] > before["epoch"]
    assert ours["metadata"]["annotations"][names.ANNOTATION_ACTIVE] == after["active"]
    assert [s["metadata"]["name"] for s in _slices(relay)] == [SERVICE]
    # Noticed at once, from the operator's watch connection to the broker's process, not from the
    # kubelet's report about a second later (docs/failover-engine.md, "Proofs of death").
    assert after["lastFailover"]["reason"] == "PROCESS_GONE", after["lastFailover"]


def test_a_slice_deleted_by_hand_is_written_again(relay: Relay) -> None:
    wait_for("the slice naming the active", lambda: _pointed_at_active(relay), timeout=60)
    relay.cluster.kubectl("-n", relay.namespace, "delete", "endpointslice", SERVICE)
    wait_for("the slice written again", lambda: _pointed_at_active(relay), timeout=30)


def test_a_stale_slice_written_by_hand_is_corrected(relay: Relay) -> None:
    wait_for("the slice naming the active", lambda: _pointed_at_active(relay), timeout=60)
    status = relay.status()
    standby = next(b["name"] for b in status["brokers"] if b["name"] != status["active"])
    wrong = relay.pod(standby)["status"]["podIP"]
    patch = [{"op": "replace", "path": "/endpoints/0/addresses", "value": [wrong]}]
    relay.cluster.kubectl(
        "-n",
        relay.namespace,
        "patch",
        "endpointslice",
        SERVICE,
        "--type=json",
        f"--patch={json.dumps(patch)}",
    )
    assert relay.status().get("active") == status["active"]  # nothing moved: only the slice is wrong
    wait_for("the slice corrected", lambda: _pointed_at_active(relay), timeout=30)


def test_with_the_controller_manager_stopped_a_failover_still_moves_the_service(relay: Relay) -> None:
    """The Service's endpoints are the operator's to write: no controller of kube-controller-manager
    (EndpointSlice, ReplicaSet, garbage collector) takes part in a failover."""
    wait_for("the slice naming the active", lambda: _pointed_at_active(relay), timeout=60)
    relay.backend("/sim/start", {})
    wait_for("traffic", lambda: int(relay.backend("/sim/status")["confirmed"]) > 0, timeout=60)
    before = relay.status()
    relay.cluster.signal_controller_manager("STOP")
    try:
        after = _kill_the_active_until_the_slice_follows(relay, before)
        # Messages produced after the failover are confirmed too: they went through the Service.
        relay.backend("/sim/produce", {"count": 5})
        relay.wait_all_confirmed(timeout=120)
    finally:
        relay.cluster.signal_controller_manager("CONT")
    assert after["epoch"] > before["epoch"]


class SlicePoller:
    """Reads every slice of the Service as fast as the API server answers, from a thread, and keeps
    the most distinct ready addresses it ever saw at once (what kube-proxy would route to)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.stop = threading.Event()
        self.most: list[str] = []
        self.reads = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name="slice-poller")

    def _run(self) -> None:
        api = self.relay.cluster.api_client()
        discovery = client.DiscoveryV1Api(api)
        while not self.stop.is_set():
            slices = discovery.list_namespaced_endpoint_slice(
                self.relay.namespace, label_selector=f"{names.LABEL_SERVICE_NAME}={SERVICE}"
            )
            addresses = sorted(
                {
                    address
                    for item in slices.items
                    for endpoint in item.endpoints or []
                    if endpoint.conditions is None or endpoint.conditions.ready is not False
                    for address in endpoint.addresses
                }
            )
            self.reads += 1
            if len(addresses) > len(self.most):
                self.most = addresses
            time.sleep(0.005)

    def __enter__(self) -> SlicePoller:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def _operator_replicas(relay: Relay, replicas: int) -> None:
    deployment = next(
        d["metadata"]["name"]
        for d in relay.get("deployments", "-l", "app.kubernetes.io/component=operator")["items"]
    )
    relay.cluster.kubectl(
        "-n", relay.namespace, "scale", f"deployment/{deployment}", f"--replicas={replicas}"
    )
    wait_for(
        f"{replicas} operator pod(s)",
        lambda: len(relay.get("pods", "-l", "app.kubernetes.io/component=operator")["items"]) == replicas,
        timeout=120,
    )


def test_a_selector_service_of_an_older_operator_is_converted_without_two_endpoints(relay: Relay) -> None:
    wait_for("the slice naming the active", lambda: _pointed_at_active(relay), timeout=60)
    active = str(relay.status()["active"])
    # The state an operator from before issue 23 left: a Service selecting role=active, its
    # endpoints written by the EndpointSlice controller, no slice of ours.
    _operator_replicas(relay, 0)
    selector = {names.LABEL_CLUSTER: CLUSTER_NAME, names.LABEL_ROLE: names.ROLE_ACTIVE}
    relay.cluster.kubectl(
        "-n", relay.namespace, "patch", "service", SERVICE, "--type=merge", "-p",
        f'{{"spec": {{"selector": {{"{names.LABEL_CLUSTER}": "{CLUSTER_NAME}", "role": "active"}}}}}}',
    )  # fmt: skip
    relay.cluster.kubectl("-n", relay.namespace, "delete", "endpointslice", SERVICE)
    active_ip = relay.pod(active)["status"]["podIP"]
    wait_for(
        "the EndpointSlice controller's slice naming the active",
        lambda: (
            [s["metadata"]["labels"][names.LABEL_SLICE_MANAGED_BY] for s in _slices(relay)]
            == [names.SLICE_CONTROLLER]
            and relay.active_service_addresses() == [active_ip]
        ),
        timeout=60,
    )
    assert relay.get("service", SERVICE)["spec"]["selector"] == selector
    relay.backend("/sim/start", {})
    with SlicePoller(relay) as poller:
        _operator_replicas(relay, 1)
        wait_for(
            "the Service converted: no selector, our slice alone, naming the active",
            lambda: (
                "selector" not in relay.get("service", SERVICE)["spec"]
                and [s["metadata"]["name"] for s in _slices(relay)] == [SERVICE]
                and _pointed_at_active(relay)
            ),
            timeout=120,
        )
        # Fail over right after: the old controller slice would now disagree with ours.
        relay.kill_9(str(relay.status()["active"]))
        wait_for("a failover", lambda: relay.status().get("active") not in (None, active), timeout=90)
        wait_for("the slice naming the new active", lambda: _pointed_at_active(relay), timeout=30)
    assert poller.reads > 20, poller.reads
    assert len(poller.most) <= 1, f"the Service had {poller.most} at once"
    assert relay.get("endpoints", SERVICE) is None  # the endpoints controller's leftover, deleted
    relay.wait_all_confirmed()
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
