"""Failover through the ``<cluster>-active`` Service, on the sealed pod network, as users run it.

The chart's operator runs as a pod (in-cluster config through the ``kubernetes`` Service), the
brokers are the example's pods, and the SAP backend and the cloud are simulator pods
(``local_cluster.relay``): the backend sends to ``http://orders-active.<namespace>.svc:8080``
through CoreDNS and kube-proxy, and the brokers reach both simulators by their Service names.
The active broker is killed with kill -9 mid-stream, or cut off by a real network partition
(nftables drops on its interface, both directions); the operator points the Service's
EndpointSlice at the other broker. Proof comes from the simulators' own records: every message
arrived, none twice, each stream in order, in both directions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from local_cluster.relay import Relay, deploy_relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import wait_for

STREAMS, MESSAGES = 4, 150  # per stream, per direction


@pytest.fixture
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    namespace = f"svc-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    relay = deploy_relay(sealed_cluster, namespace, streams=STREAMS, messages_per_stream=MESSAGES)
    yield relay
    relay.uninstall()
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _partition(relay: Relay, pod: str) -> None:
    relay.cluster.partition_pod(relay.pod(pod), "both")


def test_a_kill_9_of_the_active_broker_fails_over_through_the_active_service(relay: Relay) -> None:
    _fail_over_under_traffic(relay, Relay.kill_9)


def test_a_network_partition_of_the_active_broker_fails_over_through_the_active_service(
    relay: Relay,
) -> None:
    _fail_over_under_traffic(relay, _partition)


def _fail_over_under_traffic(relay: Relay, fault: Callable[[Relay, str], None]) -> None:
    active = str(relay.status()["active"])
    assert relay.active_service_addresses() == [relay.pod(active)["status"]["podIP"]]
    relay.backend("/sim/start", {})
    wait_for(
        "a third of the outbound messages confirmed through the Service",
        lambda: int(relay.backend("/sim/status")["confirmed"]) >= STREAMS * MESSAGES // 3,
        timeout=120,
        interval=0.1,
    )
    fault(relay, active)
    after = wait_for(
        "a failover to the other broker",
        lambda: (s := relay.status()).get("active") not in (None, active) and s,
        timeout=90,
    )
    relay.wait_all_confirmed()
    assert relay.active_service_addresses() == [relay.pod(str(after["active"]))["status"]["podIP"]]
    outbound, inbound = relay.cloud("/sim/received"), relay.backend("/sim/received")
    assert len(outbound) == STREAMS and len(inbound) == STREAMS
    for stream, seqs in [*outbound.items(), *inbound.items()]:
        assert seqs == list(range(1, MESSAGES + 1)), f"{stream}: lost, duplicated or out of order"
