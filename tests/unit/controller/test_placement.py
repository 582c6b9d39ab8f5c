"""The default spread (placement.py): over zones where the schedulable nodes carry two zones or
more, decided once per pod, hard only for the pod whose journal volume is still to be made; over
hosts always."""

from __future__ import annotations

from typing import Any

from broker_operator.controller import builders, names, placement
from broker_operator.controller.placement import NodeZones, zone_spread
from broker_operator.controller.spec import parse_spec

OWNER: dict[str, Any] = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "orders", "namespace": "erp", "uid": "uid-1"},
}


def node(name: str, zone: str | None = None, **spec: Any) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if zone is not None:
        labels[placement.ZONE_TOPOLOGY] = zone
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def zones_of(*nodes: dict[str, Any]) -> frozenset[str]:
    known = NodeZones()
    for item in nodes:
        known.observe(item["metadata"]["name"], item)
    return known.zones()


def test_hosts_only_without_zone_labels_or_with_one_zone() -> None:
    assert zone_spread(zones_of(node("a"), node("b"), node("c")), journal_bound=False) is None
    assert zone_spread(zones_of(node("a", "eu-1a"), node("b", "eu-1a")), journal_bound=False) is None
    # Some nodes labelled, one zone among them: still nothing to spread over.
    assert zone_spread(zones_of(node("a", "eu-1a"), node("b")), journal_bound=False) is None


def test_zones_are_a_hard_rule_for_a_new_journal_and_a_preference_for_a_bound_one() -> None:
    zones = zones_of(node("a", "eu-1a"), node("b", "eu-1b"), node("c"))
    assert zones == {"eu-1a", "eu-1b"}
    assert zone_spread(zones, journal_bound=False) == "DoNotSchedule"
    # Its volume decides where it goes; a hard rule could only keep it Pending.
    assert zone_spread(zones, journal_bound=True) == "ScheduleAnyway"
    assert placement.journal_bound({"spec": {"volumeName": "pvc-123"}})
    assert not placement.journal_bound({"spec": {}}) and not placement.journal_bound(None)


def test_nodes_no_pod_can_be_placed_on_do_not_count() -> None:
    cordoned = node("b", "eu-1b", unschedulable=True)
    leaving = node("c", "eu-1c", taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])
    assert zones_of(node("a", "eu-1a"), cordoned, leaving) == {"eu-1a"}
    known = NodeZones()
    known.observe("a", node("a", "eu-1a"))
    known.observe("b", node("b", "eu-1b"))
    known.observe("b", None)  # deleted
    assert known.zones() == {"eu-1a"}
    known.observe("b", node("b", "eu-1b"))  # back
    known.observe("b", cordoned)
    assert known.zones() == {"eu-1a"}


def test_the_start_listing_never_overrides_what_the_watch_said() -> None:
    known = NodeZones()
    known.observe("b", node("b", "eu-1b", unschedulable=True))
    known.observe("c", None)
    known.seed([node("a", "eu-1a"), node("b", "eu-1b"), node("c", "eu-1c")])
    assert known.zones() == {"eu-1a"}


def test_a_spread_pod_keeps_the_host_spread_and_counts_only_its_clusters_pods() -> None:
    spec = parse_spec("orders", {"account": "a", "company": "c"})
    pod = builders.build_pod(OWNER, 0, spec, active=False, zones="DoNotSchedule")
    (constraint,) = pod["spec"]["topologySpreadConstraints"]
    assert constraint == {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": names.cluster_labels("orders")},
        # A lost zone's nodes are tainted unreachable: not an empty zone holding a replacement back.
        "nodeTaintsPolicy": "Honor",
    }
    assert "minDomains" not in constraint  # one usable zone left still runs the brokers
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    hosts_only = builders.build_pod(OWNER, 0, spec, active=False)
    assert "topologySpreadConstraints" not in hosts_only["spec"]
    # spec.affinity replaces the host spread only; the zone spread is topologySpreadConstraints'.
    pinned = parse_spec("orders", {"account": "a", "company": "c", "affinity": {}})
    pod = builders.build_pod(OWNER, 0, pinned, active=False, zones="DoNotSchedule")
    assert pod["spec"]["affinity"] == {} and len(pod["spec"]["topologySpreadConstraints"]) == 1


def test_the_decision_is_the_pods_own_and_not_in_its_template() -> None:
    # Made once per pod: a node that joins, or a zone that appears, must not roll running pods.
    spec = parse_spec("orders", {"account": "a", "company": "c"})
    digests = {
        builders.build_pod(OWNER, 0, spec, active=False, zones=zones)["metadata"]["annotations"][
            names.ANNOTATION_TEMPLATE_HASH
        ]
        for zones in (None, "DoNotSchedule", "ScheduleAnyway")
    }
    assert len(digests) == 1
    assert placement.describe("DoNotSchedule") == "spread over zones and hosts"
    assert placement.describe(None) == "spread over hosts"
