"""Upgrades under traffic, on the sealed pod network, the way users make them.

A new broker image is a spec change (``kubectl patch bc ... spec.image``, or the manifest applied
again): the operator replaces the standby first, switches over to it once, then replaces the old
active, which stays a standby. A new chart version is ``helm upgrade``: the operator's pod is
replaced the way the chart's defaults say, and the new one resumes the same active at the same
epoch, without a failover (issue 40). Here with the example's heartbeat (a 10 s lease) and the
chart's defaults (no replicas, peering or strategy set), twice in a row, as a user upgrades: a new
image tag, then a changed CPU request (``local_cluster.operator_upgrade``). The active's lease must
never run out: no self-fence in its log, no ``LEASE_EXPIRED`` in the status, its container not
restarted. In both tests the backend keeps sending through the ``-active`` Service the whole time,
and the simulators' own records must show nothing lost, taken twice or out of order, in either
direction.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from local_cluster.operator_upgrade import OperatorRoll, next_cpu_request, operator_pods, upgrade_operator
from local_cluster.relay import CLUSTER_NAME, Feeder, Relay
from local_cluster.sealed_cluster import SealedCluster
from local_cluster.soak_faults import broker_metrics
from tests.e2e.support import relay_in_new_namespace, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

STREAMS = 4
TEMPLATE_HASH = "broker.failover.dev/template-hash"
BROKERS = (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1")
MOVES = ("Activated", "Failover", "Switchover", "Failback")  # event reasons of a change of active


@pytest.fixture(scope="module")
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    # The release under test: the same images under the next version's tag, as a registry would
    # serve them (the node pulls nothing).
    for image in ("broker", "operator"):
        sealed_cluster.tag_image(
            f"localhost/broker-failover/{image}:0.1.0", f"localhost/broker-failover/{image}:0.1.1"
        )
    # Manual failback: a failback after the roll would be a second, unrelated switchover. The
    # example's heartbeat as it is (a 10 s lease): the old pod hands over, so no lease need
    # outlast the replacement (issue 40).
    with relay_in_new_namespace(
        sealed_cluster, "upgrade", streams=STREAMS, messages_per_stream=10, spec={"failback": "Manual"}
    ) as relay:
        relay.backend("/sim/start", {})
        yield relay


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


ACTIVE_ANSWERS = 'broker_heartbeats_total{state="Active"}'


def active_answers(relay: Relay, broker: str) -> float:
    """How many heartbeats the broker answered Active (its own counter), -1 unreachable."""
    return broker_metrics(relay, broker, (ACTIVE_ANSWERS,)).get(ACTIVE_ANSWERS, -1.0)


def renewed_since(relay: Relay, broker: str) -> Callable[[], bool]:
    before = active_answers(relay, broker)
    return lambda: active_answers(relay, broker) > before >= 0


def moving_past(relay: Relay, count: int) -> Callable[[], bool]:
    return lambda: confirmed(relay) > count


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


@dataclass(frozen=True)
class ActiveContainer:
    """The active broker's container as the kubelet reports it: restarted, it is another one."""

    pod_uid: str
    restarts: int
    started_at: str


def active_container(relay: Relay, name: str) -> ActiveContainer:
    pod = relay.pod(name)
    status = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]
    started = str(((status.get("state") or {}).get("running") or {}).get("startedAt", ""))
    return ActiveContainer(str(pod["metadata"]["uid"]), int(status.get("restartCount", 0)), started)


def lease_expiries(relay: Relay, name: str) -> list[str]:
    """The broker's own log lines that say it fenced itself (a lease that ran out among them), and
    a ``LEASE_EXPIRED`` the status shows for it."""
    log = relay.cluster.kubectl("-n", relay.namespace, "logs", name, "--tail=-1", timeout=60).stdout
    fenced = [line for line in log.splitlines() if "fencing itself" in line or "lease expired" in line]
    brokers = relay.status().get("brokers") or []
    shown = [
        f"status: {b.get('name')} {b.get('unavailabilityCode')}: {b.get('unavailabilityMessage')}"
        for b in brokers
        if b.get("unavailabilityCode") == "LEASE_EXPIRED"
    ]
    return fenced + shown


def test_helm_upgrade_twice_replaces_the_operator_without_a_failover(relay: Relay) -> None:
    feeder = Feeder(relay).start()
    try:
        wait_for("traffic confirmed through the Service", lambda: confirmed(relay) > 0, timeout=120)
        before_status = relay.status()
        active = str(before_status["active"])
        container = active_container(relay, active)
        seen_epoch = relay.backend("/sim/status")["seenEpoch"]
        before = event_counts(relay)
        rolls: list[OperatorRoll] = []
        cpu = next_cpu_request(relay)  # the first upgrade leaves the request as it is
        for upgrade in ({"operator.image.tag": "0.1.1"}, cpu):
            rolls.append(upgrade_operator(relay, upgrade))
            # A pod of the new ReplicaSet (the old ones' names and uids all gone), with the change.
            assert rolls[-1].after and not set(rolls[-1].after) & set(rolls[-1].before), rolls[-1]
            # The new operator renews the active itself (the old one's pod is gone): a lease it
            # did not renew would run out after the checks below, unseen.
            wait_for("the new operator renewing the active", renewed_since(relay, active), timeout=60)
            wait_for("traffic moving with the new operator", moving_past(relay, confirmed(relay)), timeout=60)
        pods = (relay.get("pods", "-l", "app.kubernetes.io/component=operator") or {}).get("items") or []
        assert {p["metadata"]["name"] for p in pods} == set(operator_pods(relay)) == set(rolls[-1].after)
        assert all(c["image"].endswith(":0.1.1") for p in pods for c in p["spec"]["containers"]), pods
        requests = {c["resources"]["requests"]["cpu"] for p in pods for c in p["spec"]["containers"]}
        assert requests == set(cpu.values()), requests
        # Everything the upgrades must not have moved, in one comparison (a failure shows it all):
        # the active and its epoch (the status and what the backend saw), the active's lease (it
        # never fenced itself; the same container), and no event of a move.
        during = event_counts(relay) - before
        after_status = relay.status()
        moved = {
            "active, epoch": (after_status["active"], after_status["epoch"]),
            "backend's epoch": relay.backend("/sim/status")["seenEpoch"],
            "lease expiries": lease_expiries(relay, active),
            "active's container": active_container(relay, active),
            "moves": {reason: n for reason, n in during.items() if reason in MOVES},
        }
        assert moved == {
            "active, epoch": (active, before_status["epoch"]),
            "backend's epoch": seen_epoch,
            "lease expiries": [],
            "active's container": container,
            "moves": {},
        }, f"events during the upgrades: {dict(during)}; they took {[round(r.seconds, 1) for r in rolls]} s"
    finally:
        assert_records_clean_after(relay, feeder)
