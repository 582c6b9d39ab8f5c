"""What the controller does for a paused BrokerCluster: report, and change nothing.

The annotation ``broker.failover.dev/pause-reconciliation: "true"`` pauses one cluster
(``core/pause.py`` has the engine's side: heartbeats and the active's renewals go on, no term
begins or ends). Here, on each reconcile pass while it is set:

- nothing is written to a child: no pod, claim, Service, Secret, certificate, NetworkPolicy or
  PodDisruptionBudget is created, patched or deleted, no rollout step is taken and no claim is
  deleted by the retention policy (``reconcile.reconcile_cluster`` returns before them). A pod
  deleted while paused is not made again until the pause ends;
- what is observed is still reported: the spec's conditions, ``Ready``, and the condition
  ``ReconciliationPaused`` (True, reason ``Paused``, ``PausedActiveUnavailable`` or
  ``PausedNoActive``; its ``lastTransitionTime`` is when the pause began and stays so while the
  message changes), turned False (``Resumed``) once the pause ends;
- events ``ReconciliationPaused`` and ``ReconciliationResumed`` (Normal) at each transition, and
  a Warning ``CertificateRenewalPaused`` for each certificate whose renewal falls due during the
  pause (mode ``Operator``: ``renewBeforeDays`` before its end, the CA's a year before; otherwise
  the warning window), read from ``status.tls`` as the last pass before the pause recorded it: the
  Secrets are not read, since nothing would be done with them.

The heartbeat daemon keeps the spec its engine runs with while paused (``daemon.py``): a spec edited
during a pause takes effect when it ends, children and engine alike.

What it does not do: decide anything about the brokers (the engine's), or stop the daemon's token
re-read (the heartbeats need the token; a rotated one still reaches the brokers' verifier Secret,
which is what keeps them authenticated).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import kopf

from broker_operator.controller.certificate_report import CA, OPERATOR_CLIENT, SERVER
from broker_operator.controller.endpoint_hosts import EndpointHosts, endpoint_refusals
from broker_operator.controller.observed import ClusterObservations
from broker_operator.controller.spec import ClusterSpec, SpecError, parse_spec
from broker_operator.controller.tls_spec import WARN_BEFORE_DAYS
from broker_operator.core.model import HeartbeatSettings, SettingsError
from broker_operator.core.pause import PAUSE_ANNOTATION, pause_annotation_problem, pause_requested

if TYPE_CHECKING:
    from broker_operator.controller.reconcile import ClusterRef

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]
CONDITION_PAUSED: Final = "ReconciliationPaused"
HELD: Final = (
    "no failover, switchover, failback, rollout, or change to pods, Services, Secrets and certificates"
    " until the annotation is removed or set to false"
)


def cluster_paused(body: Mapping[str, Any]) -> bool:
    """Whether this BrokerCluster body asks for a pause (``core.pause.pause_requested``)."""
    return pause_requested((body.get("metadata") or {}).get("annotations"))


@dataclass
class EngineSpec:
    """The spec a running engine takes (its targets' source and its settings) and its pause.

    While paused the engine keeps the spec it had: a spec edited during a pause (heartbeat
    settings, endpoints, ``preferredActive``, ``replicas``) takes effect when the pause ends, for
    the engine as for the children, rather than half of it now (new settings with pods that
    still carry the old ones, a scale-down's pod dropped from the targets while not deleted)."""

    spec: ClusterSpec
    settings: HeartbeatSettings
    paused: bool

    def follow(
        self,
        body: Mapping[str, Any],
        raw_spec: Mapping[str, Any],
        hosts: EndpointHosts | None,
        logger: Logger,
    ) -> None:
        """Take the BrokerCluster as it is now: its pause, and its spec unless paused; an invalid spec,
        or one naming a host the installer did not allow, leaves the spec as it was."""
        if cluster_paused(body) != self.paused:
            self.paused = not self.paused
            logger.info(
                "reconciliation %s (annotation %s)",
                "paused: heartbeats and the active's renewals go on; no failover, switchover or failback"
                if self.paused
                else "resumed: every decision is taken again",
                PAUSE_ANNOTATION,
            )
        if self.paused:
            return
        name = str(body["metadata"]["name"])
        try:
            fresh, settings = parse_spec(name, raw_spec), HeartbeatSettings.from_spec(raw_spec)
        except (SpecError, SettingsError) as error:
            logger.warning("keeping the previous heartbeat settings: %s", error)
            return
        outside = endpoint_refusals(((e.name, e.url) for e in fresh.endpoints), hosts)
        if outside:
            # Never heartbeat a URL the installer did not allow; reconcile reports it.
            logger.warning("keeping the previous heartbeat targets: %s", "; ".join(outside))
            return
        self.spec, self.settings = fresh, settings


def now_text(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_pause(
    ref: ClusterRef,
    status_patch: MutableMapping[str, Any],
    observations: ClusterObservations,
    spec: ClusterSpec,
    now: datetime,
) -> bool:
    """The ``ReconciliationPaused`` condition, its events and the certificate warnings; whether the
    cluster is paused (the caller then writes no child)."""
    annotations = ref.body["metadata"].get("annotations")
    problem = pause_annotation_problem(annotations)
    if problem is not None and observations.first_report("InvalidPauseAnnotation", problem):
        kopf.warn(ref.kopf_body, reason="InvalidPauseAnnotation", message=problem)
    paused = pause_requested(annotations)
    current = _current(ref, status_patch)
    was_paused = current is not None and current.get("status") == "True"
    if paused:
        since = str(current.get("lastTransitionTime")) if current and was_paused else now_text(now)
        due = certificates_due(ref.status, spec, now)
        reason, message = pause_condition(ref.status, since, due)
        _set(ref, status_patch, ok=True, reason=reason, message=message, since=since)
        if not was_paused and observations.first_report(CONDITION_PAUSED, f"paused since {since}"):
            text = f"reconciliation paused (annotation {PAUSE_ANNOTATION}): heartbeats go on; {HELD}"
            kopf.info(ref.kopf_body, reason="ReconciliationPaused", message=text)
        for name, secret, end in due:
            warning = (
                f"certificate {name} (Secret {secret}) is due for renewal and ends at {end}; it is not"
                " renewed while reconciliation is paused: resume before then, or TLS to the brokers fails"
                " and the active fences itself"
            )
            if observations.first_report(f"CertificateRenewalPaused/{name}", warning):
                kopf.warn(ref.kopf_body, reason="CertificateRenewalPaused", message=warning)
    elif was_paused:
        since = str(current.get("lastTransitionTime")) if current else "?"
        message = f"reconciliation resumed at {now_text(now)}; it was paused since {since}"
        _set(ref, status_patch, ok=False, reason="Resumed", message=message, since=now_text(now))
        if observations.first_report(CONDITION_PAUSED, f"resumed after {since}"):
            kopf.info(ref.kopf_body, reason="ReconciliationResumed", message=message)
    return paused


def pause_condition(
    status: Mapping[str, Any], since: str, due: list[tuple[str, str, str]]
) -> tuple[str, str]:
    """(reason, message) of ``ReconciliationPaused`` while paused, from the engine's recorded status:
    whether the active still answers, which a pause will not fail over."""
    active = status.get("active")
    broker = next((b for b in status.get("brokers") or [] if b.get("name") == active), None)
    head = f"reconciliation paused since {since} (annotation {PAUSE_ANNOTATION}=true)"
    if not active:
        reason = "PausedNoActive"
        text = f"{head}: no broker is active, and none is activated while paused; {HELD}"
    elif broker is not None and broker.get("state") != "Active":
        code = broker.get("unavailabilityCode") or broker.get("state")
        reason = "PausedActiveUnavailable"
        text = (
            f"{head}: the active broker {active} is {broker.get('state')} ({code}) and is NOT failed over"
            f" while paused, so the cluster may serve no traffic; remove the annotation to fail over; {HELD}"
        )
    else:
        reason, epoch = "Paused", status.get("activeEpoch") or status.get("epoch")
        text = f"{head}: heartbeats go on and {active} keeps its lease at epoch {epoch}; {HELD}"
    if due:
        text += "; due for renewal and not renewed while paused: " + ", ".join(
            f"{name} (ends {end})" for name, _secret, end in due
        )
    return reason, text


def certificates_due(
    status: Mapping[str, Any], spec: ClusterSpec, now: datetime
) -> list[tuple[str, str, str]]:
    """(name, Secret, notAfter) of each certificate in ``status.tls`` whose renewal (mode Operator)
    or warning window has begun: what the pause keeps from being renewed."""
    tls = spec.tls
    if not tls.enabled:
        return []
    policy = tls.certificates.renewal_policy() if tls.operator_issues else None
    due = []
    for entry in (status.get("tls") or {}).get("certificates") or []:
        end = _parse(entry.get("notAfter"))
        if end is None:
            continue
        days = WARN_BEFORE_DAYS
        if policy is not None and entry.get("name") in (SERVER, OPERATOR_CLIENT):
            days = policy.renew_before_days
        elif policy is not None and entry.get("name") == CA:
            days = policy.ca_renew_before_days
        if end - timedelta(days=days) <= now:
            due.append((str(entry.get("name")), str(entry.get("secret")), str(entry.get("notAfter"))))
    return due


def _parse(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _current(ref: ClusterRef, status_patch: Mapping[str, Any]) -> Mapping[str, Any] | None:
    conditions = status_patch.get("conditions", ref.status.get("conditions")) or []
    return next((c for c in conditions if c.get("type") == CONDITION_PAUSED), None)


def _set(
    ref: ClusterRef,
    status_patch: MutableMapping[str, Any],
    *,
    ok: bool,
    reason: str,
    message: str,
    since: str,
) -> None:
    """Set the condition, writing only on a change; ``lastTransitionTime`` is ``since`` (when its
    status last changed), not the time of this write: ``conditions.set_condition`` would move it
    with every new message, and a person asks since when the cluster has been paused."""
    conditions = [dict(c) for c in status_patch.get("conditions", ref.status.get("conditions")) or []]
    current = next((c for c in conditions if c.get("type") == CONDITION_PAUSED), None)
    wanted = {
        "type": CONDITION_PAUSED,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if current is not None and all(current.get(k) == v for k, v in wanted.items()):
        return
    generation = ref.body["metadata"].get("generation")
    if generation:
        wanted["observedGeneration"] = generation
    status_patch["conditions"] = [c for c in conditions if c.get("type") != CONDITION_PAUSED] + [wanted]
