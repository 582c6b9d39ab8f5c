"""The certificates of a BrokerCluster, on each reconcile pass: issue and renew, or read, and report.

``ensure_certificates`` is what ``reconcile_cluster`` calls, before any child is made (a broker pod
in mode Operator cannot start without ``<name>-tls``). By ``spec.tls.mode``:

- ``Operator``: keeps ``<name>-ca``, ``<name>-tls`` and ``<name>-operator-client`` (shapes,
  ownership and the upgrade from the layout with the client pair in ``<name>-ca``: ``tls_secrets.py``;
  decisions: ``operator_certificates.py``). Key generation runs in a worker thread. Writes are
  conditional: a create that finds the Secret there (409: another replica made it) reads again and
  uses what is there, in the same pass; an update carries the ``resourceVersion`` read, and one that
  meets a newer version is left to the next pass. Each certificate issued or renewed is a Normal
  event, ``CertificateIssued`` or ``CertificateRenewed``, with the renewal's reasons.
- ``Secrets``: reads the user's two Secrets, never writes them, and checks them
  (``certificate_report.check_user_pair``). A Secret that does not opt in as a credential is not
  read (``credentials.refusal``, the same rule ``permitted.check_credentials`` reports).
- ``Disabled``: nothing; ``status.tls`` is ``{mode: Disabled}`` and condition ``CertificatesValid``
  is removed, as it would describe certificates nothing uses.

With TLS on, the CA bundles the spec names (``backendClients.caSecretRef``, ``upstreamCASecretRef``)
are reported too. The outcome is ``status.tls`` (``mode``, ``certificates`` and ``served``;
``caReplacement`` is left to its writer) and ``CertificatesValid``, each put into the status patch
only when it changed, and one Warning event per distinct problem.

``status.tls.served[]`` (which serving certificate each broker presented in the operator's latest
handshake) and the heartbeats' TLS problems are not learnt here: the heartbeat daemon publishes its
client's view into the cluster's observations (``ClusterObservations.served_serials`` and
``tls_problems``, while the engine runs), and each pass adds ``served`` to the patch when it changed
and posts one Warning event ``HeartbeatTLSFailed`` per broker and distinct problem (a Normal
``HeartbeatTLSRecovered`` when it answers over TLS again). An idle pass writes nothing.

Cost: the Secrets are read once per spec generation, whenever a broker pod is about to be made, at
the time something falls due (``operator_certificates.next_check``), and every
``certificates_recheck_seconds`` otherwise; the passes in between read and write nothing.

``client_material`` (``client_tls.py``, re-exported here) is the heartbeat client's side: the
operator's client certificate and the CA bundle the brokers' certificates chain to, read from the
same Secrets.

Replacing the CA's key (mode Operator; the rules ``pki.replacement``, the state and the annotations
``ca_replacement.py``): each pass that reads the Secrets hands ``plan_and_issue`` what the
heartbeats saw (the bundle each broker trusts, the serial each serves, the client certificate the
heartbeats present: ``ClusterObservations``), which moves the replacement at most one phase, and
writes the state with the CA. Each transition is a Normal event ``CAReplacement<Phase>`` once its
writes landed, and ``status.tls.caReplacement`` says what the phase waits for. While a replacement
is under way, or an annotation asks for one or confirms one not yet seen, every pass reads the
Secrets again (the cache is for idle passes): each phase waits on the brokers and on a person.

What it does not do: mount anything (``broker_tls.py``) or decide a phase (``pki.replacement``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import MutableMapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import kopf
from kubernetes.client.exceptions import ApiException

from broker_operator.controller import ca_replacement as replacing
from broker_operator.controller import credentials, names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.controller.certificate_report import (
    BACKEND_CLIENTS_CA,
    CONDITION_CERTIFICATES,
    CREDENTIAL_REFUSED,
    EXPIRING_SOON,
    OPERATOR_CLIENT,
    SERVER,
    UPSTREAM_CA,
    WRITE_FAILED,
    CertificateReport,
    Entry,
    Problem,
    check_bundle,
    check_user_pair,
    served_status,
)
from broker_operator.controller.client_tls import ClientMaterialRead, client_material, read_client_material
from broker_operator.controller.conditions import remove_condition, set_condition
from broker_operator.controller.context import CertificateCheck, ControllerContext
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.observed import ClusterObservations, expected_brokers
from broker_operator.controller.operator_certificates import (
    OperatorSecrets,
    Outcome,
    next_check,
    plan_and_issue,
)
from broker_operator.controller.spec import ClusterSpec
from broker_operator.controller.tls_spec import WARN_BEFORE_DAYS
from broker_operator.core import spec_fields as fields
from broker_operator.pki import (
    ReplacementPhase,
    Verb,
    server_dns_names,
)

if TYPE_CHECKING:  # reconcile imports this module
    from broker_operator.controller.reconcile import ClusterRef

__all__ = [
    "ClientMaterialRead",
    "client_material",
    "ensure_certificates",
    "read_client_material",
    "wanted_dns_names",
]

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]
_WRITE_REFUSED: Final = {400, 403, 422}  # RBAC, the writes guard, or a body the API server refuses
_FIELDS: Final = {  # credentials.tls_secrets' fields -> status.tls.certificates[].name
    "spec.tls.secrets.server": SERVER,
    "spec.tls.secrets.operatorClient": OPERATOR_CLIENT,
    "spec.tls.backendClients.caSecretRef": BACKEND_CLIENTS_CA,
    "spec.tls.upstreamCASecretRef": UPSTREAM_CA,
}


def wanted_dns_names(cluster: str, namespace: str, spec: ClusterSpec) -> tuple[str, ...]:
    """The names of the brokers' certificate: every pod's and Service's (``pki.server_dns_names``),
    then ``extraDNSNames``. In endpoints mode (no pods) the Services' only: a user who runs brokers
    outside the cluster on the operator's certificate adds their names as ``extraDNSNames``."""
    found = server_dns_names(cluster, namespace, range(spec.replicas), cluster_domain=spec.tls.cluster_domain)
    return found + tuple(n for n in spec.tls.extra_dns_names if n not in found)


async def ensure_certificates(
    context: ControllerContext,
    ref: ClusterRef,
    spec: ClusterSpec,
    status_patch: MutableMapping[str, Any],
    logger: Logger,
    *,
    now: datetime | None = None,
) -> bool:
    """One pass over the cluster's certificates (see the module's docstring). True when broker pods
    must not be made now: in mode Operator, with the pods mounting TLS, ``<name>-tls`` exists and is
    not the operator's, and a pod would mount whatever it holds."""
    key = (ref.namespace, ref.name)
    observations = context.observations_for(*key)
    generation = ref.body["metadata"].get("generation")
    missing_pod = any(names.pod_name(ref.name, o) not in observations.pods for o in range(spec.replicas))
    # A second pass that waited here finds the first one's check: reads, and makes keys, only if
    # that one is not good for it.
    waited_from = time.monotonic()
    async with context.certificate_locks.setdefault(key, asyncio.Lock()):
        now = now or datetime.now(UTC)
        check = context.certificate_checks.get(key)
        request = replacing.request_of(ref.body)
        fresh = (
            check is not None
            and check.generation == generation
            and check.request == request  # an annotation changed: read now (ca_replacement)
            and time.monotonic() < check.due
            and (not missing_pod or check.read_from >= waited_from)
        )
        if check is None or not fresh:
            read_from = time.monotonic()
            check = await _check(context, ref, spec, now, logger)
            check.generation, check.read_from, check.request = generation, read_from, request
            context.certificate_checks[key] = check
    _report(ref, observations, status_patch, check.report, now, replacement=check.replacement)
    return check.holds_pods and context.settings.broker_tls


async def _check(
    context: ControllerContext, ref: ClusterRef, spec: ClusterSpec, now: datetime, logger: Logger
) -> CertificateCheck:
    tls = spec.tls
    recheck = timedelta(seconds=context.settings.certificates_recheck_seconds)
    policy = tls.certificates.renewal_policy() if tls.operator_issues else None
    warn_within = timedelta(days=policy.warn_before_days if policy is not None else WARN_BEFORE_DAYS)
    if tls.mode == fields.TLS_MODE_DISABLED:
        report = CertificateReport(tls.mode)
        check = CertificateCheck(None, time.monotonic() + recheck.total_seconds(), report, False)
        check.replacement = _UNCHANGED
        return check
    entries: list[Entry] = []
    problems: list[Problem] = []
    holds_pods, again, replacement = False, False, _UNCHANGED
    if tls.operator_issues:
        outcome, again = await _operator_pass(context, ref, spec, now, logger)
        entries += outcome.entries
        problems += outcome.problems
        holds_pods = outcome.foreign_tls
        if outcome.replacement is not None:  # the replacement was read (a pass that wrote it, or idle)
            replacement = outcome.replacement_status
        # A replacement under way waits on the brokers and on a person: look on every pass.
        again = again or _replacing(outcome)
    bundle_entries, bundle_problems = await _read_user_secrets(context.api, ref, spec, now)
    entries += bundle_entries
    problems += bundle_problems
    report = CertificateReport(
        tls.mode, tuple(entries), tuple(problems), warn_within=warn_within, renews=tls.operator_issues
    )
    ahead = next_check(report.entries, policy=policy, warn_within=warn_within, now=now)
    wait = min(recheck, ahead) if ahead is not None else recheck
    if again:  # an update met a newer version: read again on the next pass
        wait = timedelta(0)
    check = CertificateCheck(None, time.monotonic() + wait.total_seconds(), report, holds_pods)
    check.replacement = replacement
    return check


def _replacing(outcome: Outcome) -> bool:
    """A replacement is under way, or asked for and not yet started (the pass could not write)."""
    step = outcome.replacement
    return step is not None and (step.state.phase is not ReplacementPhase.DONE or step.transition is not None)


def _seen(context: ControllerContext, ref: ClusterRef, spec: ClusterSpec) -> replacing.Seen:
    """What the heartbeats saw of ``ref``'s brokers (nothing while no engine runs)."""
    observations = context.observations_for(ref.namespace, ref.name)
    return replacing.Seen(
        brokers=frozenset(expected_brokers(ref.name, spec)),
        loaded_bundles=observations.loaded_bundles() if observations.loaded_bundles is not None else {},
        served_serials=observations.served_serials() if observations.served_serials is not None else {},
        presented_certificate=(
            observations.presented_certificate() if observations.presented_certificate is not None else None
        ),
    )


async def _operator_pass(
    context: ControllerContext, ref: ClusterRef, spec: ClusterSpec, now: datetime, logger: Logger
) -> tuple[Outcome, bool]:
    """Read, issue what is due, write; (what was found, whether to look again on the next pass)."""
    api, namespace, cluster = context.api, ref.namespace, ref.name
    ca_name, tls_name = names.ca_secret_name(cluster), names.tls_secret_name(cluster)
    client_name = names.operator_client_secret_name(cluster)
    dns_names = wanted_dns_names(cluster, namespace, spec)
    policy = spec.tls.certificates.renewal_policy()
    outcome, secrets = Outcome(), OperatorSecrets(None, None)
    for _attempt in range(2):  # a create that meets another replica's Secret reads it and goes on
        secrets = OperatorSecrets(
            await api.read_secret(namespace, ca_name),
            await api.read_secret(namespace, tls_name),
            await api.read_secret(namespace, client_name),
        )
        seen = _seen(context, ref, spec)
        outcome = await asyncio.to_thread(
            plan_and_issue, secrets, owner=ref.body, dns_names=dns_names, policy=policy, now=now, seen=seen
        )
        # The CA first: leaves are checked against it. The operator's client Secret last: its
        # ca.crt must not name a CA that <name>-ca does not hold yet.
        writes = [
            (ca_name, secrets.ca, outcome.ca_data, outcome.ca_removed, shapes.build_ca_secret),
            (tls_name, secrets.tls, outcome.tls_data, (), shapes.build_tls_secret),
            (client_name, secrets.client, outcome.client_data, (), shapes.build_operator_client_secret),
        ]
        raced = False
        try:
            for name, held, data, removed, build in writes:
                if data is None:
                    continue
                if held is None:
                    if not await api.create(build(ref.body, data)):
                        raced = True
                        break
                else:
                    version = str((held.get("metadata") or {}).get("resourceVersion") or "")
                    if not await api.patch_secret(
                        namespace, name, shapes.update_patch(ref.body, version, data, removed)
                    ):
                        logger.info(
                            "Secret %s/%s changed while it was renewed: again on the next pass",
                            namespace,
                            name,
                        )
                        return Outcome(secrets.entries(cluster)), True
        except ApiException as error:
            if error.status not in _WRITE_REFUSED:
                raise
            message = (
                f"Secret {namespace}/{name} could not be written: the API server answered "
                f"{error.status} {error.reason}; the operator's RBAC needs secrets get, create and patch "
                "(and, cluster-wide, the chart's writes guard must admit it)"
            )
            stored = secrets.entries(cluster)  # what is stored, not what was not written
            return Outcome(stored, (*outcome.problems, Problem(WRITE_FAILED, message))), False
        if raced:
            continue
        _post_replacement(ref, outcome)
        _post_renewals(ref, outcome)
        if outcome.ca_removed:
            logger.info(
                "Secret %s/%s: the operator's client certificate lives in %s now; its old keys %s are "
                "removed from the CA's Secret",
                namespace, ca_name, client_name, ", ".join(outcome.ca_removed),
            )  # fmt: skip
        # A pass that moved the pair (or must still drop the old keys) looks again on the next one.
        return outcome, secrets.client_in_ca and outcome.client_data is not None
    return Outcome(secrets.entries(cluster)), True


_UNCHANGED: Final = object()
HEARTBEAT_TLS_FAILED: Final = "HeartbeatTLSFailed"
HEARTBEAT_TLS_RECOVERED: Final = "HeartbeatTLSRecovered"


def _served(ref: ClusterRef, observations: ClusterObservations, mode: str) -> Any:
    """``status.tls.served[]`` as it should be now (None: removed), or ``_UNCHANGED``: the engine is
    not running, or has handshaken with no broker yet since it started (an operator restart must
    not empty it for a moment, which would be two writes for nothing)."""
    if mode == fields.TLS_MODE_DISABLED:
        return None
    seen = observations.served_serials() if observations.served_serials is not None else {}
    if not seen:
        return _UNCHANGED
    brokers = [str(b["name"]) for b in ref.status.get("brokers") or [] if b.get("name")]
    current = (ref.status.get("tls") or {}).get("served") or []
    return served_status(seen, current, brokers or None) or None


def _report_heartbeat_tls(ref: ClusterRef, observations: ClusterObservations) -> None:
    """A Warning event per broker and distinct TLS problem of the heartbeats, and a Normal one when
    that broker answers over TLS again. The text is the heartbeat client's, already redacted: a
    server name and OpenSSL's reason, never a key, a certificate or a token."""
    if observations.tls_problems is None:
        return  # no engine: nothing is known either way
    problems = observations.tls_problems()
    prefix = f"{HEARTBEAT_TLS_FAILED}/"
    for broker, problem in sorted(problems.items()):
        message = (
            f"heartbeats to {broker} fail TLS: {problem}. Not counted toward a failover (a certificate "
            "error is no proof of death); fix the certificates (condition CertificatesValid)"
        )
        if observations.first_report(prefix + broker, message):
            kopf.warn(ref.kopf_body, reason=HEARTBEAT_TLS_FAILED, message=message)
    for key in [k for k in observations.reported if k.startswith(prefix)]:
        broker = key.removeprefix(prefix)
        if broker not in problems:
            observations.reported.pop(key)
            kopf.info(
                ref.kopf_body,
                reason=HEARTBEAT_TLS_RECOVERED,
                message=f"heartbeats to {broker} work over TLS again",
            )


def _post_replacement(ref: ClusterRef, outcome: Outcome) -> None:
    """A Normal event for the phase this pass moved the CA key replacement into (its writes landed)."""
    step = outcome.replacement
    if step is not None and step.transition is not None:
        reason = replacing.event_reason(step.state.phase)
        kopf.info(ref.kopf_body, reason=reason, message=step.transition)


def _post_renewals(ref: ClusterRef, outcome: Outcome) -> None:
    secrets = {entry.name: entry for entry in outcome.entries}
    for renewal in outcome.renewals:
        entry = secrets.get({"ca": "ca", "server": SERVER, "client": OPERATOR_CLIENT}[renewal.target.value])
        where = ""
        if entry is not None and entry.info is not None:
            end = entry.info.not_after.isoformat()
            where = f": Secret {entry.secret}, serial {entry.info.serial}, notAfter {end}"
        reason = "CertificateIssued" if renewal.verb is Verb.ISSUE else "CertificateRenewed"
        kopf.info(ref.kopf_body, reason=reason, message=f"{renewal}{where}")


async def _read_user_secrets(
    api: KubeApi, ref: ClusterRef, spec: ClusterSpec, now: datetime
) -> tuple[list[Entry], list[Problem]]:
    """The Secrets of ``spec.tls`` the user names (credentials.tls_secrets), read only if they opt in."""
    uid = str(ref.body["metadata"].get("uid") or "")
    dns_names = wanted_dns_names(ref.name, ref.namespace, spec)
    entries: list[Entry] = []
    problems: list[Problem] = []
    for named in credentials.tls_secrets(spec):
        name = _FIELDS[named.field]
        secret = await api.read_secret(ref.namespace, named.ref.name)
        label = f"{named.ref.name}:{named.ref.key}" if named.ref.key else named.ref.name
        if secret is not None and credentials.refusal(named, secret, ref.namespace, uid) is not None:
            entries.append(Entry(name, label))
            problems.append(
                Problem(
                    CREDENTIAL_REFUSED,
                    f"Secret {ref.namespace}/{named.ref.name} ({named.field}) is not read: it does not opt "
                    "in as a credential (condition CredentialsAllowed says what to do)",
                )
            )
        elif name in (SERVER, OPERATOR_CLIENT):
            found = check_user_pair(
                name, secret, namespace=ref.namespace, secret_name=named.ref.name, field=named.field,
                dns_names=dns_names if name == SERVER else None, now=now,
            )  # fmt: skip
            if name == SERVER and found.ca is not None:
                entries.insert(0, found.ca)  # what SAP trusts: the brokers' CA
            entries.append(found.entry)
            problems += found.problems
        else:
            entry, problem = check_bundle(
                name, secret, namespace=ref.namespace, secret_name=named.ref.name, key=named.ref.key,
                field=named.field,
            )  # fmt: skip
            entries.append(entry)
            problems += [problem] if problem is not None else []
    return entries, problems


def _report(
    ref: ClusterRef,
    observations: ClusterObservations,
    status_patch: MutableMapping[str, Any],
    report: CertificateReport,
    now: datetime,
    *,
    replacement: Any = _UNCHANGED,
) -> None:
    """``status.tls`` and ``CertificatesValid`` into the patch when they changed; one event per problem.
    ``replacement``: ``status.tls.caReplacement`` as the last look left it (``_UNCHANGED``: not
    known, as in modes other than Operator or when the Secrets could not be read)."""
    wanted = report.status_tls()
    current = ref.status.get("tls") or {}
    tls_patch: dict[str, Any] = {}
    if (
        current.get("mode") != wanted["mode"]
        or (current.get("certificates") or None) != wanted["certificates"]
    ):
        tls_patch.update(wanted)
    served = _served(ref, observations, report.mode)
    if served is not _UNCHANGED and (current.get("served") or None) != served:
        tls_patch["served"] = served
    if replacement is not _UNCHANGED and (current.get("caReplacement") or None) != replacement:
        tls_patch["caReplacement"] = replacement
    if tls_patch:
        status_patch["tls"] = tls_patch
    _report_heartbeat_tls(ref, observations)
    condition = report.condition(now)
    if condition is None:
        remove_condition(ref, status_patch, CONDITION_CERTIFICATES)
        observations.reported.pop(CONDITION_CERTIFICATES, None)
        return
    set_condition(
        ref, status_patch, CONDITION_CERTIFICATES, ok=condition.status, reason=condition.reason,
        message=condition.message,
    )  # fmt: skip
    if condition.status is False or condition.reason == EXPIRING_SOON:
        if observations.first_report(CONDITION_CERTIFICATES, condition.message):
            kopf.warn(ref.kopf_body, reason=f"Certificate{condition.reason}", message=condition.message)
    else:
        observations.reported.pop(CONDITION_CERTIFICATES, None)
