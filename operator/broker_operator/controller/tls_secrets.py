"""The shape of the certificate Secrets (mode Operator), who owns them, and reading PEM out of any Secret.

Mode Operator keeps three Secrets per BrokerCluster, all written only by the operator:

- ``<name>-ca`` (``Opaque``): ``ca.crt`` and ``ca.key``, the cluster's CA. Never mounted, and read
  by the operator alone: whoever reads it can issue certificates the brokers accept.
- ``<name>-tls`` (``kubernetes.io/tls``, cert-manager's shape): ``tls.crt`` and ``tls.key``, the
  brokers' serving certificate, and ``ca.crt``, the trust bundle (the CA certificate). Every broker
  pod mounts it; the admin port verifies the operator's client certificate against ``ca.crt``, and
  ``ca.crt`` is what the SAP admin imports into STRUST.
- ``<name>-operator-client`` (``kubernetes.io/tls``): ``tls.crt`` and ``tls.key``, the operator's
  client certificate (mutual TLS on the brokers' admin port), and ``ca.crt``, the bundle the
  brokers' serving certificate chains to. Never mounted. A Secret of its own, not keys of
  ``<name>-ca``, so that RBAC can grant the people who run ``kubectl broker held`` (which calls the
  admin port as the operator does) ``get`` on this one Secret by ``resourceNames`` without handing
  them the CA's key: they can present the operator's certificate, not issue one.

Upgrades: an operator before this layout kept the client certificate in ``<name>-ca`` under
``client.crt`` and ``client.key`` (:data:`LEGACY_CLIENT_KEYS`). That pair is moved, not reissued:
the first pass writes it into ``<name>-operator-client``, and the keys are dropped from
``<name>-ca`` only on a later pass that found ``<name>-operator-client`` stored and ours
(``operator_certificates.plan_and_issue``), so that no failure in between loses the pair.

Ownership is recorded, never guessed from a name: each carries the label
``broker.failover.dev/certificates-owner`` with the BrokerCluster's uid, beside the labels every
child has (``app.kubernetes.io/managed-by``, which the chart's writes guard admits, and
``broker.failover.dev/cluster``) and a controller ownerReference (garbage collection with the
BrokerCluster). A Secret of any of these names whose label does not name this BrokerCluster's uid is
someone else's, and the operator never writes it (:func:`ownership`). The label, not the
ownerReference, is the record: a reference can be added by anyone's tooling (``kubectl apply`` of
an exported manifest, a backup restore), while the label is a claim only this operator makes.

Reading PEM out of a Secret is bounded (:func:`secret_pem`): the base64 text is measured before it
is decoded, so a Secret of megabytes is refused without being decoded into memory, in the words of
``pki.material.MAX_PEM_BYTES``.

What it does not do: issue, decide what is due (``pki``), or call the API (``certificates.py``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

from broker_contracts.tls.layout import TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE
from broker_operator.controller import names
from broker_operator.controller.builders import cluster_labels, owned_meta
from broker_operator.pki import MAX_PEM_BYTES, CertificateError, KeyPair

Manifest = dict[str, Any]

LABEL_CERTIFICATES_OWNER: Final = f"{names.GROUP}/certificates-owner"
SECRET_TYPE_OPAQUE: Final = "Opaque"
SECRET_TYPE_TLS: Final = "kubernetes.io/tls"
# <name>-ca's keys.
CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"
# Where <name>-ca held the operator's client certificate before <name>-operator-client (read for
# an upgrade, then removed: see the module's docstring).
LEGACY_CLIENT_CERT_KEY: Final = "client.crt"
LEGACY_CLIENT_KEY_KEY: Final = "client.key"
LEGACY_CLIENT_KEYS: Final = (LEGACY_CLIENT_CERT_KEY, LEGACY_CLIENT_KEY_KEY)
# <name>-tls's and <name>-operator-client's keys, and those of a user's Secret in mode Secrets
# (cert-manager's shape).
TLS_CERT_KEY: Final = TLS_CERT_FILE
TLS_KEY_KEY: Final = TLS_KEY_FILE
TLS_CA_KEY: Final = TLS_CA_FILE
# The operator's client certificate's name (commonName and subjectAltName): the same for every
# BrokerCluster, as each has a CA of its own that scopes it; a fixed 24 characters, where a name
# with the namespace could pass the 64 a commonName allows.
OPERATOR_CLIENT_NAME: Final = names.MANAGED_BY
_MAX_BASE64: Final = (MAX_PEM_BYTES + 2) // 3 * 4


class Ownership(StrEnum):
    ABSENT = "absent"
    OURS = "ours"  # the label names this BrokerCluster's uid
    FOREIGN = "foreign"  # exists, and is not recorded as this BrokerCluster's


def ownership(secret: Mapping[str, Any] | None, cluster_uid: str) -> Ownership:
    """Whose ``secret`` is, by the recorded label alone."""
    if secret is None:
        return Ownership.ABSENT
    labels = (secret.get("metadata") or {}).get("labels") or {}
    owner = labels.get(LABEL_CERTIFICATES_OWNER)
    return Ownership.OURS if cluster_uid and owner == cluster_uid else Ownership.FOREIGN


def recorded_owner(secret: Mapping[str, Any]) -> str | None:
    """The uid the ownership label names, if any (for a message)."""
    labels = (secret.get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_CERTIFICATES_OWNER)
    return str(value) if value else None


def secret_pem(secret: Mapping[str, Any], key: str, *, what: str) -> bytes | None:
    """The bytes of ``key`` in ``secret`` (None: no such key); over ``MAX_PEM_BYTES`` or not base64
    raises ``CertificateError`` naming ``what``, before anything large is decoded."""
    encoded = (secret.get("data") or {}).get(key)
    if encoded is None:
        return None
    if not isinstance(encoded, str) or len(encoded) > _MAX_BASE64:
        size = len(encoded) if isinstance(encoded, str) else 0
        raise CertificateError(
            f"{what} holds about {size * 3 // 4} bytes, over the {MAX_PEM_BYTES}-byte limit of a "
            "certificate, key or bundle"
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise CertificateError(f"{what} is not base64: {error}") from error


def key_pair(secret: Mapping[str, Any] | None, cert_key: str, key_key: str, *, what: str) -> KeyPair | None:
    """The certificate and key under ``cert_key``/``key_key``; None when both are absent. A half
    (one of the two), or bytes that are not readable, come back as a pair that ``pki.renewal``
    finds unreadable, so that it is reissued rather than taken as absent."""
    if secret is None:
        return None
    try:
        certificate = secret_pem(secret, cert_key, what=f"{what} {cert_key}")
        key = secret_pem(secret, key_key, what=f"{what} {key_key}")
    except CertificateError:
        return KeyPair(b"", b"")
    if certificate is None and key is None:
        return None
    return KeyPair(certificate or b"", key or b"")


def _labels(owner: Mapping[str, Any]) -> dict[str, str]:
    meta = owner["metadata"]
    return {**cluster_labels(meta["name"]), LABEL_CERTIFICATES_OWNER: str(meta.get("uid") or "")}


def _encoded(data: Mapping[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode() for key, value in data.items()}


def ca_secret_data(ca: KeyPair) -> dict[str, bytes]:
    return {CA_CERT_KEY: ca.certificate_pem, CA_KEY_KEY: ca.key_pem}


def tls_secret_data(server: KeyPair, trust_bundle: bytes) -> dict[str, bytes]:
    return {TLS_CERT_KEY: server.certificate_pem, TLS_KEY_KEY: server.key_pem, TLS_CA_KEY: trust_bundle}


def operator_client_secret_data(client: KeyPair, trust_bundle: bytes) -> dict[str, bytes]:
    """``<name>-operator-client``: the operator's pair, and what the brokers' certificate chains to."""
    return {TLS_CERT_KEY: client.certificate_pem, TLS_KEY_KEY: client.key_pem, TLS_CA_KEY: trust_bundle}


def _secret(owner: Mapping[str, Any], name: str, secret_type: str, data: Mapping[str, bytes]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": secret_type,
        "metadata": owned_meta(owner, name, _labels(owner)),
        "data": _encoded(data),
    }


def build_ca_secret(owner: Mapping[str, Any], data: Mapping[str, bytes]) -> Manifest:
    """``<name>-ca`` as created: Opaque, labelled and owned (see the module's docstring)."""
    return _secret(owner, names.ca_secret_name(owner["metadata"]["name"]), SECRET_TYPE_OPAQUE, data)


def build_tls_secret(owner: Mapping[str, Any], data: Mapping[str, bytes]) -> Manifest:
    """``<name>-tls`` as created: ``kubernetes.io/tls``, labelled and owned."""
    return _secret(owner, names.tls_secret_name(owner["metadata"]["name"]), SECRET_TYPE_TLS, data)


def build_operator_client_secret(owner: Mapping[str, Any], data: Mapping[str, bytes]) -> Manifest:
    """``<name>-operator-client`` as created: ``kubernetes.io/tls``, labelled and owned."""
    name = names.operator_client_secret_name(owner["metadata"]["name"])
    return _secret(owner, name, SECRET_TYPE_TLS, data)


def update_patch(
    owner: Mapping[str, Any],
    resource_version: str,
    data: Mapping[str, bytes],
    removed: tuple[str, ...] = (),
) -> Manifest:
    """A merge patch of an owned Secret's data (``removed``: keys to delete, as a merge patch's
    nulls), on condition that it is still at ``resource_version`` (the API server answers 409
    otherwise): two operator replicas never both write a different certificate over one they read."""
    encoded: dict[str, str | None] = {**_encoded(data), **dict.fromkeys(removed)}
    return {
        "metadata": {"resourceVersion": resource_version, "labels": _labels(owner)},
        "data": encoded,
    }


def legacy_client_keys(secret: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Which of :data:`LEGACY_CLIENT_KEYS` ``secret`` (a ``<name>-ca``) still holds."""
    data = (secret or {}).get("data") or {}
    return tuple(key for key in LEGACY_CLIENT_KEYS if key in data)


def held_data(secret: Mapping[str, Any] | None, keys: tuple[str, ...]) -> dict[str, bytes] | None:
    """What ``secret`` holds under ``keys`` (None if it is absent or any key is unreadable), to
    compare with what would be written: equal bytes, no write."""
    if secret is None:
        return None
    held: dict[str, bytes] = {}
    for key in keys:
        try:
            value = secret_pem(secret, key, what=key)
        except CertificateError:
            return None
        if value is None:
            return None
        held[key] = value
    return held


CA_SECRET_KEYS: Final = (CA_CERT_KEY, CA_KEY_KEY)
TLS_SECRET_KEYS: Final = (TLS_CERT_KEY, TLS_KEY_KEY, TLS_CA_KEY)
OPERATOR_CLIENT_SECRET_KEYS: Final = TLS_SECRET_KEYS
