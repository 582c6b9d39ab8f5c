"""A starting operator replica joins kopf's peering before kopf looks: on the real API server.

The gap it closes (operator/broker_operator/controller/peering.py): Helm creates the KopfPeering
after the operator's Deployment, so both replicas of a fresh install used to find no peering
object, resume together and handle the same BrokerCluster for 20 s (epochs 1 to 3 granted in turn
to two brokers, seen in a soak). Here the join waits for the object, writes each replica's record
in kopf's own format (kopf's ``Peer`` parses it as alive, with its priority), and two replicas
started at the same instant each find the other's record before either hands over to kopf.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from kopf._core.engines.peering import Peer  # kopf's parser of the records: the format must be its own

from broker_operator.controller.kube import KubeApi
from broker_operator.controller.peering import join_peering
from local_cluster.cluster import REPO_ROOT
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.test_operator import new_namespace

pytestmark = pytest.mark.e2e

PEERING = "join-test"
KOPF_CRDS = REPO_ROOT / "crds" / "kopf.dev_peerings.yaml"


@pytest.fixture
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    sealed_cluster.kubectl("apply", "-f", str(KOPF_CRDS))
    sealed_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "--timeout=60s"
    )
    name = new_namespace(sealed_cluster, "peering")
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def create_peering_later(cluster: SealedCluster, namespace: str, delay: float) -> threading.Thread:
    manifest = f"apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata:\n  name: {PEERING}\n"

    def create() -> None:
        time.sleep(delay)  # the operator pods start first, as with helm install
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=manifest)

    thread = threading.Thread(target=create, daemon=True)
    thread.start()
    return thread


def test_replicas_started_together_wait_for_the_object_and_see_each_other(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    api = KubeApi(sealed_cluster.api_client())
    creator = create_peering_later(sealed_cluster, namespace, delay=1.5)
    seen_when_done: dict[str, set[str]] = {}

    async def replica(identity: str, priority: int) -> bool:
        joined = await join_peering(
            api, PEERING, (namespace,), priority=priority, lifetime_seconds=30, identity=identity
        )
        peering = await asyncio.to_thread(sealed_cluster.get_json, namespace, "kopfpeering", PEERING)
        status = (peering or {}).get("status") or {}
        seen_when_done[identity] = set(status)
        return joined

    async def both() -> list[bool]:
        return list(await asyncio.gather(replica("operator-a", 20), replica("operator-b", 10)))

    started = time.monotonic()
    assert asyncio.run(both()) == [True, True]
    assert time.monotonic() - started >= 1.5  # they waited for the object
    creator.join(timeout=30)
    # Each replica hands over to kopf only once the other's record is there too.
    assert seen_when_done == {
        "operator-a": {"operator-a", "operator-b"},
        "operator-b": {"operator-a", "operator-b"},
    }
    status = sealed_cluster.get_json(namespace, "kopfpeering", PEERING)["status"]
    peers = {name: Peer(identity=name, **record) for name, record in status.items()}
    assert {name: (peer.priority, peer.is_dead) for name, peer in peers.items()} == {
        "operator-a": (20, False),
        "operator-b": (10, False),
    }


def test_without_the_object_it_gives_up_in_bounded_time_and_writes_nothing(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    api = KubeApi(sealed_cluster.api_client())

    async def join() -> bool:
        return await join_peering(
            api, PEERING, (namespace,), priority=1, lifetime_seconds=30, identity="lonely", wait_seconds=1.0
        )

    started = time.monotonic()
    assert asyncio.run(join()) is False
    assert time.monotonic() - started < 10
    assert sealed_cluster.get_json(namespace, "kopfpeering", PEERING) is None
