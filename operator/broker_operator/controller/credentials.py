"""Which Secrets a BrokerCluster may have the operator use as credentials, and the refusals.

A BrokerCluster names Secrets (``spec.auth.tokenSecretRef``, ``backendTokenSecretRef``,
``spec.backend.urlSecretRef``, ``spec.cloud.urlSecretRef``, the ``spec.tls`` ones); the operator
sends the token one as a bearer token to every broker URL, and mounts all of them into broker pods
that run ``spec.image``. Its RBAC reads any Secret of the namespace, so without a rule a BrokerCluster's
author, who may not read Secrets, could name one and have its value sent to an endpoint URL of
their own, or mounted into an image of their own (issue 39). The rule: a Secret is a credential
only if it opts in with the label ``broker.failover.dev/credential: "true"`` (whoever may label a
Secret may read it anyway), or it is one the operator generated for this very BrokerCluster
(its generated name *and* controlled by this BrokerCluster's uid: made by an earlier operator
version before the label existed). A Secret that does not exist is refused too while a pod would
mount it: a pod made now would mount whatever Secret of that name appears later. The operator's
own generated ones are exempt from that (it creates them before any pod).

This module reads Secrets only through ``KubeApi.read_secret`` and decides before any value is
decoded; a refusal names the Secret and the spec field, never anything inside the Secret. It
does not watch Secrets (see daemon.py) and does not label anything: opting in is the Secret
owner's decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker_operator.controller import names
from broker_operator.controller.kube import KubeApi, secret_value
from broker_operator.controller.spec import ClusterSpec, SecretRef

REASON_NOT_OPTED_IN: Final = "SecretNotOptedIn"
REASON_NOT_FOUND: Final = "SecretNotFound"
OPT_IN: Final = f"{names.LABEL_CREDENTIAL}={names.CREDENTIAL_OPT_IN}"


@dataclass(frozen=True)
class NamedSecret:
    """One Secret the spec makes the operator use, and the field that names it."""

    field: str  # e.g. spec.auth.tokenSecretRef; "generated" for the operator's own
    ref: SecretRef
    generated: bool = False


@dataclass(frozen=True)
class Refusal:
    reason: str  # REASON_NOT_OPTED_IN or REASON_NOT_FOUND
    message: str


def operator_token(cluster: str, spec: ClusterSpec) -> NamedSecret:
    """The Secret whose value the operator sends to every broker as its bearer token."""
    if spec.token_secret is not None:
        return NamedSecret("spec.auth.tokenSecretRef", spec.token_secret)
    return NamedSecret("generated", spec.token_ref(cluster), generated=True)


def backend_token(cluster: str, spec: ClusterSpec) -> NamedSecret:
    """The Secret whose value is the backend's token (the brokers get its verifier)."""
    if spec.backend_token_secret is not None:
        return NamedSecret("spec.auth.backendTokenSecretRef", spec.backend_token_secret)
    return NamedSecret("generated", spec.backend_token_ref(cluster), generated=True)


def named_secrets(cluster: str, spec: ClusterSpec) -> list[NamedSecret]:
    """Every Secret the operator sends, mounts or reads a token from for this spec. Endpoints mode
    mounts nothing, so only the operator's token counts there. A new Secret reference in the spec
    belongs here."""
    used = [operator_token(cluster, spec)]
    if spec.endpoints_mode:
        return used
    used.append(backend_token(cluster, spec))
    for field, connection in (("backend", spec.backend), ("cloud", spec.cloud)):
        if connection.url_secret is not None:
            used.append(NamedSecret(f"spec.{field}.urlSecretRef", connection.url_secret))
        if connection.credentials_secret is not None:  # mounted whole: no key
            ref = SecretRef(connection.credentials_secret, "")
            used.append(NamedSecret(f"spec.{field}.credentialsSecretRef", ref))
    return used + tls_secrets(spec)


def tls_secrets(spec: ClusterSpec) -> list[NamedSecret]:
    """The Secrets of ``spec.tls`` that broker pods mount (broker_tls.py): the user's in mode
    Secrets (a private key each) and the CA bundles (a CA is public, but the key named could hold
    anything, and would be mounted into an image the spec chooses). Checked whatever
    ``ControllerSettings.broker_tls`` says: a spec that names them means them. The operator's own
    ``<name>-tls`` (mode Operator) is not here: whoever writes it decides what to do with a Secret
    of that name it did not make."""
    tls = spec.tls
    used = []
    if tls.secrets is not None:
        used.append(NamedSecret("spec.tls.secrets.server", SecretRef(tls.secrets.server, "")))
        used.append(
            NamedSecret("spec.tls.secrets.operatorClient", SecretRef(tls.secrets.operator_client, ""))
        )
    if tls.backend_clients is not None:
        used.append(NamedSecret("spec.tls.backendClients.caSecretRef", tls.backend_clients.ca))
    if tls.upstream_ca is not None:
        used.append(NamedSecret("spec.tls.upstreamCASecretRef", tls.upstream_ca))
    return used


def refusal(
    named: NamedSecret, secret: Mapping[str, Any] | None, namespace: str, cluster_uid: str
) -> Refusal | None:
    """Why ``secret`` (None: absent) may not be used for ``named``; None if it may."""
    where = f"Secret {namespace}/{named.ref.name} ({named.field})"
    if secret is None:
        if named.generated:
            return None  # the operator creates it before anything uses it
        return Refusal(
            REASON_NOT_FOUND,
            f"{where} does not exist; create it with the label {OPT_IN} (no broker pod is made "
            "before it exists: a pod would mount any Secret of that name that appears later)",
        )
    meta = secret.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.LABEL_CREDENTIAL) == names.CREDENTIAL_OPT_IN:
        return None
    if named.generated and _controlled_by(meta, cluster_uid):
        return None
    return Refusal(
        REASON_NOT_OPTED_IN,
        f"{where} does not carry the label {OPT_IN}; the operator uses only Secrets that opt in as "
        f"credentials. If this Secret is meant for this BrokerCluster, label it: kubectl label secret "
        f"-n {namespace} {named.ref.name} {OPT_IN}",
    )


def _controlled_by(meta: Mapping[str, Any], uid: str) -> bool:
    return any(
        ref.get("kind") == names.KIND and ref.get("uid") == uid and ref.get("controller")
        for ref in meta.get("ownerReferences") or []
    )


async def refusals(
    api: KubeApi, namespace: str, cluster: str, cluster_uid: str, spec: ClusterSpec
) -> list[Refusal]:
    """Every named Secret the operator may not use now, in the order the spec names them."""
    found: list[Refusal] = []
    for named in named_secrets(cluster, spec):
        refused = refusal(named, await api.read_secret(namespace, named.ref.name), namespace, cluster_uid)
        if refused is not None:
            found.append(refused)
    return found


async def read_operator_token(
    api: KubeApi, namespace: str, cluster: str, cluster_uid: str, spec: ClusterSpec
) -> tuple[str | None, Refusal | None]:
    """The operator token's value if its Secret may be used (None if absent or keyless), else why not."""
    return await read_token(api, namespace, cluster_uid, operator_token(cluster, spec))


async def read_token(
    api: KubeApi, namespace: str, cluster_uid: str, named: NamedSecret
) -> tuple[str | None, Refusal | None]:
    """A token's value if its Secret may be used (None if absent or keyless), else why not."""
    secret = await api.read_secret(namespace, named.ref.name)
    if secret is None:
        return None, None
    refused = refusal(named, secret, namespace, cluster_uid)
    if refused is not None:
        return None, refused
    return secret_value(secret, named.ref.key), None
