"""On three nodes, a BrokerCluster's brokers and the operator's replicas run on different nodes.

Nothing pins them: the real kube-scheduler places them, following the preferred podAntiAffinity
that the operator gives each broker pod when ``spec.affinity`` is absent, and the chart gives the
operator's pods. With three brokers and three nodes, a drain, crash or partition of one node takes
at most one broker, and one operator replica. Traffic then flows through the ``-active`` Service
with nothing lost, duplicated or out of order.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local_cluster.relay import CLUSTER_NAME, Relay, RelayError
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import relay_in_new_namespace

pytestmark = pytest.mark.three_nodes

STREAMS, MESSAGES = 4, 100  # per stream, per direction


@pytest.fixture
def relay(sealed_cluster_three_nodes: SealedCluster) -> Iterator[Relay]:
    with relay_in_new_namespace(
        sealed_cluster_three_nodes,
        "spread",
        streams=STREAMS,
        messages_per_stream=MESSAGES,
        helm_values={"operator.replicas": "2", "operator.peering": "peering-spread"},
        spec={"replicas": 3},
    ) as relay:
        yield relay


def _nodes_of(relay: Relay, selector: str) -> dict[str, str]:
    pods = (relay.get("pods", "-l", selector) or {}).get("items") or []
    return {pod["metadata"]["name"]: pod["spec"].get("nodeName", "") for pod in pods}


def test_brokers_and_operator_replicas_spread_over_the_nodes(relay: Relay) -> None:
    relay.backend("/sim/start", {})
    brokers = _nodes_of(relay, f"broker.failover.dev/cluster={CLUSTER_NAME}")
    assert len(brokers) == 3, brokers
    assert sorted(brokers.values()) == ["node-1", "node-2", "node-3"], brokers
    operators = _nodes_of(relay, "app.kubernetes.io/component=operator")
    assert len(operators) == 2 and len(set(operators.values())) == 2, operators
    # The spread is the operator's default, not something this test asked for.
    pod = relay.pod(next(iter(brokers)))
    assert "podAntiAffinity" in pod["spec"]["affinity"], pod["spec"].get("affinity")
    try:
        relay.wait_all_confirmed()
    except RelayError as error:
        pytest.fail(
            f"{error}\nstatus: {relay.status()}\nbackend: {relay.backend('/sim/status')}\n"
            f"cloud: {relay.cloud('/sim/status')}\npods: {brokers} {operators}"
        )
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
