"""Where broker pods run: the operator's default spread over hosts and zones, and the scheduling
fields the spec gives (affinity, nodeSelector, tolerations, topologySpreadConstraints,
priorityClassName).

Failover needs a standby that the fault did not take with the active. So, by default:

- **Hosts**: a preferred podAntiAffinity on ``kubernetes.io/hostname`` against the cluster's own pods,
  so that one node's drain, crash or partition takes at most one broker. Preferred: a one-node
  cluster, or more brokers than nodes, still runs them all. ``spec.affinity`` replaces it.
- **Zones** (issue 42): a journal is a zonal ReadWriteOnce volume on every managed cloud, so two
  brokers in one zone are both lost with it, and no broker elsewhere can take over. Where the
  schedulable nodes carry ``topology.kubernetes.io/zone`` labels of at least two zones when a pod
  is made, it gets a topologySpreadConstraint on that key, ``maxSkew: 1``, against the cluster's
  own pods. ``spec.topologySpreadConstraints`` (even ``[]``) replaces it.

The zone rule is ``DoNotSchedule`` only for a pod whose journal claim is not bound yet: with a
``WaitForFirstConsumer`` storage class (the default class of EKS, GKE's ``standard-rwo`` and AKS) that
pod's scheduling chooses the zone of its volume for good, and a preference could lose to the other
scores. A pod whose claim is bound already goes where its volume is whatever any rule says, so it
gets ``ScheduleAnyway``: a hard rule could only keep it Pending, e.g. the brokers of a cluster made
before this spread, both in one zone, when a rollout replaces one of them.

Why only with two zones or more: ``DoNotSchedule`` leaves out every node without the label, so on a
cluster without zone labels it would leave every broker Pending; with one zone it spreads nothing.
On a cluster where only some nodes carry the label, the brokers run on those (docs/crd.md).
``nodeAffinityPolicy`` stays Honor (the default: only nodes the pod's nodeSelector and affinity allow
are domains) and ``nodeTaintsPolicy`` is Honor too: nodes whose taints the pod does not tolerate are
not domains, so a lost zone's nodes (tainted unreachable by the node lifecycle controller) and
cordoned ones do not count as empty zones that hold a replacement back. No ``minDomains``: a
cluster left with one usable zone still runs its brokers there.

The zone decision is made once per pod, when it is created, from what the node watch knows then
(``NodeZones``), and it is not in the pod template's hash (``builders.template_hash``), nor is the
host spread: a node that joins, a zone that appears, or an operator upgrade that brought the zone
spread replaces no running pod. A pod made later (a rollout, a deleted or evicted pod) gets the
decision of its own time.

Pure, but for ``NodeZones``, which the node watch feeds (handlers.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from broker_operator.controller import names
from broker_operator.controller.observed import node_draining
from broker_operator.controller.spec import ClusterSpec

Manifest = dict[str, Any]

HOSTNAME_TOPOLOGY: Final = "kubernetes.io/hostname"
ZONE_TOPOLOGY: Final = "topology.kubernetes.io/zone"
DO_NOT_SCHEDULE: Final = "DoNotSchedule"
SCHEDULE_ANYWAY: Final = "ScheduleAnyway"


@dataclass
class NodeZones:
    """The zone of every node a new pod could be scheduled on, as the node watch last saw it."""

    zone_of: dict[str, str] = field(default_factory=dict)  # node name -> zone
    seen: set[str] = field(default_factory=set)  # every node a watch event or the start listing named

    def observe(self, name: str, node: Mapping[str, Any] | None) -> None:
        """A node watch event; ``node`` None: the node was deleted."""
        self.seen.add(name)
        zone = None if node is None else _schedulable_zone(node)
        if zone is None:
            self.zone_of.pop(name, None)
        else:
            self.zone_of[name] = zone

    def seed(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """The operator's listing at its start, before the watch; what the watch said wins."""
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name") or "")
            if name and name not in self.seen:
                self.observe(name, node)

    def zones(self) -> frozenset[str]:
        return frozenset(self.zone_of.values())


def _schedulable_zone(node: Mapping[str, Any]) -> str | None:
    if node_draining(node):
        return None
    zone = ((node.get("metadata") or {}).get("labels") or {}).get(ZONE_TOPOLOGY)
    return str(zone) if zone else None


def journal_bound(claim: Mapping[str, Any] | None) -> bool:
    """Whether a journal claim has its volume already (and so its zone, for a zonal volume)."""
    return bool(claim and ((claim.get("spec") or {}).get("volumeName")))


def zone_spread(zones: Iterable[str], *, journal_bound: bool) -> str | None:
    """``whenUnsatisfiable`` of the default zone constraint for a pod made now, or None for none."""
    if len(set(zones)) < 2:
        return None
    return SCHEDULE_ANYWAY if journal_bound else DO_NOT_SCHEDULE


def zones_for_new_pod(nodes: NodeZones, claim: Mapping[str, Any] | None) -> str | None:
    """``zone_spread`` for a pod made now, whose journal claim is ``claim`` (None: not seen yet)."""
    return zone_spread(nodes.zones(), journal_bound=journal_bound(claim))


def default_affinity(cluster: str) -> Manifest:
    """Brokers of one cluster on different nodes where the scheduler can (preferred, not required)."""
    term = {
        "topologyKey": HOSTNAME_TOPOLOGY,
        "labelSelector": {"matchLabels": names.cluster_labels(cluster)},
    }
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    }


def default_zone_constraint(cluster: str, when_unsatisfiable: str) -> Manifest:
    """One zone per broker as far as the zones go (``maxSkew`` 1), counting this cluster's pods only."""
    return {
        "maxSkew": 1,
        "topologyKey": ZONE_TOPOLOGY,
        "whenUnsatisfiable": when_unsatisfiable,
        "labelSelector": {"matchLabels": names.cluster_labels(cluster)},
        "nodeTaintsPolicy": "Honor",
    }


def given_scheduling(cluster: str, spec: ClusterSpec) -> Manifest:
    """The pod's scheduling fields the spec sets itself. A spread constraint without ``labelSelector``
    would select no pod and spread nothing: it gets the cluster's own pods' labels."""
    given: Manifest = {}
    if spec.affinity is not None:
        given["affinity"] = dict(spec.affinity)
    if spec.node_selector is not None:
        given["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations is not None:
        given["tolerations"] = [dict(item) for item in spec.tolerations]
    if spec.pod.topology_spread_constraints is not None:
        selector = {"matchLabels": names.cluster_labels(cluster)}
        given["topologySpreadConstraints"] = [
            {"labelSelector": selector, **item} if "labelSelector" not in item else dict(item)
            for item in spec.pod.topology_spread_constraints
        ]
    if spec.pod.priority_class_name is not None:
        given["priorityClassName"] = spec.pod.priority_class_name
    return given


def pod_scheduling(cluster: str, spec: ClusterSpec, zones: str | None = None) -> Manifest:
    """The spec's scheduling fields over the default spread: over hosts always, over zones when
    ``zones`` (``zone_spread``'s answer for this pod) says how."""
    defaults: Manifest = {"affinity": default_affinity(cluster)}
    if zones is not None:
        defaults["topologySpreadConstraints"] = [default_zone_constraint(cluster, zones)]
    return {**defaults, **given_scheduling(cluster, spec)}


def describe(zones: str | None) -> str:
    """How a new pod is spread, for its Created event."""
    if zones == DO_NOT_SCHEDULE:
        return "spread over zones and hosts"
    if zones == SCHEDULE_ANYWAY:
        return "in its journal volume's zone, spread over hosts"
    return "spread over hosts"
