"""What a BrokerCluster may make the operator use: Secrets that opt in, endpoint hosts the installer allows.

A BrokerCluster's author is trusted with that cluster, not with the operator's reach: its RBAC reads
every Secret of the namespace and its pod can reach any address. Each check here turns a refusal
into a condition (``CredentialsAllowed``, ``EndpointsAllowed``), ``Ready=False`` and one Warning
event per message, and tells the reconcile to hold back what would use the refused thing (pods
that would mount a Secret; the daemon, for its part, sends nothing). The rules themselves are in
credentials.py and endpoint_hosts.py; this module is the reconcile's side of them.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import kopf

from broker_operator.controller import credentials, names
from broker_operator.controller.conditions import set_condition as _set_condition
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.endpoint_hosts import endpoint_refusals
from broker_operator.controller.observed import ClusterObservations
from broker_operator.controller.pod_fields import broker_image
from broker_operator.controller.pod_security import pod_security_refusals
from broker_operator.controller.readiness import CONDITION_READY
from broker_operator.controller.spec import ClusterSpec

if TYPE_CHECKING:  # reconcile imports this module
    from broker_operator.controller.reconcile import ClusterRef

CONDITION_CREDENTIALS = "CredentialsAllowed"
CONDITION_ENDPOINTS = "EndpointsAllowed"


def check_endpoints(
    context: ControllerContext,
    ref: ClusterRef,
    spec: ClusterSpec,
    status_patch: MutableMapping[str, Any],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> bool:
    """Whether an endpoint URL is outside the installer's allowlist (endpoint_hosts.py); sets
    ``EndpointsAllowed`` (endpoints mode with an allowlist only) and, on a refusal, ``Ready`` and
    an event. The daemon sends nothing to a cluster with a refused endpoint."""
    allowed = context.settings.endpoint_hosts
    if not spec.endpoints_mode or allowed is None:
        return False
    observations = context.observations_for(ref.namespace, ref.name)
    found = endpoint_refusals(((e.name, e.url) for e in spec.endpoints), allowed)
    if not found:
        observations.reported.pop("EndpointNotAllowed", None)
        _set_condition(
            ref, status_patch, CONDITION_ENDPOINTS, ok=True, reason="Allowed",
            message="every endpoint URL's host is in the operator's allowed endpoint hosts",
        )  # fmt: skip
        return False
    _refuse(
        ref, observations, status_patch, logger,
        condition=CONDITION_ENDPOINTS, reason="EndpointNotAllowed", event_reason="EndpointNotAllowed",
        message="; ".join(found), consequence="not heartbeating",
    )  # fmt: skip
    return True


async def check_credentials(
    context: ControllerContext,
    ref: ClusterRef,
    spec: ClusterSpec,
    status_patch: MutableMapping[str, Any],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> bool:
    """Whether a Secret the spec names may not be used (credentials.py); sets ``CredentialsAllowed``
    and, on a refusal, ``Ready`` and one Warning event per message.

    Read once per spec generation while all is well, but again whenever a broker pod is missing (it
    would mount them now) and on every pass while something is refused (a label added is seen).
    """
    observations = context.observations_for(ref.namespace, ref.name)
    key = f"Credentials/{ref.body['metadata'].get('generation')}"
    missing_pod = any(names.pod_name(ref.name, i) not in observations.pods for i in range(spec.replicas))
    cached = key in observations.ensured and not missing_pod
    uid = str(ref.body["metadata"].get("uid") or "")
    found = [] if cached else await credentials.refusals(context.api, ref.namespace, ref.name, uid, spec)
    if not found:
        observations.reported.pop("CredentialRefused", None)
        observations.ensured.add(key)
        # Set on every pass (written only if the status lacks it): a status patch lost once, to a
        # conflict, must not leave the condition out for the rest of the generation.
        _set_condition(
            ref, status_patch, CONDITION_CREDENTIALS, ok=True, reason="OptedIn",
            message="every Secret the spec names opts in as a credential",
        )  # fmt: skip
        return False
    observations.ensured.discard(key)
    _refuse(
        ref, observations, status_patch, logger,
        condition=CONDITION_CREDENTIALS, reason=found[0].reason, event_reason="CredentialRefused",
        message="; ".join(r.message for r in found), consequence="not using its Secrets",
    )  # fmt: skip
    return True


CONDITION_POD_SECURITY = "PodSecurityAllowed"


def check_pod_security(
    context: ControllerContext,
    ref: ClusterRef,
    spec: ClusterSpec,
    status_patch: MutableMapping[str, Any],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> bool:
    """Whether broker pods of this spec may not be made (pod_security.py); sets ``PodSecurityAllowed``
    (pods mode) and, on a refusal, ``Ready`` and an event."""
    if spec.endpoints_mode:
        return False
    observations = context.observations_for(ref.namespace, ref.name)
    found = pod_security_refusals(
        broker_image(spec, context.settings.pod_defaults),
        spec.pod_security_context,
        spec.container_security_context,
        level=context.settings.broker_pod_security,
        images=context.settings.broker_images,
        image_from="spec.image" if spec.image else "the operator's --broker-image",
    )
    if not found:
        observations.reported.pop("PodSecurityRefused", None)
        _set_condition(
            ref, status_patch, CONDITION_POD_SECURITY, ok=True, reason="Allowed",
            message="the broker pods' image and securityContexts are within the operator's settings",
        )  # fmt: skip
        return False
    _refuse(
        ref, observations, status_patch, logger,
        condition=CONDITION_POD_SECURITY, reason="NotRestricted", event_reason="PodSecurityRefused",
        message="; ".join(found), consequence="making no broker pod",
    )  # fmt: skip
    return True


def _refuse(
    ref: ClusterRef,
    observations: ClusterObservations,
    status_patch: MutableMapping[str, Any],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    *,
    condition: str,
    reason: str,
    event_reason: str,
    message: str,
    consequence: str,
) -> None:
    """A refusal, said the same way by every check: its condition False, ``Ready`` False, one
    Warning event per message, and a log line naming what the operator does not do."""
    _set_condition(ref, status_patch, condition, ok=False, reason=reason, message=message)
    _set_condition(ref, status_patch, CONDITION_READY, ok=False, reason=event_reason, message=message)
    if observations.first_report(event_reason, message):
        kopf.warn(ref.kopf_body, reason=event_reason, message=message)
    logger.warning("%s: %s", consequence, message)
