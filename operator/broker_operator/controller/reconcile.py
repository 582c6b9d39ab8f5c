"""Bring one BrokerCluster's children in line with its spec: Secret, certificates (``certificates.py``),
Services, NetworkPolicy, PVCs, pods, rollout, and the journal claims' retention policy and size
(``claims.py``).

Called by the kopf handlers on create, update, resume and on a timer; every
step is idempotent (create-if-absent, one rollout step at a time), so running
it twice, or from two operator replicas, does no harm. The phase ``Conflict``
is decided here, before anything is created: a cluster that loses its pair to
an older one owns nothing and runs nothing. A paused cluster (the annotation
``broker.failover.dev/pause-reconciliation``, ``pause.py``) gets its conditions reported and no
child written.

A pass under a CRD older than the operator needs changes nothing (``crd_check.crd_refusal``,
called first).

What it does not do: heartbeat brokers or choose the active (the engine in
the heartbeat daemon does), or write the engine's status fields.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from broker_operator.controller import active_service_shape, builders, names, network_policy, verifiers
from broker_operator.controller.certificates import ensure_certificates
from broker_operator.controller.claims import maintain_journal_claims
from broker_operator.controller.conditions import set_condition as _set_condition
from broker_operator.controller.conflicts import PairClaim, conflicting_owner
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.crd_check import crd_refusal
from broker_operator.controller.deprecated_fields import warn_deprecated_fields
from broker_operator.controller.observed import ClusterObservations, pod_node, pod_ready, pod_views
from broker_operator.controller.pause import report_pause
from broker_operator.controller.permitted import check_credentials, check_endpoints, check_pod_security
from broker_operator.controller.placement import describe, zones_for_new_pod
from broker_operator.controller.readiness import CONDITION_READY, readiness
from broker_operator.controller.rollout import StepKind, next_rollout_step
from broker_operator.controller.spec import ClusterSpec, SpecError, parse_spec
from broker_operator.core.spec_fields import DRAIN_EVICT

PHASE_PENDING = "Pending"
PHASE_CONFLICT = "Conflict"
CONDITION_SPEC_VALID = "SpecValid"
CONDITION_TOKENS_VALID = "TokensValid"


@dataclass(frozen=True)
class ClusterRef:
    namespace: str
    name: str
    body: Mapping[str, Any]  # the BrokerCluster as kopf handed it; owner of every child
    status: Mapping[str, Any]

    @property
    def kopf_body(self) -> kopf.Body:
        """The body typed as kopf's event poster and owner-reference builder want it."""
        return cast(kopf.Body, self.body)


def pair_of(spec: Mapping[str, Any]) -> tuple[str, str]:
    return (str(spec.get("account") or ""), str(spec.get("company") or ""))


def conflict_owner(ref: ClusterRef, claims: Iterable[PairClaim]) -> str | None:
    """The older BrokerCluster that holds this one's pair, if any."""
    meta = ref.body["metadata"]
    return conflicting_owner(PairClaim(str(meta.get("creationTimestamp") or ""), ref.name), claims)


async def reconcile_cluster(
    *,
    context: ControllerContext,
    ref: ClusterRef,
    spec: Mapping[str, Any],
    claims: Iterable[PairClaim],
    status_patch: MutableMapping[str, Any],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> ClusterSpec | None:
    """One reconciliation pass; puts what changed into ``status_patch``; returns the spec if valid."""
    if await crd_refusal(context, ref, status_patch, logger):
        return None  # an old CRD prunes what the spec asks for: change nothing (crd_check.py)
    return await _reconcile_under_current_crd(
        context=context, ref=ref, spec=spec, claims=claims, status_patch=status_patch, logger=logger
    )


async def _reconcile_under_current_crd(
    *,
    context: ControllerContext,
    ref: ClusterRef,
    spec: Mapping[str, Any],
    claims: Iterable[PairClaim],
    status_patch: MutableMapping[str, Any],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> ClusterSpec | None:
    observations = context.observations_for(ref.namespace, ref.name)
    owner = conflict_owner(ref, claims)
    account, company = pair_of(spec)
    if owner is not None:
        message = (
            f"BrokerCluster {ref.namespace}/{owner} already serves account {account!r}, "
            f"company {company!r}; this one runs nothing until {owner} is deleted or changed"
        )
        if ref.status.get("phase") != PHASE_CONFLICT or ref.status.get("conflictsWith") != owner:
            status_patch.update(phase=PHASE_CONFLICT, conflictsWith=owner)
        if observations.first_report("Conflict", message):
            kopf.warn(ref.kopf_body, reason="Conflict", message=message)
        _set_condition(ref, status_patch, CONDITION_READY, ok=False, reason="Conflict", message=message)
        return None
    observations.reported.pop("Conflict", None)
    if ref.status.get("phase") == PHASE_CONFLICT:
        status_patch.update(phase=PHASE_PENDING, conflictsWith=None)
        kopf.info(
            ref.kopf_body,
            reason="ConflictResolved",
            message=f"account {account!r}, company {company!r} is no longer served by another BrokerCluster",
        )
    elif not ref.status.get("phase"):
        status_patch["phase"] = PHASE_PENDING

    try:
        parsed = parse_spec(ref.name, spec)
    except SpecError as error:
        _set_condition(
            ref, status_patch, CONDITION_SPEC_VALID, ok=False, reason="InvalidSpec", message=str(error)
        )
        if observations.first_report("InvalidSpec", str(error)):
            kopf.warn(ref.kopf_body, reason="InvalidSpec", message=str(error))
        _set_condition(ref, status_patch, CONDITION_READY, ok=False, reason="InvalidSpec", message=str(error))
        logger.warning("not running: %s", error)
        return None
    observations.reported.pop("InvalidSpec", None)
    _set_condition(ref, status_patch, CONDITION_SPEC_VALID, ok=True, reason="Valid", message="spec accepted")
    warn_deprecated_fields(ref, observations)
    generation = ref.body["metadata"].get("generation")
    if generation and ref.status.get("observedGeneration") != generation:
        status_patch["observedGeneration"] = generation

    refused = check_endpoints(context, ref, parsed, status_patch, logger)
    refused = check_pod_security(context, ref, parsed, status_patch, logger) or refused
    refused = await check_credentials(context, ref, parsed, status_patch, logger) or refused
    # Paused (controller/pause.py): what is observed is still reported, and no child is written.
    if not report_pause(ref, status_patch, observations, parsed, datetime.now(UTC)):
        refused = await write_children(context, ref, parsed, status_patch, logger, refused=refused)
    if not refused:
        report_readiness(ref, status_patch, observations.pods, observations.first_report)
    await _keep_a_newer_phase(context, ref, status_patch)
    return parsed


async def write_children(
    context: ControllerContext,
    ref: ClusterRef,
    parsed: ClusterSpec,
    status_patch: MutableMapping[str, Any],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    *,
    refused: bool,
) -> bool:
    """Certificates, the children, the NetworkPolicy, the budget, one rollout step, the claims'
    retention; no pod while a credential or a security check is ``refused``, or once the
    certificates refuse too (returned: whether they did)."""
    # Before any child: a broker pod in mode Operator mounts <name>-tls, which must exist first.
    refused = await ensure_certificates(context, ref, parsed, status_patch, logger) or refused
    token_problem = await ensure_children(context, ref, parsed, make_pods=not refused)
    shown = any(c.get("type") == CONDITION_TOKENS_VALID for c in ref.status.get("conditions") or [])
    if token_problem is not None or shown:
        # Shown when a token is wrong, and kept (True) once it was fixed; absent while all is well.
        reason = "Valid" if token_problem is None else "InvalidToken"
        message = token_problem or "both tokens are usable; the brokers hold their verifiers"
        _set_condition(
            ref,
            status_patch,
            CONDITION_TOKENS_VALID,
            ok=token_problem is None,
            reason=reason,
            message=message,
        )
    await ensure_network_policy(context, ref, parsed, logger)
    if not parsed.endpoints_mode:
        await ensure_disruption_budget(context, ref, parsed, status_patch)
        if not refused:
            await roll_out(context, ref, parsed, logger)
        await maintain_journal_claims(context, ref, parsed, status_patch, logger)
    return refused


async def _keep_a_newer_phase(
    context: ControllerContext, ref: ClusterRef, status_patch: MutableMapping[str, Any]
) -> None:
    """No ``Pending`` from a pass that began with no phase if the engine has written one since."""
    if not ref.status.get("phase") and not await _still_without_phase(context, ref):
        status_patch.pop("phase", None)


async def _still_without_phase(context: ControllerContext, ref: ClusterRef) -> bool:
    """Whether the BrokerCluster as stored (not as this pass was handed it) still has no phase, asked
    at the end of a pass that would write ``Pending``. A pass that started before the engine's first
    status write (the create handler and the timer can both be in their first pass, each a second or
    more with key generation, certificates.py) must not write ``Pending`` over the engine's
    ``Healthy``: the engine writes only on a change, so the stale phase would stay. One read, only
    while the phase is absent."""
    try:
        stored = await context.api.read_cluster(ref.namespace, ref.name)
    except ApiException:
        return True
    return not (stored.get("status") or {}).get("phase")


def report_readiness(
    ref: ClusterRef,
    status_patch: MutableMapping[str, Any],
    pods: Mapping[str, Any],
    first_report: Callable[[str, str], bool],
) -> None:
    """The Ready condition, and a Warning event the first time a given problem is seen."""
    ready = readiness(ref.status, pods)
    _set_condition(
        ref, status_patch, CONDITION_READY, ok=ready.ready, reason=ready.reason, message=ready.message
    )
    if not ready.ready and ready.reason != "WaitingForBrokers" and first_report(ready.reason, ready.message):
        kopf.warn(ref.kopf_body, reason=ready.reason, message=ready.message)


async def ensure_children(
    context: ControllerContext, ref: ClusterRef, spec: ClusterSpec, *, make_pods: bool = True
) -> str | None:
    """Create whatever child is missing; existing children are left as they are (pods roll, see below).

    Services, claims and the Secret are created once per spec generation and then remembered, so
    that a thousand clusters do not cost five API calls each per reconcile; pods are checked on
    every pass against the pod watch. A Service or claim deleted by hand is forgotten by its
    watch (``handlers``) and so created again here; before a pod is created, its claim and the
    token Secrets are created if absent whatever is remembered, as the pod cannot start without.
    The brokers' verifier Secret is written from the tokens (``verifiers.sync_verifiers``) once
    per generation and before any pod is created; a token that cannot be used (missing, or
    shorter than 32 bytes) stops pod creation, and is returned for the ``TokensValid`` condition.
    """
    observations = context.observations_for(ref.namespace, ref.name)
    generation = ref.body["metadata"].get("generation")
    if observations.ensured_generation != generation:
        observations.ensured.clear()
        observations.ensured_generation = generation
    owner = ref.kopf_body
    wanted = token_secrets(owner, spec)
    if not spec.endpoints_mode:
        wanted.append(builders.build_headless_service(owner))
        wanted += [builders.build_journal_claim(owner, ordinal, spec) for ordinal in range(spec.replicas)]
    for manifest in wanted:
        key = f"{manifest['kind']}/{manifest['metadata']['name']}"
        if key in observations.ensured:
            continue
        if await context.api.create(manifest):
            kopf.info(owner, reason="Created", message=f"created {key}")
        observations.ensured.add(key)
    if not spec.endpoints_mode:
        await active_service_shape.ensure_active_service(context, ref, spec.active_service)

    if not make_pods:
        return None  # a named Secret may not be mounted (check_credentials says which)
    missing = [o for o in range(spec.replicas) if names.pod_name(ref.name, o) not in observations.pods]
    problem = await ensure_verifiers(context, ref, spec, again=bool(missing))
    if problem is not None:
        return problem
    active = ref.status.get("active")
    for ordinal in missing:
        name = names.pod_name(ref.name, ordinal)
        needed = [builders.build_journal_claim(owner, ordinal, spec)]
        for manifest in needed:
            if await context.api.create(manifest):
                kopf.info(
                    owner,
                    reason="Created",
                    message=f"created {manifest['kind']}/{manifest['metadata']['name']}",
                )
        # Decided now, for this pod's life (placement.py): a node that joins later moves nothing.
        zones = zones_for_new_pod(
            context.node_zones, observations.claims.get(names.journal_claim_name(ref.name, ordinal))
        )
        pod = builders.build_pod(
            owner,
            ordinal,
            spec,
            active=name == active,
            serve_tls=context.settings.broker_tls,
            defaults=context.settings.pod_defaults,
            zones=zones,
            log=context.settings.log,
        )
        if await context.api.create(pod):
            kopf.info(
                owner, reason="Created", message=f"created Pod/{name} (priority {ordinal}, {describe(zones)})"
            )
    return None


async def ensure_verifiers(
    context: ControllerContext, ref: ClusterRef, spec: ClusterSpec, *, again: bool
) -> str | None:
    """Write ``<cluster>-broker-verifiers`` from the tokens, once per generation or ``again`` (a pod
    is about to be created: its token Secrets are created first if absent); what is wrong, if
    anything. Rotations reach it through the heartbeat daemon's periodic token re-read."""
    observations = context.observations_for(ref.namespace, ref.name)
    key = f"Secret/{names.verifier_secret_name(ref.name)}"
    if key in observations.ensured and not again:
        return None
    owner = ref.kopf_body
    if again:
        for manifest in token_secrets(owner, spec):
            if await context.api.create(manifest):
                kopf.info(owner, reason="Created", message=f"created Secret/{manifest['metadata']['name']}")
    synced = await verifiers.sync_verifiers(context.api, ref.namespace, owner, spec)
    if synced.written:
        kopf.info(
            owner, reason="VerifiersWritten", message=f"wrote {key}: the verifiers of the current tokens"
        )
    if synced.problem is None:
        observations.ensured.add(key)
    else:
        observations.ensured.discard(key)
        if observations.first_report(CONDITION_TOKENS_VALID, synced.problem):
            kopf.warn(owner, reason="InvalidToken", message=synced.problem)
    return synced.problem


CONDITION_DRAIN = "DrainAllowed"


@dataclass(frozen=True)
class DrainView:
    """The active broker against the nodes being drained: what the budget and the status say."""

    active: str | None
    node: str | None  # the active's node, when it is being drained
    standby_elsewhere: bool  # a Ready standby on a node that is not being drained
    evict_anyway: bool  # spec.drainWithoutStandby: Evict

    @property
    def evictable(self) -> bool:
        """Whether the PodDisruptionBudget lets the active be evicted now."""
        return self.node is not None and not self.standby_elsewhere and self.evict_anyway

    def condition(self) -> tuple[bool, str, str]:
        """The ``DrainAllowed`` condition: (status, reason, message)."""
        if self.node is None:
            return True, "NotDraining", "the active broker's node is not being drained"
        if self.standby_elsewhere:
            return (
                True,
                "SwitchingOver",
                (
                    f"{self.active}'s node {self.node} is being drained: the active moves to a standby on"
                    " another node (NodeDrain), then the drain evicts it"
                ),
            )
        if self.evict_anyway:
            return (
                True,
                "EvictWithoutStandby",
                (
                    f"{self.active}'s node {self.node} is being drained and no standby on another node is"
                    " ready: spec.drainWithoutStandby is Evict, so the active is evicted and nobody is active"
                    " until a broker is ready again"
                ),
            )
        return (
            False,
            "NoStandbyElsewhere",
            (
                f"{self.active}'s node {self.node} is being drained and no standby on another node is ready:"
                " the PodDisruptionBudget holds the eviction back until one is (spec.drainWithoutStandby:"
                " Wait; Evict lets it through)"
            ),
        )


def drain_view(spec: ClusterSpec, active: str | None, observations: ClusterObservations) -> DrainView:
    draining, pods = observations.draining_nodes, observations.pods
    node = pod_node(pods[active]) if active in pods else None
    standby = any(
        name != active and pod_ready(pod) and pod_node(pod) not in draining for name, pod in pods.items()
    )
    return DrainView(
        active, node if node in draining else None, standby, spec.drain_without_standby == DRAIN_EVICT
    )


async def ensure_disruption_budget(
    context: ControllerContext, ref: ClusterRef, spec: ClusterSpec, status_patch: MutableMapping[str, Any]
) -> None:
    """``<cluster>-active``, created once per generation and its ``minAvailable`` set when
    :attr:`DrainView.evictable` changes (the first pass after a start sets it once); and the
    ``DrainAllowed`` condition."""
    observations = context.observations_for(ref.namespace, ref.name)
    view = drain_view(spec, ref.status.get("active"), observations)
    ok, reason, message = view.condition()
    _set_condition(ref, status_patch, CONDITION_DRAIN, ok=ok, reason=reason, message=message)
    evictable = view.evictable
    name = names.disruption_budget_name(ref.name)
    key = f"PodDisruptionBudget/{name}"
    if key not in observations.ensured:
        manifest = builders.build_active_disruption_budget(ref.kopf_body, evictable=evictable)
        if await context.api.create(manifest):
            kopf.info(ref.kopf_body, reason="Created", message=f"created {key}")
            observations.budget_evictable = evictable
        observations.ensured.add(key)
    if observations.budget_evictable != evictable:
        await context.api.set_min_available(ref.namespace, name, 0 if evictable else 1)
        observations.budget_evictable = evictable
        if evictable:
            kopf.warn(ref.kopf_body, reason="DrainEvictsActive", message=message)


# The API server's answers that a NetworkPolicy cannot be made as asked: forbidden (a chart from
# before the operator made policies), invalid (a peer the API server refuses). Reported, not raised:
# the brokers run without the policy rather than not at all.
_POLICY_REFUSED = {400, 403, 422}


async def ensure_network_policy(
    context: ControllerContext,
    ref: ClusterRef,
    spec: ClusterSpec,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> None:
    """Create, update or delete ``<cluster>-brokers-ingress`` after ``spec.networkPolicy``, once per
    spec generation (like the Services; a policy deleted by hand comes back with the next spec
    change or operator restart).

    A cluster without the policy gets one DELETE per generation (404 as a rule): that is what turns
    the policy off when ``enabled`` is set back to false, even across an operator restart, without
    a watch on NetworkPolicies.
    """
    observations = context.observations_for(ref.namespace, ref.name)
    key = f"NetworkPolicy/{names.network_policy_name(ref.name)}"
    if key in observations.ensured:
        return
    try:
        problem = await _apply_network_policy(context, ref, spec, key)
    except ApiException as error:
        if error.status not in _POLICY_REFUSED:
            raise
        if spec.network_policy is None:
            # Nothing asked for: an RBAC without networkpolicies (an older chart) is not worth a warning.
            logger.debug("cannot delete %s: %s %s", key, error.status, error.reason)
            observations.ensured.add(key)  # not again every pass: once per generation
            problem = None
        else:
            problem = f"{key} could not be applied: the API server answered {error.status} {error.reason}"
            problem += f": {error.body}" if error.body else ""
            observations.ensured.discard(key)  # tried again on the next pass
    if problem is not None:
        if observations.first_report("NetworkPolicyNotCreated", problem):
            kopf.warn(ref.kopf_body, reason="NetworkPolicyNotCreated", message=problem)
        logger.warning("%s", problem)


async def _apply_network_policy(
    context: ControllerContext, ref: ClusterRef, spec: ClusterSpec, key: str
) -> str | None:
    """One attempt at the wanted state; returns what stopped it (None: done, and remembered)."""
    observations = context.observations_for(ref.namespace, ref.name)
    owner = ref.kopf_body
    operator_namespace = context.settings.pod_namespace
    if spec.network_policy is None or spec.endpoints_mode:
        if await context.api.delete_network_policy(ref.namespace, names.network_policy_name(ref.name)):
            kopf.info(owner, reason="Deleted", message=f"deleted {key}: spec.networkPolicy is not enabled")
        observations.ensured.add(key)
        return None
    observations.ensured.add(key)  # a missing namespace is reported once per generation
    if operator_namespace is None:
        return (
            f"spec.networkPolicy.enabled is true but {key} was not created: the operator does not know "
            "its own namespace, so the policy could not admit its heartbeats; set OPERATOR_POD_NAMESPACE "
            "and OPERATOR_POD_LABELS (the Helm chart does) or --pod-namespace/--pod-labels"
        )
    operator = network_policy.OperatorPods(operator_namespace, context.settings.pod_labels)
    manifest = network_policy.build_network_policy(owner, spec, operator)
    if await context.api.create(manifest):
        kopf.info(owner, reason="Created", message=f"created {key}")
    else:
        await context.api.update_network_policy(manifest)
    return None


def token_secrets(owner: Mapping[str, Any], spec: ClusterSpec) -> list[dict[str, Any]]:
    """The credentials the operator generates: its own token and the backend's, unless the user names them."""
    generated = []
    if spec.token_secret is None:
        generated.append(verifiers.build_token_secret(owner))
    if spec.backend_token_secret is None:
        generated.append(verifiers.build_backend_token_secret(owner))
    return generated


async def roll_out(
    context: ControllerContext,
    ref: ClusterRef,
    spec: ClusterSpec,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> None:
    """Take at most one rollout step: replace a standby, or ask for a switchover off the active."""
    observations = context.observations_for(ref.namespace, ref.name)
    active = ref.status.get("active")
    desired = builders.template_hash(
        ref.name, spec, serve_tls=context.settings.broker_tls, defaults=context.settings.pod_defaults
    )
    step = next_rollout_step(spec.replicas, desired, pod_views(observations.pods), active)
    owner = ref.kopf_body
    if step is None:
        if observations.switchover_target is not None and observations.switchover_target == active:
            observations.switchover_target = (
                None  # the planned move is done; the spec's preference rules again
            )
            if observations.retarget is not None:
                observations.retarget()
        return
    if step.kind is StepKind.DELETE_POD:
        logger.info("rollout: deleting %s: %s", step.pod, step.reason)
        kopf.info(owner, reason="RollingUpdate", message=f"replacing Pod/{step.pod}: {step.reason}")
        await context.api.delete_pod(ref.namespace, step.pod)
    elif observations.switchover_target != step.pod:
        logger.info("rollout: switchover to %s: %s", step.pod, step.reason)
        kopf.info(
            owner, reason="SwitchoverRequested", message=f"planned switchover to {step.pod}: {step.reason}"
        )
        observations.switchover_target = step.pod
        if observations.retarget is not None:
            observations.retarget()
