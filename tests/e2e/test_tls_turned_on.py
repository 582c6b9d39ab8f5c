"""An operator upgrade that turns the brokers' TLS on (the chart's ``operator.brokerTls`` from false
to true), on the sealed local cluster, as docs/operator.md ("TLS on by default, and the opt-out")
says it goes.

The relay is installed with the opt-out (``deploy_relay(broker_tls=False)``: the chart's
``operator.brokerTls=false``, the brokers and the backend → broker leg on plain HTTP), and its
traffic is sent and confirmed first. Then ``helm upgrade --reuse-values --set
operator.brokerTls=true``: the pods' template changes (the certificates mounted, ``BROKER_TLS_DIR``,
HTTPS probes), so each broker pod is replaced once, one at a time, the standby first, then one
planned switchover (a new epoch, no failover, never two pods labelled active), then the old active.
Afterwards both brokers serve TLS, verified against the cluster's CA under their DNS names, and the
operator heartbeats them (Healthy, one Active, one Inactive).

The backend simulator still calls ``http://`` and would be refused from the switchover on: that
URL change is the SAP side's step, which the docs describe; this test is about the roll.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local_cluster.broker_pod_calls import pod_call, serves_tls
from local_cluster.operator_upgrade import upgrade_operator
from local_cluster.relay import CLUSTER_NAME, Relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import relay_in_new_namespace, wait_for
from tests.e2e.test_upgrade import event_counts, labelled_active

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

BROKERS = (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1")


@pytest.fixture(scope="module")
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    with relay_in_new_namespace(
        sealed_cluster,
        "tlson",
        streams=2,
        messages_per_stream=10,
        broker_tls=False,
        spec={"failback": "Manual"},  # no failback after the roll: one switchover, the roll's
    ) as relay:
        yield relay


def test_turning_tls_on_rolls_each_broker_once_standby_first_with_one_switchover(relay: Relay) -> None:
    assert not any(serves_tls(relay.pod(name)) for name in BROKERS)
    relay.backend("/sim/start", {})
    relay.wait_all_confirmed()  # the plain-HTTP relay works, end to end
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
    status = relay.status()
    active, epoch = str(status["active"]), int(status["epoch"])
    (standby,) = [name for name in BROKERS if name != active]
    before = event_counts(relay)
    seen: dict[str, list[str]] = {name: [relay.pod(name)["metadata"]["uid"]] for name in BROKERS}
    replaced: list[str] = []  # in the order their first pod went
    actives_labelled: list[int] = []

    upgrade_operator(relay, {"operator.brokerTls": "true"})

    def rolled() -> bool:
        actives_labelled.append(labelled_active(relay))
        pods = {name: relay.get("pod", name) for name in BROKERS}
        for name, pod in pods.items():
            gone = pod is None or pod["metadata"]["uid"] != seen[name][0]
            if gone and name not in replaced:
                replaced.append(name)
            if pod is not None and pod["metadata"]["uid"] not in seen[name]:
                seen[name].append(pod["metadata"]["uid"])
        return (
            all(pod is not None and serves_tls(pod) for pod in pods.values())
            and all(relay.pod_ready(name) for name in BROKERS)
            and relay.status().get("phase") == "Healthy"
        )

    wait_for(
        "both broker pods serving TLS, Ready, and the cluster Healthy", rolled, timeout=300, interval=0.25
    )
    assert replaced == [standby, active], replaced  # the standby first
    assert all(len(uids) == 2 for uids in seen.values()), seen  # each pod replaced once
    assert max(actives_labelled) <= 1, "two broker pods labelled active at once"
    during = event_counts(relay) - before
    assert during["Switchover"] == 1 and during["Failover"] == 0, during
    after = relay.status()
    assert (after["active"], int(after["epoch"])) == (standby, epoch + 1), after
    states = {broker["name"]: broker["state"] for broker in after["brokers"]}
    assert states == {standby: "Active", active: "Inactive"}, states  # heartbeated over mutual TLS

    # Both serve TLS now, verified against the cluster's CA under their DNS names.
    for name in BROKERS:
        metrics = relay.cluster.call_in_network(pod_call(relay.cluster, relay.pod(name), 8080, "/metrics"))
        assert "broker_tls_serving_certificate{" in metrics
