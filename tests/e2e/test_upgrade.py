"""Upgrades under traffic, on the sealed pod network, the way users make them.

A new broker image is a spec change (``kubectl patch bc ... spec.image``, or the manifest applied
again): the operator replaces the standby first, switches over to it once, then replaces the old
active, which stays a standby. A new chart version is ``helm upgrade``: the operator's pod is
replaced (Recreate, as one standalone operator must never run twice) and the new one resumes the
same active at the same epoch, without a failover. In both, the backend keeps sending through
the ``-active`` Service the whole time, and the simulators' own records must show nothing lost,
taken twice or out of order, in either direction.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from local_cluster.relay import CHART, CLUSTER_NAME, Feeder, Relay, deploy_relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

STREAMS = 4
TEMPLATE_HASH = "broker.failover.dev/template-hash"
BROKERS = (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1")


@pytest.fixture(scope="module")
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    namespace = f"upgrade-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    # The release under test: the same images under the next version's tag, as a registry would
    # serve them (the node pulls nothing).
    for image in ("broker", "operator"):
        sealed_cluster.tag_image(
            f"localhost/broker-failover/{image}:0.1.0", f"localhost/broker-failover/{image}:0.1.1"
        )
    # Manual failback: a failback after the roll would be a second, unrelated switchover.
    # A 15 s lease: with one replica the chart's strategy is Recreate, and replacing the operator
    # pod took more than the example's 5 s on a loaded 2-core machine, after which the active
    # rightly fences itself and the new operator re-activates it under a new epoch
    # (docs/operator.md, "Disruptions").
    heartbeat = {"intervalSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2, "leaseSeconds": 15}
    relay = deploy_relay(
        sealed_cluster,
        namespace,
        streams=STREAMS,
        messages_per_stream=10,
        spec={"failback": "Manual", "heartbeat": heartbeat},
    )
    relay.backend("/sim/start", {})
    yield relay
    relay.uninstall()
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def event_counts(relay: Relay) -> Counter[str]:
    """How many times each event reason was recorded for the BrokerCluster (repeats included)."""
    events = relay.get(
        "events", f"--field-selector=involvedObject.kind=BrokerCluster,involvedObject.name={CLUSTER_NAME}"
    )
    counts: Counter[str] = Counter()
    for event in (events or {}).get("items") or []:
        counts[event["reason"]] += int(event.get("count") or 1)
    return counts


def template_hashes(relay: Relay) -> dict[str, str]:
    """Each broker pod's template hash; "" while the pod is being replaced (deleted, not yet made)."""
    pods = {name: relay.get("pod", name) or {} for name in BROKERS}
    return {
        name: ((pod.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH, "")
        for name, pod in pods.items()
    }


def labelled_active(relay: Relay) -> int:
    pods = relay.get("pods", "-l", f"broker.failover.dev/cluster={CLUSTER_NAME}") or {}
    return sum((p["metadata"].get("labels") or {}).get("role") == "active" for p in pods.get("items") or [])


def confirmed(relay: Relay) -> int:
    return int(relay.backend("/sim/status")["confirmed"])


def assert_records_clean_after(relay: Relay, feeder: Feeder) -> None:
    feeder.stop.set()
    relay.wait_all_confirmed()
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}


def test_a_new_broker_image_rolls_the_standby_first_and_switches_over_once(relay: Relay) -> None:
    feeder = Feeder(relay).start()
    try:
        wait_for("traffic confirmed through the Service", lambda: confirmed(relay) > 0, timeout=120)
        active = str(relay.status()["active"])
        old = template_hashes(relay)
        before = event_counts(relay)
        relay.cluster.kubectl(
            "-n", relay.namespace, "patch", "brokercluster", CLUSTER_NAME, "--type=merge",
            "-p", json.dumps({"spec": {"image": "localhost/broker-failover/broker:0.1.1"}}),
        )  # fmt: skip
        samples: list[int] = []

        def rolled() -> bool:
            samples.append(labelled_active(relay))
            hashes = template_hashes(relay)
            status = relay.status()
            return (
                all(hashes[name] and hashes[name] != old[name] for name in BROKERS)
                and status.get("phase") == "Healthy"
                and all(relay.pod_ready(name) for name in BROKERS)
            )

        wait_for("both broker pods replaced and the cluster Healthy", rolled, timeout=300, interval=0.5)
        assert max(samples) <= 1, "two broker pods labelled active at once"
        status = relay.status()
        assert status["active"] != active, "the old active was replaced in place, not switched away from"
        during = event_counts(relay) - before
        assert during["Switchover"] == 1, during
        assert during["Failover"] == 0, during
        moving = confirmed(relay)
        wait_for("traffic moving after the roll", lambda: confirmed(relay) > moving, timeout=60)
    finally:
        assert_records_clean_after(relay, feeder)


def test_helm_upgrade_replaces_the_operator_without_a_failover(relay: Relay) -> None:
    feeder = Feeder(relay).start()
    try:
        wait_for("traffic confirmed through the Service", lambda: confirmed(relay) > 0, timeout=120)
        before_status = relay.status()
        operator = relay.get("pods", "-l", "app.kubernetes.io/component=operator") or {}
        old_operators = {p["metadata"]["name"] for p in operator.get("items") or []}
        assert old_operators, "no operator pod found by app.kubernetes.io/component=operator"
        before = event_counts(relay)
        relay.cluster.helm(
            "upgrade", relay.release, str(CHART), "--namespace", relay.namespace, "--reuse-values",
            "--set", "operator.image.tag=0.1.1", "--wait", "--timeout=240s",
            timeout=300,
        )  # fmt: skip

        def new_operator_acting() -> bool:
            pods = (relay.get("pods", "-l", "app.kubernetes.io/component=operator") or {}).get("items") or []
            names = {p["metadata"]["name"] for p in pods}
            images = {c["image"] for p in pods for c in p["spec"]["containers"]}
            return bool(names) and not names & old_operators and all(i.endswith(":0.1.1") for i in images)

        wait_for("the operator pod replaced by the new version", new_operator_acting, timeout=180)
        moving = confirmed(relay)
        wait_for("traffic moving with the new operator", lambda: confirmed(relay) > moving, timeout=60)
        after_status = relay.status()
        assert (after_status["active"], after_status["epoch"]) == (
            before_status["active"],
            before_status["epoch"],
        ), "the new operator moved the active or took a new epoch"
        during = event_counts(relay) - before
        assert not {"Failover", "Switchover", "Activated"} & set(during), during
    finally:
        assert_records_clean_after(relay, feeder)
