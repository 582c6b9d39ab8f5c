"""The order in which a spec change replaces broker pods: standbys, a switchover, then the old active.

A changed spec shows up as pods whose template hash differs from the one the
spec builds now. Replacing the active pod first would turn every upgrade into
a failover under load; replacing all pods at once would leave no broker. So
one pod at a time, and only while every other pod is up and ready:

1. surplus pods (ordinal ≥ replicas) and stale standbys are deleted, lowest
   priority first (the reconciler recreates them from the current spec);
2. when only the active is stale, ask the engine for a planned switchover to
   the highest-priority fresh, ready standby (drain first, then activate);
3. once the active has moved, the old active is a stale standby: step 1.

A pure function of what was observed; the reconciler carries out the step.
It does not create missing pods (the reconciler always does) and does not
decide failovers (the engine does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class PodView:
    """What the planner needs to know about one managed broker pod."""

    name: str
    ordinal: int
    template_hash: str | None
    ready: bool
    terminating: bool


class StepKind(StrEnum):
    DELETE_POD = "DeletePod"
    SWITCHOVER = "Switchover"


@dataclass(frozen=True)
class RolloutStep:
    kind: StepKind
    pod: str  # the pod to delete, or the switchover's target
    reason: str


def next_rollout_step(
    replicas: int, desired_hash: str, pods: Sequence[PodView], active: str | None
) -> RolloutStep | None:
    """The one step to take now, or None when there is nothing to do or something to wait for."""
    present = {pod.ordinal for pod in pods}
    if any(pod.terminating or not pod.ready for pod in pods) or any(
        i not in present for i in range(replicas)
    ):
        return None  # a replacement is still under way; never take down a second pod
    by_priority = sorted(pods, key=lambda pod: pod.ordinal)
    wanted = [pod for pod in by_priority if pod.ordinal < replicas]
    fresh_standbys = [pod for pod in wanted if pod.template_hash == desired_hash and pod.name != active]

    for pod in reversed(by_priority):
        if pod.ordinal >= replicas and pod.name != active:
            return RolloutStep(StepKind.DELETE_POD, pod.name, f"scale down to {replicas} replicas")
    for pod in reversed(wanted):
        if pod.template_hash != desired_hash and pod.name != active:
            return RolloutStep(StepKind.DELETE_POD, pod.name, "standby runs an outdated pod template")

    active_pod = next((pod for pod in by_priority if pod.name == active), None)
    if active_pod is None:
        return None
    stale = active_pod.template_hash != desired_hash or active_pod.ordinal >= replicas
    if stale and fresh_standbys:
        why = "scale down" if active_pod.ordinal >= replicas else "outdated pod template"
        return RolloutStep(
            StepKind.SWITCHOVER, fresh_standbys[0].name, f"active {active} is replaced ({why})"
        )
    return None
