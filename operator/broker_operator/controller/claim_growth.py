"""Growing the journal claims to ``spec.storage.size``: the reconcile's side of ``claim_sizes.py``.

Each reconcile pass of a cluster that runs pods:

1. ``status.storage`` from what the claim watch saw: the size asked for, and each claim's request
   and capacity (written only when it changed, so a steady cluster writes nothing);
2. for each claim the plan would raise, whether its StorageClass has ``allowVolumeExpansion: true``
   (a claim without a class cannot grow through its claim);
3. a merge patch of ``spec.resources.requests.storage`` on each claim that may grow, conditional on
   the ``resourceVersion`` the watch saw; the resizer, the CSI driver and the kubelet do the rest;
4. the ``StorageResized`` condition, a Warning event per distinct problem, a Normal event per claim
   asked to grow and one when every claim holds the new size.

No retry storm: each StorageClass is read at most once per ``RECHECK_SECONDS`` for every cluster
that uses it (``ControllerContext.storage_classes``), and a resize the API server refused is not
asked again before then (or before the size changes). While a problem stands a pass makes no call
and, the condition's message being the same, no write. The condition appears the first time a
claim does not hold ``spec.storage.size`` and then stays (True once they all do), like
``TokensValid``: a cluster that was never resized shows none.

What this does not do: create claims (``reconcile.ensure_children``), touch the message-log claim
(``spec.messageLog.claimName`` is the user's, and so is its size), or restart a pod. A driver that
grows file systems only offline leaves ``FileSystemResizePending`` on the claim until its pod next
mounts it (a rollout, a failover, or a standby's pod deleted by a person), and the condition says so.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes.client.exceptions import ApiException

from broker_operator.controller import names
from broker_operator.controller.claim_sizes import (
    CONDITION_STORAGE,
    RESIZING,
    ClassVerdict,
    GrowthOutcome,
    GrowthPlan,
    ResizeRefusal,
    claim_sizes,
    plan_growth,
    storage_condition,
    storage_status,
)
from broker_operator.controller.conditions import set_condition
from broker_operator.controller.context import ControllerContext, StorageClassCheck
from broker_operator.controller.spec import ClusterSpec

if TYPE_CHECKING:  # reconcile calls this module; the reference back is for the type only
    from broker_operator.controller.reconcile import ClusterRef

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]

# How long a StorageClass's answer, or the API server's refusal of a resize, stands before it is
# asked again: a person who sets allowVolumeExpansion sees the claims grow within this, and a class
# that refuses costs one read per this per operator, whatever the number of clusters.
RECHECK_SECONDS = 300.0
# A refusal the API server will repeat until a person changes something (RBAC, admission, a value
# it rejects): reported and remembered, not raised into kopf's retries.
_REFUSALS = {400, 403, 422}
STORAGE_STATUS = "status.storage"  # the key of the last status.storage written, in first_report


async def grow_journal_claims(
    context: ControllerContext,
    ref: ClusterRef,
    spec: ClusterSpec,
    status_patch: MutableMapping[str, Any],
    logger: Logger,
) -> None:
    """Bring the journal claims of the ordinals the spec runs up to ``spec.storage.size``, and report."""
    observations = context.observations_for(ref.namespace, ref.name)
    wanted_claims = [names.journal_claim_name(ref.name, ordinal) for ordinal in range(spec.replicas)]
    sizes = claim_sizes(wanted_claims, observations.claims)
    report = storage_status(spec.storage_size, sizes)
    # Once per content as well as on a change: a CRD from before status.storage (Helm does not
    # upgrade crds/) prunes it from every write, and comparing with the stored status alone would
    # then write it again on every pass.
    written = json.dumps(report, sort_keys=True)
    if ref.status.get("storage") != report and observations.first_report(STORAGE_STATUS, written):
        status_patch["storage"] = report
    plan = plan_growth(spec.storage_size, sizes)
    previous = next(
        (c for c in ref.status.get("conditions") or [] if c.get("type") == CONDITION_STORAGE), None
    )
    if plan.settled and previous is None:
        return  # never resized: no condition
    outcome = await _grow(context, ref, plan, logger)
    condition = storage_condition(plan, outcome)
    set_condition(
        ref,
        status_patch,
        CONDITION_STORAGE,
        ok=condition.ok,
        reason=condition.reason,
        message=condition.message,
    )
    if not observations.first_report(CONDITION_STORAGE, condition.message):
        return
    if not condition.ok and condition.reason != RESIZING:
        kopf.warn(ref.kopf_body, reason=condition.reason, message=condition.message)
        logger.warning("%s", condition.message)
    elif condition.ok and previous is not None and previous.get("status") != "True":
        kopf.info(ref.kopf_body, reason=condition.reason, message=condition.message)


async def _grow(
    context: ControllerContext, ref: ClusterRef, plan: GrowthPlan, logger: Logger
) -> GrowthOutcome:
    """Ask for the wanted size on every claim of ``plan.grow`` whose class allows it; what stood in
    the way of the others."""
    observations = context.observations_for(ref.namespace, ref.name)
    blocked: dict[str, ClassVerdict] = {}
    refused: dict[str, str] = {}
    for size in plan.grow:
        verdict = await class_verdict(context, size.storage_class)
        if not verdict.expandable:
            blocked[size.name] = verdict
            continue
        earlier = observations.resize_refusals.get(size.name)
        if earlier is not None and earlier.size == plan.wanted and earlier.due > time.monotonic():
            refused[size.name] = earlier.why
            continue
        try:
            asked = await context.api.resize_claim(
                ref.namespace, size.name, plan.wanted, size.resource_version
            )
        except ApiException as error:
            if error.status not in _REFUSALS:
                raise
            why = _api_answer(error)
            observations.resize_refusals[size.name] = ResizeRefusal(
                plan.wanted, why, time.monotonic() + RECHECK_SECONDS
            )
            refused[size.name] = why
            continue
        observations.resize_refusals.pop(size.name, None)
        # Once per claim and size: the watch may bring the raised request a pass late.
        if asked and observations.first_report(f"ClaimResize/{size.name}", plan.wanted):
            message = (
                f"asked for {plan.wanted} on PersistentVolumeClaim/{size.name} (it asked for "
                f"{size.requested}): spec.storage.size grew"
            )
            kopf.info(ref.kopf_body, reason="ClaimResizeRequested", message=message)
            logger.info("%s", message)
    return GrowthOutcome(blocked, refused)


async def class_verdict(context: ControllerContext, name: str | None) -> ClassVerdict:
    """Whether claims of StorageClass ``name`` may grow: the class's ``allowVolumeExpansion``, read
    at most once per ``RECHECK_SECONDS`` for every cluster of this operator."""
    if name is None:
        return ClassVerdict(
            False,
            "the claim has no storage class (its volume was bound by hand), and only a class's "
            "provisioner can grow a volume through its claim",
        )
    check = context.storage_classes.get(name)
    if check is not None and check.due > time.monotonic():
        return check.verdict
    verdict = await _read_verdict(context, name)
    context.storage_classes[name] = StorageClassCheck(verdict, time.monotonic() + RECHECK_SECONDS)
    return verdict


async def _read_verdict(context: ControllerContext, name: str) -> ClassVerdict:
    recheck = f"checked again within {RECHECK_SECONDS / 60:g} minutes"
    try:
        body = await context.api.read_storage_class(name)
    except ApiException as error:
        rbac = " (the operator needs get on storageclasses.storage.k8s.io: upgrade the chart)"
        return ClassVerdict(
            False,
            f"could not read StorageClass {name}: {_api_answer(error)}"
            f"{rbac if error.status == 403 else ''}; {recheck}",
            unreadable=True,
        )
    if body is None:
        return ClassVerdict(False, f"StorageClass {name} does not exist; {recheck}")
    if body.get("allowVolumeExpansion") is not True:
        return ClassVerdict(
            False,
            f"StorageClass {name} does not allow volume expansion (allowVolumeExpansion is not true: "
            f"set it if its provisioner can grow volumes, {recheck}; or set spec.storage.size back)",
        )
    return ClassVerdict(True)


def _api_answer(error: ApiException) -> str:
    """The API server's answer in words: its code and reason, and the Status message when it sent one."""
    answer = f"{error.status} {error.reason}"
    try:
        message = json.loads(error.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{answer}: {message}" if message else answer
