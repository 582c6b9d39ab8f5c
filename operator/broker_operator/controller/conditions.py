"""The BrokerCluster's status conditions, written only when one changes.

Shared by the reconcile and the checks of what a spec may use (permitted.py); no I/O here.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker_operator.controller.reconcile import ClusterRef


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    ref: ClusterRef,
    patch: MutableMapping[str, Any],
    kind: str,
    *,
    ok: bool | None,
    reason: str,
    message: str,
) -> None:
    """Set one condition (``ok`` None: status Unknown), writing only when its status, reason or
    message changed (on top of any condition this pass already set)."""
    conditions = [dict(c) for c in patch.get("conditions", ref.status.get("conditions")) or []]
    current = next((c for c in conditions if c.get("type") == kind), None)
    status = "Unknown" if ok is None else "True" if ok else "False"
    wanted = {"type": kind, "status": status, "reason": reason, "message": message}
    if current is not None and all(current.get(k) == v for k, v in wanted.items()):
        return
    generation = ref.body["metadata"].get("generation")
    wanted.update(lastTransitionTime=_now(), **({"observedGeneration": generation} if generation else {}))
    conditions = [c for c in conditions if c.get("type") != kind] + [wanted]
    patch["conditions"] = conditions


def remove_condition(ref: ClusterRef, patch: MutableMapping[str, Any], kind: str) -> None:
    """Drop one condition, writing only when it is there (on top of this pass's conditions)."""
    conditions = [dict(c) for c in patch.get("conditions", ref.status.get("conditions")) or []]
    kept = [c for c in conditions if c.get("type") != kind]
    if len(kept) != len(conditions):
        patch["conditions"] = kept
