"""A starting operator replica joins kopf's peering before kopf looks: on the real API server.

The gap it closes (operator/broker_operator/controller/peering.py): Helm creates the KopfPeering
after the operator's Deployment, so both replicas of a fresh install used to find no peering
object, resume together and handle the same BrokerCluster for 20 s (epochs 1 to 3 granted in turn
to two brokers, seen in a soak). Here the join waits for the object, writes each replica's record
in kopf's own format (kopf's ``Peer`` parses it as alive), and of two replicas started at the same
instant the one whose record landed second finds the first's before it hands over to kopf and
ranks below it; the first hands over at once (a restarted container after a kill -9 must renew the
leases soon: issue 40). ``test_two_replicas_at_install.py`` runs two operators.
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
from local_cluster.cluster import ClusterAccess
from tests.e2e.support import PlaneAccess, control_plane_only
from tests.e2e.test_operator import new_namespace

pytestmark = pytest.mark.e2e

PEERING = "join-test"


@pytest.fixture(scope="module")
def sealed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlaneAccess]:
    """A control plane alone (no node: the join needs only the API server), under the name the
    tests below were written with."""
    with control_plane_only(tmp_path_factory.mktemp("peering-join"), ("kopf.dev_peerings.yaml",)) as plane:
        yield plane


@pytest.fixture
def namespace(sealed_cluster: PlaneAccess) -> str:
    return new_namespace(sealed_cluster, "peering")


def create_peering_later(cluster: ClusterAccess, namespace: str, delay: float) -> threading.Thread:
    manifest = f"apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata:\n  name: {PEERING}\n"

    def create() -> None:
        time.sleep(delay)  # the operator pods start first, as with helm install
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=manifest)

    thread = threading.Thread(target=create, daemon=True)
    thread.start()
    return thread


def test_replicas_started_together_wait_for_the_object_and_see_each_other(
    sealed_cluster: PlaneAccess, namespace: str
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
        return joined.found

    async def both() -> list[bool]:
        return list(await asyncio.gather(replica("operator-a", 20), replica("operator-b", 10)))

    started = time.monotonic()
    assert asyncio.run(both()) == [True, True]
    assert time.monotonic() - started >= 1.5  # they waited for the object
    creator.join(timeout=30)
    status = sealed_cluster.get_json(namespace, "kopfpeering", PEERING)["status"]
    peers = {name: Peer(identity=name, **record) for name, record in status.items()}
    # Alive, and the one whose record landed second ranks below the first (distinct priorities).
    assert not any(peer.is_dead for peer in peers.values()), peers
    first, second = sorted(peers, key=lambda name: peers[name].lastseen)
    assert peers[second].priority < peers[first].priority, peers
    # The second saw the first's record before it handed over to kopf: it knew to stand by. The
    # first may hand over without the second's (it ranks highest either way).
    assert seen_when_done[second] == {first, second}, seen_when_done
    assert first in seen_when_done[first], seen_when_done


def test_without_the_object_it_gives_up_in_bounded_time_and_writes_nothing(
    sealed_cluster: PlaneAccess, namespace: str
) -> None:
    api = KubeApi(sealed_cluster.api_client())

    async def join() -> bool:
        joined = await join_peering(
            api, PEERING, (namespace,), priority=1, lifetime_seconds=30, identity="lonely", wait_seconds=1.0
        )
        return joined.found

    started = time.monotonic()
    assert asyncio.run(join()) is False
    assert time.monotonic() - started < 10
    assert sealed_cluster.get_json(namespace, "kopfpeering", PEERING) is None
