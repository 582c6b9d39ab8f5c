"""How big the journal claims are against ``spec.storage.size``, and what to do about it; pure.

A journal claim (``journal-<cluster>-<ordinal>``) is created at ``spec.storage.size`` and then
lives on, so a larger size in the spec means nothing until the claims are asked for it. Kubernetes
grows a bound claim when its ``spec.resources.requests.storage`` is raised, and only when its
StorageClass says ``allowVolumeExpansion: true``; the CSI driver grows the volume, then the
kubelet the file system (online, or when the pod next mounts it, ``FileSystemResizePending``).
A claim never shrinks: the API server refuses a request below the current one.

This module reads what the claim watch saw (``claims.py``'s input too) into one view per claim,
decides which claims to raise, and words the ``StorageResized`` condition and ``status.storage``;
``claim_growth.py`` reads the StorageClasses and carries the decisions out. Sizes are compared as
quantities (``1.5Gi`` is ``1536Mi``: the API server rewrites a request in its canonical form).

What it does not decide: anything about the message-log claim (``spec.messageLog.claimName`` is
the user's, created and sized by them), or a claim of an ordinal the spec no longer runs (a
retained claim is raised when a scale-up uses it again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from broker_operator.controller.bodies import ClaimBody

CONDITION_STORAGE = "StorageResized"
# The reasons, most severe first: the condition shows the first that applies and names the rest.
SHRINK_REFUSED = "ShrinkRefused"
EXPANSION_NOT_ALLOWED = "ExpansionNotAllowed"
STORAGE_CLASS_UNREADABLE = "StorageClassUnreadable"
EXPANSION_REFUSED = "ExpansionRefused"
EXPANSION_FAILED = "ExpansionFailed"
RESIZING = "Resizing"
RESIZED = "Resized"
# The claim condition of a volume grown and its file system not yet (offline expansion).
RESIZING_HINT = "FileSystemResizePending"
SEVERITY = (
    SHRINK_REFUSED,
    EXPANSION_NOT_ALLOWED,
    STORAGE_CLASS_UNREADABLE,
    EXPANSION_REFUSED,
    EXPANSION_FAILED,
    RESIZING,
)
# What the resizer and the kubelet report on a claim (its conditions and
# status.allocatedResourceStatuses) when a resize cannot go on without a person.
_FAILED_STATES = frozenset(
    {"ControllerResizeInfeasible", "NodeResizeInfeasible", "ControllerResizeError", "NodeResizeError"}
)


def quantity(text: str | None) -> Decimal | None:
    """A Kubernetes quantity in bytes; None for none or one that does not parse."""
    if not text:
        return None
    try:
        return Decimal(parse_quantity(text))
    except ValueError:
        return None


@dataclass(frozen=True)
class ClaimSize:
    """One journal claim as the watch last saw it."""

    name: str
    requested: str | None  # spec.resources.requests.storage
    capacity: str | None  # status.capacity.storage: absent until the claim is bound
    storage_class: str | None  # spec.storageClassName, as the API server defaulted it
    bound: bool
    resource_version: str | None
    states: tuple[str, ...] = ()  # resize conditions and allocatedResourceStatuses, in words


def claim_size(name: str, claim: ClaimBody) -> ClaimSize:
    spec, status = claim.get("spec", {}), claim.get("status", {})
    conditions = status.get("conditions") or []
    states = [c["type"] for c in conditions if c.get("status") == "True" and c.get("type")]
    states += [state for state in (status.get("allocatedResourceStatuses") or {}).values() if state]
    return ClaimSize(
        name=name,
        requested=(spec.get("resources", {}).get("requests") or {}).get("storage"),
        capacity=(status.get("capacity") or {}).get("storage"),
        storage_class=spec.get("storageClassName") or None,
        bound=status.get("phase") == "Bound",
        resource_version=claim.get("metadata", {}).get("resourceVersion"),
        states=tuple(dict.fromkeys(states)),
    )


def claim_sizes(wanted_claims: Sequence[str], claims: Mapping[str, ClaimBody]) -> list[ClaimSize]:
    """The claims of the ordinals the spec runs, in ordinal order; those not seen yet (or going) left out."""
    return [
        claim_size(name, claims[name])
        for name in wanted_claims
        if name in claims and not claims[name].get("metadata", {}).get("deletionTimestamp")
    ]


@dataclass(frozen=True)
class GrowthPlan:
    """What ``spec.storage.size`` asks of each claim."""

    wanted: str
    grow: tuple[ClaimSize, ...] = ()  # bound, asking for less: raise the request
    waiting: tuple[ClaimSize, ...] = ()  # asking for less but not bound yet: raised once bound
    shrink: tuple[ClaimSize, ...] = ()  # asking for more: a claim cannot shrink
    resizing: tuple[ClaimSize, ...] = ()  # asking for enough, not holding it yet
    failed: tuple[ClaimSize, ...] = ()  # the resizer or the kubelet gave up on it

    @property
    def settled(self) -> bool:
        """Every claim asks for and holds the wanted size (or more)."""
        return not (self.grow or self.waiting or self.shrink or self.resizing or self.failed)


def plan_growth(wanted: str, sizes: Sequence[ClaimSize]) -> GrowthPlan:
    """Sort the claims by what ``wanted`` asks of each (see :class:`GrowthPlan`)."""
    target = quantity(wanted)
    if target is None:  # the CRD's pattern admits only quantities; nothing to compare with otherwise
        return GrowthPlan(wanted)
    grow: list[ClaimSize] = []
    waiting: list[ClaimSize] = []
    shrink: list[ClaimSize] = []
    resizing: list[ClaimSize] = []
    failed: list[ClaimSize] = []
    for size in sizes:
        requested, capacity = quantity(size.requested), quantity(size.capacity)
        if requested is not None and requested > target:
            shrink.append(size)
        elif requested is None or requested < target:
            (grow if size.bound else waiting).append(size)
        elif size.bound and (capacity is None or capacity < requested):
            (failed if _FAILED_STATES.intersection(size.states) else resizing).append(size)
    return GrowthPlan(wanted, tuple(grow), tuple(waiting), tuple(shrink), tuple(resizing), tuple(failed))


@dataclass(frozen=True)
class ClassVerdict:
    """Whether the claims of one StorageClass may grow; ``problem`` says why not, in words."""

    expandable: bool
    problem: str | None = None
    unreadable: bool = False  # the class could not be read (RBAC, the API server): not known


@dataclass(frozen=True)
class ResizeRefusal:
    """The API server's refusal of one claim's resize: the size asked, its answer, and when
    (monotonic) to ask again."""

    size: str
    why: str
    due: float


@dataclass(frozen=True)
class StorageCondition:
    ok: bool
    reason: str
    message: str


@dataclass(frozen=True)
class GrowthOutcome:
    """What the shell could not do for the claims the plan would grow."""

    blocked: Mapping[str, ClassVerdict] = field(default_factory=dict)  # claim -> its class's verdict
    refused: Mapping[str, str] = field(default_factory=dict)  # claim -> the API server's refusal


def _names(sizes: Sequence[ClaimSize]) -> str:
    return ", ".join(s.name for s in sizes)


def storage_condition(plan: GrowthPlan, outcome: GrowthOutcome) -> StorageCondition:
    """``StorageResized``: True once every claim holds ``spec.storage.size``; otherwise False with the
    most severe reason first and every problem named, each with what to do."""
    parts: dict[str, list[str]] = {}
    if plan.shrink:
        largest = max(plan.shrink, key=lambda s: quantity(s.requested) or 0)
        held = ", ".join(f"{s.name} ({s.requested})" for s in plan.shrink)
        parts.setdefault(SHRINK_REFUSED, []).append(
            f"spec.storage.size ({plan.wanted}) is below what a claim already asks for, and a claim "
            f"cannot shrink: {held}. Set spec.storage.size to {largest.requested} or more"
        )
    blocked: dict[tuple[str, bool], list[ClaimSize]] = {}
    for size in plan.grow:
        verdict = outcome.blocked.get(size.name)
        if verdict is not None and verdict.problem:
            blocked.setdefault((verdict.problem, verdict.unreadable), []).append(size)
    for (problem, unreadable), sizes in blocked.items():
        reason = STORAGE_CLASS_UNREADABLE if unreadable else EXPANSION_NOT_ALLOWED
        held = ", ".join(f"{s.name} ({s.requested})" for s in sizes)
        parts.setdefault(reason, []).append(f"{problem}: {held} cannot grow to {plan.wanted}")
    for size in plan.grow:
        if size.name in outcome.refused:
            parts.setdefault(EXPANSION_REFUSED, []).append(
                f"the API server refused to raise {size.name} to {plan.wanted}: {outcome.refused[size.name]}"
            )
    for size in plan.failed:
        parts.setdefault(EXPANSION_FAILED, []).append(
            f"{size.name} holds {size.capacity} of {size.requested}: {', '.join(size.states)} "
            f"(kubectl describe pvc {size.name} has the driver's message)"
        )
    asked = [s for s in plan.grow if s.name not in outcome.blocked and s.name not in outcome.refused]
    for size in [*asked, *plan.resizing]:
        states = f", {', '.join(size.states)}" if size.states else ""
        held = size.capacity or "nothing yet"
        parts.setdefault(RESIZING, []).append(f"{size.name} holds {held} of {plan.wanted}{states}")
    if plan.waiting:
        parts.setdefault(RESIZING, []).append(
            f"{_names(plan.waiting)} not bound yet: raised to {plan.wanted} once bound"
        )
    if not parts:
        return StorageCondition(True, RESIZED, f"every journal claim holds {plan.wanted}")
    reason = next(r for r in SEVERITY if r in parts)
    message = "; ".join(part for r in SEVERITY for part in parts.get(r, []))
    if reason == RESIZING and any(RESIZING_HINT in s.states for s in [*asked, *plan.resizing]):
        message += f" ({RESIZING_HINT}: the kubelet grows the file system when the pod next mounts it)"
    return StorageCondition(False, reason, message)


def storage_status(wanted: str, sizes: Sequence[ClaimSize]) -> dict[str, Any]:
    """``status.storage``: the size asked for and what each claim asks for and holds."""
    claims = []
    for size in sizes:
        entry = {"name": size.name}
        if size.requested:
            entry["requested"] = size.requested
        if size.capacity:
            entry["capacity"] = size.capacity
        claims.append(entry)
    return {"requested": wanted, "claims": claims}
