"""What becomes of the journal claims: the spec's ``persistentVolumeClaimRetentionPolicy``.

Every broker pod has a journal claim, ``journal-<cluster>-<ordinal>``, with its journal (accepted
messages not yet confirmed, durable holds) and its stored epoch. Two moments end a claim's use: a
scale-down (its ordinal is at or above ``replicas``) and the deletion of the BrokerCluster. For
each the policy says Retain (the default: the claim stays until a person deletes it, so no data is
ever lost without being asked for) or Delete. Built after the StatefulSet controller's policy of
the same name:

- ``whenDeleted``: with Delete every claim carries an owner reference to the BrokerCluster, with
  Retain none; the garbage collector deletes owned claims once the BrokerCluster is gone (and the
  API server's ``pvc-protection`` keeps a claim until no pod uses it). Existing claims are brought
  in line on every reconcile, so a changed policy holds for them too, and a BrokerCluster re-created
  over retained claims adopts them (or leaves them unowned) as its policy says.
- ``whenScaled``: with Delete the operator deletes a surplus claim itself, and only once its pod is
  gone (asked of the API server, not only the watch, which may lag) and the broker is not the
  recorded active. StatefulSet makes the condemned pod the claim's owner instead; here the operator
  deletes surplus pods itself already (``rollout.py``, after a switchover off a surplus active), and
  a direct delete can also check the active. The delete is conditional on the claim's uid, so a
  claim created again by a scale-up in between is never the one deleted.

The decisions are pure functions of what the watches saw; ``apply_claim_retention`` carries them
out. ``maintain_journal_claims``, the reconcile's one call here, also grows the claims to
``spec.storage.size`` (``claim_growth.py``). This module does not create claims
(``reconcile.ensure_children`` does), delete pods, or touch the message-log claim
(``spec.messageLog.claimName`` is the user's).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kopf

from broker_operator.controller import builders, names
from broker_operator.controller.bodies import ClaimBody, OwnerReference, PodBody
from broker_operator.controller.claim_growth import grow_journal_claims
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.spec import ClusterSpec

if TYPE_CHECKING:  # reconcile calls this module; the reference back is for the type only
    from broker_operator.controller.reconcile import ClusterRef

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


@dataclass(frozen=True)
class SurplusClaim:
    """A journal claim of an ordinal the spec no longer runs, whose broker is gone."""

    name: str
    uid: str | None  # the delete's precondition; an API server always sets it (kmock does not)
    pod: str


def claim_ordinal(cluster: str, claim: str) -> int | None:
    """The ordinal of ``journal-<cluster>-<ordinal>``; None for any other name."""
    prefix = names.journal_claim_name(cluster, 0)[:-1]
    rest = claim.removeprefix(prefix)
    return int(rest) if rest != claim and rest.isdigit() else None


def _ours(reference: OwnerReference, cluster: str) -> bool:
    """A reference to this cluster's name, in whatever incarnation (uid) it was made."""
    return (
        reference.get("apiVersion", "").split("/")[0] == names.GROUP
        and reference.get("kind") == names.KIND
        and reference.get("name") == cluster
    )


def wanted_owner_references(
    cluster: str, current: Sequence[OwnerReference], policy: Sequence[OwnerReference]
) -> list[OwnerReference] | None:
    """The claim's owner references under the policy (others' kept), or None when they already are."""
    wanted = [ref for ref in current if not _ours(ref, cluster)] + list(policy)
    return None if wanted == list(current) else wanted


def surplus_claims(
    cluster: str,
    replicas: int,
    claims: Mapping[str, ClaimBody],
    pods: Mapping[str, PodBody],
    active: str | None,
) -> list[SurplusClaim]:
    """Claims of ordinals at or above ``replicas`` whose pod the watch no longer has and that are
    not the recorded active: the candidates ``whenScaled: Delete`` deletes (after asking the API)."""
    found = []
    for name, claim in sorted(claims.items()):
        ordinal = claim_ordinal(cluster, name)
        meta = claim.get("metadata", {})
        if ordinal is None or ordinal < replicas or meta.get("deletionTimestamp"):
            continue
        pod = names.pod_name(cluster, ordinal)
        if pod in pods or pod == active:
            continue  # its broker may still run, or may still hold the only copy of an active journal
        found.append(SurplusClaim(name, meta.get("uid"), pod))
    return found


async def maintain_journal_claims(
    context: ControllerContext,
    ref: ClusterRef,
    spec: ClusterSpec,
    status_patch: MutableMapping[str, Any],
    logger: Logger,
) -> None:
    """The journal claims' upkeep on each pass: the retention policy, then their size."""
    await apply_claim_retention(context, ref, spec, logger)
    await grow_journal_claims(context, ref, spec, status_patch, logger)


async def apply_claim_retention(
    context: ControllerContext, ref: ClusterRef, spec: ClusterSpec, logger: Logger
) -> None:
    """Bring the observed journal claims in line with the spec's retention policy: owner references
    for ``whenDeleted``, deletion of surplus claims for ``whenScaled``."""
    observations = context.observations_for(ref.namespace, ref.name)
    policy = builders.claim_owner_references(ref.body, spec)
    for name, claim in sorted(observations.claims.items()):
        meta = claim.get("metadata", {})
        if claim_ordinal(ref.name, name) is None or meta.get("deletionTimestamp"):
            continue
        wanted = wanted_owner_references(ref.name, meta.get("ownerReferences") or [], policy)
        if wanted is not None and await context.api.set_claim_owners(
            ref.namespace, name, wanted, meta.get("resourceVersion")
        ):
            logger.info(
                "PersistentVolumeClaim/%s is %s by the BrokerCluster (whenDeleted: %s)",
                name,
                "owned" if policy else "no longer owned",
                spec.claim_retention.when_deleted,
            )

    if not spec.claim_retention.delete_when_scaled:
        return
    active = ref.status.get("active")
    for surplus in surplus_claims(ref.name, spec.replicas, observations.claims, observations.pods, active):
        if await context.api.pod_exists(ref.namespace, surplus.pod):
            continue  # the watch has not caught up with a pod that is still there
        await context.api.delete_claim(ref.namespace, surplus.name, surplus.uid)
        kopf.info(
            ref.kopf_body,
            reason="ClaimDeleted",
            message=(
                f"deleted PersistentVolumeClaim/{surplus.name} of {surplus.pod}, removed by the "
                f"scale-down to {spec.replicas} (persistentVolumeClaimRetentionPolicy.whenScaled: Delete)"
            ),
        )
