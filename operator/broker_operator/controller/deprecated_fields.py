"""Spec fields the CRD still accepts but nothing reads: one Warning event each, saying what to use.

``spec.messageLog.schedule`` was meant to set when the ordering validator checks the cluster. The
validator is one CronJob of the Helm chart over the whole message-log store, every BrokerCluster
at once, on the chart's ``validator.schedule``; no per-cluster schedule exists to set, and nothing
ever read the field. It is deprecated and ignored rather than removed: a field dropped from a
structural schema is pruned without a word, from a manifest as it is applied and from a stored
object when it is next written, so a user who set it would never learn that it does nothing.
Kept, it is accepted, described as ignored in ``kubectl explain``, and this event says so.

Until issue 42 the CRD defaulted it to ``*/15 * * * *``, so every BrokerCluster created before
carries that value without anyone having chosen it, and it is also the chart's default schedule:
that value draws no event. Any other draws one per operator process and value (the reconcile's
``first_report``), never a condition: the cluster runs as well with it as without.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import kopf

from broker_operator.controller.observed import ClusterObservations

if TYPE_CHECKING:  # reconcile calls this module; the reference back is for the type only
    from broker_operator.controller.reconcile import ClusterRef

DEPRECATED_FIELD: Final = "DeprecatedField"
# The CRD's default for spec.messageLog.schedule until issue 42, and the chart's validator.schedule.
FORMER_SCHEDULE_DEFAULT: Final = "*/15 * * * *"


def deprecated_field_notices(spec: Mapping[str, Any]) -> list[str]:
    """What to tell the user about the deprecated fields ``spec`` sets, one message each."""
    message_log = spec.get("messageLog")
    schedule = message_log.get("schedule") if isinstance(message_log, Mapping) else None
    if schedule is None or schedule == FORMER_SCHEDULE_DEFAULT:
        return []
    return [
        f"spec.messageLog.schedule ({schedule!r}) is deprecated and ignored: the ordering validator "
        "is one CronJob of the Helm chart for every BrokerCluster of the message-log store, run on "
        f"the chart's validator.schedule (helm upgrade ... --set validator.schedule='{schedule}'); "
        "remove the field from this BrokerCluster"
    ]


def warn_deprecated_fields(ref: ClusterRef, observations: ClusterObservations) -> None:
    """Post a Warning event for each deprecated field the spec sets, once per value."""
    for notice in deprecated_field_notices(ref.body.get("spec") or {}):
        if observations.first_report(DEPRECATED_FIELD, notice):
            kopf.warn(ref.kopf_body, reason=DEPRECATED_FIELD, message=notice)
