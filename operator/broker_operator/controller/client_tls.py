"""The operator's client TLS material for one BrokerCluster, read from its Secrets: what the heartbeat
client presents to the brokers and trusts them by (and what ``kubectl broker`` presents, with the
same rules: :func:`operator_secret_material` and :func:`user_secrets_material` take Secrets already
read, so that the plugin's synchronous client shares them).

- mode Operator: ``tls.crt``, ``tls.key`` and ``ca.crt`` of ``<name>-operator-client`` (the
  operator's client certificate, issued by ``certificates.py``, and the CA the brokers' serving
  certificate chains to). Only a Secret recorded as the operator's is read (the ownership label,
  and a controller reference to the BrokerCluster ``<name>`` of the uid the label names): a Secret
  of that name someone else made must not choose whom the operator trusts. Upgrades: while no such
  Secret is there yet (an operator of the previous layout wrote the cluster's Secrets, and the
  certificates controller has not moved the pair yet), ``client.crt`` and ``client.key`` of an
  operator-owned ``<name>-ca`` and its ``ca.crt`` are read instead, so that the heartbeats never
  wait for that move; never once ``<name>-operator-client`` is the operator's.
- mode Secrets: ``tls.crt`` and ``tls.key`` of ``spec.tls.secrets.operatorClient``, and ``ca.crt``
  of ``spec.tls.secrets.server`` (what the brokers' certificate chains to), each from a Secret that
  opts in as a credential (``credentials.refusal``).

Every value is read bounded (``tls_secrets.secret_pem``), the bundle must hold CA certificates only,
and the key must be the certificate's; otherwise there is no material, and ``reason`` says why (never
anything of a key). ``tls.crt`` may carry intermediates after the leaf; they are passed on as read.

What it does not do: build an ``ssl.SSLContext`` (``tls_client.py``, the heartbeat side), cache, or
issue anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding

from broker_operator.controller import credentials, names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.secret_refs import SecretRef
from broker_operator.controller.tls_spec import TlsSpec
from broker_operator.core import spec_fields as fields
from broker_operator.pki import (
    CertificateError,
    KeyPair,
    bundle_certificates,
    load_certificates,
    load_key_pair,
)
from broker_operator.tls_material import ClientTlsMaterial

__all__ = [
    "ClientMaterialRead",
    "client_material",
    "operator_secret_material",
    "read_client_material",
    "user_secrets_material",
]


@dataclass(frozen=True)
class ClientMaterialRead:
    """``read_client_material``'s answer: the material, or why there is none (for a log line)."""

    material: ClientTlsMaterial | None
    reason: str | None = None


async def client_material(
    api: KubeApi, namespace: str, cluster: str, tls: TlsSpec
) -> ClientTlsMaterial | None:
    """What the operator presents and trusts when it calls ``cluster``'s brokers; None when it is not
    there yet or cannot be used (``read_client_material`` says why)."""
    return (await read_client_material(api, namespace, cluster, tls)).material


async def read_client_material(
    api: KubeApi, namespace: str, cluster: str, tls: TlsSpec
) -> ClientMaterialRead:
    """The material for ``tls.mode`` (see the module's docstring), or why there is none."""
    if tls.mode == fields.TLS_MODE_DISABLED:
        return ClientMaterialRead(None, "spec.tls.mode is Disabled")
    if tls.operator_issues:
        return await _operator_material(api, namespace, cluster)
    if tls.secrets is None:  # tls_spec: mode Secrets always has them
        return ClientMaterialRead(None, "spec.tls.secrets is not set")
    return await _user_material(api, namespace, tls.secrets.operator_client, tls.secrets.server)


async def _operator_material(api: KubeApi, namespace: str, cluster: str) -> ClientMaterialRead:
    name = names.operator_client_secret_name(cluster)
    secret = await api.read_secret(namespace, name)
    if secret is not None and operator_owned(secret, cluster):
        return operator_secret_material(secret, namespace, cluster)
    # The previous layout (module docstring): the pair in <name>-ca, until the controller moves it.
    ca_name = names.ca_secret_name(cluster)
    ca = await api.read_secret(namespace, ca_name)
    if ca is not None and operator_owned(ca, cluster) and shapes.legacy_client_keys(ca):
        pair = _Pair(ca, shapes.LEGACY_CLIENT_CERT_KEY, shapes.LEGACY_CLIENT_KEY_KEY)
        return _material(pair, ca, shapes.CA_CERT_KEY, f"Secret {namespace}/{ca_name}")
    return operator_secret_material(secret, namespace, cluster)


def operator_secret_material(
    secret: Mapping[str, Any] | None, namespace: str, cluster: str
) -> ClientMaterialRead:
    """The material of ``<name>-operator-client`` as read (None: absent), if it is the operator's."""
    name = names.operator_client_secret_name(cluster)
    if secret is None:
        return ClientMaterialRead(None, f"Secret {namespace}/{name} does not exist yet")
    if not operator_owned(secret, cluster):
        return ClientMaterialRead(None, f"Secret {namespace}/{name} is not recorded as the operator's")
    pair = _Pair(secret, shapes.TLS_CERT_KEY, shapes.TLS_KEY_KEY)
    return _material(pair, secret, shapes.TLS_CA_KEY, f"Secret {namespace}/{name}")


async def _user_material(
    api: KubeApi, namespace: str, client_name: str, server_name: str
) -> ClientMaterialRead:
    client = await api.read_secret(namespace, client_name)
    server = await api.read_secret(namespace, server_name) if client is not None else None
    return user_secrets_material(client, server, namespace, client_name, server_name)


def user_secrets_material(
    client: Mapping[str, Any] | None,
    server: Mapping[str, Any] | None,
    namespace: str,
    client_name: str,
    server_name: str,
) -> ClientMaterialRead:
    """Mode Secrets: ``tls.crt``/``tls.key`` of ``client`` (``spec.tls.secrets.operatorClient``) and
    ``ca.crt`` of ``server`` (``spec.tls.secrets.server``), each only if it opts in as a credential."""
    for field, secret_name, secret in (
        ("spec.tls.secrets.operatorClient", client_name, client),
        ("spec.tls.secrets.server", server_name, server),
    ):
        refused = credentials.refusal(
            credentials.NamedSecret(field, SecretRef(secret_name, "")), secret, namespace, ""
        )
        if secret is None or refused is not None:
            why = refused.message if refused is not None else f"Secret {namespace}/{secret_name} is absent"
            return ClientMaterialRead(None, why)
    assert client is not None and server is not None  # refused above otherwise
    where = f"Secrets {namespace}/{client_name} and {server_name}"
    return _material(_Pair(client, shapes.TLS_CERT_KEY, shapes.TLS_KEY_KEY), server, shapes.TLS_CA_KEY, where)


def operator_owned(secret: Mapping[str, Any], cluster: str) -> bool:
    """Recorded as the operator's for BrokerCluster ``cluster``: the ownership label names a uid, and
    a controller reference names that uid and ``cluster``."""
    uid = shapes.recorded_owner(secret)
    references = (secret.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(
        r.get("kind") == names.KIND
        and r.get("name") == cluster
        and r.get("uid") == uid
        and r.get("controller")
        for r in references
    )


@dataclass(frozen=True)
class _Pair:
    secret: Mapping[str, Any]
    cert_key: str
    key_key: str


def _material(pair: _Pair, trust_secret: Mapping[str, Any], trust_key: str, where: str) -> ClientMaterialRead:
    try:
        certificate = shapes.secret_pem(pair.secret, pair.cert_key, what=f"{where} {pair.cert_key}")
        key = shapes.secret_pem(pair.secret, pair.key_key, what=f"{where} {pair.key_key}")
        trust = shapes.secret_pem(trust_secret, trust_key, what=f"{where} {trust_key}")
        if certificate is None or key is None or trust is None:
            keys = f"{pair.cert_key}, {pair.key_key} and {trust_key}"
            return ClientMaterialRead(None, f"{where}: one of {keys} is missing")
        bundle_certificates(trust)  # CA certificates only, within the bounds
        leaf = load_certificates(certificate, what=f"{where} {pair.cert_key}")[0]
        load_key_pair(KeyPair(leaf.public_bytes(Encoding.PEM), key), what=where, validate=False)
    except CertificateError as error:
        return ClientMaterialRead(None, str(error))
    return ClientMaterialRead(ClientTlsMaterial(certificate, key, trust))
