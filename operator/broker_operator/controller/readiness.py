"""The ``Ready`` condition: is an active broker serving, and if not, what stops it, in words a
person can act on.

``status.phase`` says *that* a cluster is not serving (Pending, Unavailable); this says *why*,
from the two places that know: the kubelet's reasons on the broker pods (a Secret the pod needs is
missing, an image cannot be pulled, a pod cannot be scheduled) and the codes the brokers answered
the operator's heartbeats with (BACKEND_UNREACHABLE, STALE_EPOCH, ...). Pods come first: a broker
that does not run cannot answer.

Pure functions over what the controller already holds (the status, the observed pods); the
reconcile pass writes the result with the other conditions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker_operator.controller.bodies import PodBody

CONDITION_READY = "Ready"
SERVING_PHASES = frozenset({"Healthy", "Degraded"})
# A container waiting for these is on its way up, not stuck.
STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})
_ADVICE = {
    "CreateContainerConfigError": "create the Secret or key the pod names, or fix the spec's reference",
    "ErrImagePull": "check spec.image and that the node can pull it",
    "ImagePullBackOff": "check spec.image and that the node can pull it",
    "ErrImageNeverPull": "the image is not on the node and its pull policy is Never: load it onto the"
    " node (on the local cluster: make images) or fix spec.image",
    "CrashLoopBackOff": "the broker exits at start: read its log (kubectl logs)",
    "Unschedulable": "no node fits the pod: check resources and the journal claim's storage class",
}


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    message: str


def pod_problem(pod: PodBody) -> tuple[str, str] | None:
    """(reason, message) of what keeps a broker pod from running, as the kubelet or scheduler says."""
    status: Mapping[str, Any] = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("reason") or "Unschedulable"), str(condition.get("message") or "")
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason and reason not in STARTING_REASONS:
            return reason, str(waiting.get("message") or "")
    return None


def readiness(status: Mapping[str, Any], pods: Mapping[str, PodBody]) -> Readiness:
    """The Ready condition for a cluster whose spec is valid and which is not in Conflict."""
    active, phase = status.get("active"), status.get("phase")
    if active and phase in SERVING_PHASES:
        return Readiness(True, "ActiveBrokerServing", f"{active} is active with epoch {status.get('epoch')}")
    stuck = [(name, problem) for name, pod in sorted(pods.items()) if (problem := pod_problem(pod))]
    if stuck:
        parts = [f"{name}: {why}" + (f" ({detail})" if detail else "") for name, (why, detail) in stuck]
        advice = _ADVICE.get(stuck[0][1][0])
        return Readiness(False, "BrokerPodsNotRunning", "; ".join(parts) + (f"; {advice}" if advice else ""))
    refusals = [
        f"{b.get('name')} answered {b.get('unavailabilityCode')}"
        + (f" ({b.get('unavailabilityMessage')})" if b.get("unavailabilityMessage") else "")
        for b in status.get("brokers") or []
        if b.get("unavailabilityCode")
    ]
    if refusals:
        return Readiness(False, "NoBrokerCanBeActive", "; ".join(refusals))
    if phase == "FailingOver":
        return Readiness(False, "FailingOver", "a failover or planned switchover is under way")
    return Readiness(False, "WaitingForBrokers", "no broker has answered the operator's heartbeat yet")
