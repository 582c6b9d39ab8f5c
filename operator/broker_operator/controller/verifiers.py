"""The brokers' credentials: the token Secrets the operator generates, and the verifier Secret it
derives from them, ``<cluster>-broker-verifiers``, the only one broker pods mount.

A broker must recognise the operator's token (Heartbeat, the admin operations) and the backend's
(SendMessages) without holding either: a broker holding the operator's token could, once taken
over, switch or empty its peers. So the tokens stay in their Secrets (the generated
``<cluster>-broker-token`` and ``<cluster>-backend-token``, or the user's
``spec.auth.tokenSecretRef`` and ``backendTokenSecretRef``), which only the operator and the
backend read, and the brokers mount their SHA-256 verifiers (``broker_contracts.token_verifier``).

The verifier Secret is derived, so the operator keeps it in line: ``sync_verifiers`` reads both
tokens and writes the Secret when its verifiers differ. The reconciler calls it before it creates
pods (a pod cannot start without it); the heartbeat daemon calls it on each of its periodic token
re-reads (``daemon.read_token``), which is how a rotated token reaches the brokers: the operator
learns the new token before any broker accepts it, and each broker accepts the token it replaced
for its grace window after its files change (``broker_service.credentials``).

A token shorter than :data:`MIN_TOKEN_BYTES` (32) is refused where it is read, here: no verifier is
written for it, the reconciler sets the ``TokensValid`` condition to False and creates no pod, and
the daemon keeps the token it has. The operator's own tokens are 32 random bytes. Nothing here ever
puts a token, or its length beyond "too short", into a message.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from broker_contracts.token_verifier import MIN_TOKEN_BYTES, token_verifier
from broker_operator.controller import credentials, names
from broker_operator.controller.builders import cluster_labels, owned_meta
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.spec import ClusterSpec, SecretRef

Manifest = dict[str, Any]


def _owned_secret(
    owner: Mapping[str, Any], name: str, data: Mapping[str, str], *, credential: bool = False
) -> Manifest:
    labels = cluster_labels(owner["metadata"]["name"])
    if credential:  # the opt-in (credentials.py): the operator's own tokens are usable as such
        labels = {**labels, names.LABEL_CREDENTIAL: names.CREDENTIAL_OPT_IN}
    metadata = owned_meta(owner, name, labels)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "stringData": dict(data),
    }


def build_token_secret(owner: Mapping[str, Any]) -> Manifest:
    """``<cluster>-broker-token`` with a fresh random token, for clusters without ``auth.tokenSecretRef``."""
    name = names.generated_token_secret_name(owner["metadata"]["name"])
    return _owned_secret(owner, name, {names.TOKEN_FILE_KEY: secrets.token_urlsafe(32)}, credential=True)


def build_backend_token_secret(owner: Mapping[str, Any]) -> Manifest:
    """``<cluster>-backend-token``, the backend's credential, for clusters without
    ``auth.backendTokenSecretRef``. Give its value to the backend: brokers refuse SendMessages
    without it, and it opens nothing else."""
    name = names.generated_backend_token_secret_name(owner["metadata"]["name"])
    return _owned_secret(owner, name, {names.TOKEN_FILE_KEY: secrets.token_urlsafe(32)}, credential=True)


def verifier_data(operator_token: str, backend_token: str) -> dict[str, str]:
    return {
        names.OPERATOR_VERIFIER_KEY: token_verifier(operator_token),
        names.BACKEND_VERIFIER_KEY: token_verifier(backend_token),
    }


def build_verifier_secret(owner: Mapping[str, Any], operator_token: str, backend_token: str) -> Manifest:
    """``<cluster>-broker-verifiers``: what the brokers mount (the two verifiers, no token)."""
    name = names.verifier_secret_name(owner["metadata"]["name"])
    return _owned_secret(owner, name, verifier_data(operator_token, backend_token))


def token_problem(namespace: str, ref: SecretRef, role: str, token: str | None) -> str | None:
    """Why ``token`` (read from ``ref``) cannot be used, or None. Never the token itself."""
    where = f"Secret {namespace}/{ref.name} key {ref.key!r} (the {role} token)"
    if not token or not token.strip():
        return f"{where} is missing or empty"
    length = len(token.strip().encode())
    if length < MIN_TOKEN_BYTES:
        return (
            f"{where} holds {length} bytes; a token needs at least {MIN_TOKEN_BYTES} random bytes "
            "(e.g. `openssl rand -base64 32`): brokers get no verifier for it and no broker pod is created"
        )
    return None


@dataclass(frozen=True)
class VerifierSync:
    """What ``sync_verifiers`` found: the operator's token if usable, and what is wrong, if anything."""

    operator_token: str | None
    problem: str | None
    written: bool = False


async def sync_verifiers(
    api: KubeApi, namespace: str, owner: Mapping[str, Any], spec: ClusterSpec
) -> VerifierSync:
    """Read both tokens, each only from a Secret that may be used as a credential (credentials.py);
    if both are usable, create or update ``<cluster>-broker-verifiers`` to their verifiers (one read
    of it, and a write only when it differs)."""
    cluster = owner["metadata"]["name"]
    uid = str(owner["metadata"].get("uid") or "")
    operator_ref, backend_ref = spec.token_ref(cluster), spec.backend_token_ref(cluster)
    operator_token, operator_refused = await credentials.read_token(
        api, namespace, uid, credentials.operator_token(cluster, spec)
    )
    backend_token, backend_refused = await credentials.read_token(
        api, namespace, uid, credentials.backend_token(cluster, spec)
    )
    operator_problem = (
        operator_refused.message
        if operator_refused is not None
        else token_problem(namespace, operator_ref, "operator's", operator_token)
    )
    backend_problem = (
        backend_refused.message
        if backend_refused is not None
        else token_problem(namespace, backend_ref, "backend's", backend_token)
    )
    problem = operator_problem or backend_problem
    if problem is not None or operator_token is None or backend_token is None:
        return VerifierSync(operator_token if operator_problem is None else None, problem)
    wanted = build_verifier_secret(owner, operator_token, backend_token)
    name = wanted["metadata"]["name"]
    current = await api.read_secret_data(namespace, name)
    if current == wanted["stringData"]:
        return VerifierSync(operator_token, None)
    try:
        if current is None and await api.create(wanted):
            return VerifierSync(operator_token, None, written=True)
        await api.patch_secret_data(namespace, name, wanted["stringData"])
    except ApiException as error:
        if error.status not in _WRITE_REFUSED:
            raise
        # Said, not raised: the brokers keep the verifiers they have, which still open their calls
        # for the tokens the operator held until now.
        return VerifierSync(
            operator_token,
            f"Secret {namespace}/{name} (the brokers' verifiers) could not be written: the API server "
            f"answered {error.status} {error.reason}; the operator's RBAC needs secrets create and patch",
        )
    return VerifierSync(operator_token, None, written=True)


_WRITE_REFUSED = {403, 422}  # forbidden (an RBAC from before verifiers), or refused as invalid
