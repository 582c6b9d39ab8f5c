"""``spec.tls``: how every channel of a BrokerCluster is encrypted, read into a frozen ``TlsSpec``.

Three modes, one field (``mode``), so that each Secret has one owner:

- ``Operator`` (the default): the operator's CA per BrokerCluster (``<name>-ca``, never mounted)
  issues the brokers' serving certificate and the operator's client certificate, and renews them
  (``certificates``); the brokers mount ``<name>-tls``.
- ``Secrets``: the user names two Secrets of cert-manager's shape (``kubernetes.io/tls`` plus
  ``ca.crt``), which the operator only reads and mounts: ``server`` (the brokers' serving
  certificate; its ``ca.crt`` is what SAP must trust) and ``operatorClient`` (the operator's
  client certificate; its ``ca.crt`` is what the brokers trust on the admin port).
- ``Disabled``: plain HTTP, the opt-out.

Independent of the mode: ``backendClients`` (mutual TLS on the main port, the customer's CA and
the subjects allowed to call SendMessages; needs TLS) and ``upstreamCASecretRef`` (the bundle the
brokers verify ``https://`` backend and cloud URLs against; absent, the system's trust store).

This is the second line behind the CRD's CEL rules (``spec.py`` says why there are two): the same
defaults from ``core/spec_fields.py`` and the same rules with the same messages, which the
``*_MESSAGE`` functions below word exactly as the CRD's ``messageExpression``s do (the e2e tests
compare them against a real API server). One check goes further than CEL can: each allowed
subject is parsed as the broker parses it (``broker_contracts.tls.subjects``), so a subject the
brokers would refuse at start (and crash-loop on) is refused here, before any pod is made.

What it does not do: issue, read or write certificates, or decide when to renew (``pki/``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from broker_contracts.tls.subjects import SubjectError, parse_subject
from broker_operator.controller.secret_refs import SecretRef, read_secret_ref
from broker_operator.core import spec_fields as fields
from broker_operator.pki.names import check_dns_names
from broker_operator.pki.renewal import RenewalPolicy

DNS_NAME_MAX: Final = 253  # pki.names' bound, and the CRD's
EXTRA_DNS_NAMES_MAX: Final = 16
# The shape CEL can check of an RFC 4514 subject: it starts with TYPE= (a name or an OID). The
# rest is parse_subject's, here and in the broker.
SUBJECT_START: Final = r"^\s*([A-Za-z][A-Za-z0-9-]*|[0-9]+(\.[0-9]+)+)\s*="
ALLOWED_SUBJECTS_MAX: Final = 64
SUBJECT_MAX: Final = 1024
# How long before a leaf's expiry the operator warns that its renewal failed (pki.RenewalPolicy);
# lowered for a renewBeforeDays at or below it, which the policy would otherwise refuse.
WARN_BEFORE_DAYS: Final = 14

SECRETS_REQUIRED_MESSAGE: Final = (
    "spec.tls.secrets is required when spec.tls.mode is Secrets: name the Secret of the brokers' "
    "serving certificate (server) and the one of the operator's client certificate (operatorClient)"
)
BACKEND_CLIENTS_NEED_TLS_MESSAGE: Final = (
    "spec.tls.backendClients asks for client certificates, which exist only over TLS, and "
    "spec.tls.mode is Disabled: set mode Operator or Secrets, or remove backendClients"
)
SUBJECTS_REQUIRED_MESSAGE: Final = (
    "spec.tls.backendClients.allowedSubjects must list at least one RFC 4514 subject (e.g. "
    "CN=SAP-ERP-PRD,O=Example): only certificates with a listed subject may call SendMessages; remove "
    "backendClients to ask for no client certificate"
)


def secrets_forbidden_message(mode: str) -> str:
    return (
        f"spec.tls.secrets is read in mode Secrets only, and spec.tls.mode is {mode}: remove secrets, or "
        "set mode Secrets"
    )


def certificates_forbidden_message(mode: str) -> str:
    return (
        f"spec.tls.certificates is for the certificates the operator issues (mode Operator), and "
        f"spec.tls.mode is {mode}: remove certificates, or set mode Operator"
    )


def extra_dns_names_forbidden_message(mode: str) -> str:
    return (
        f"spec.tls.extraDNSNames is for the certificate the operator issues (mode Operator), and "
        f"spec.tls.mode is {mode}: remove extraDNSNames, or set mode Operator"
    )


def renew_before_message(renew_before: int, validity: int) -> str:
    return (
        f"spec.tls.certificates.renewBeforeDays ({renew_before}) must be less than validityDays "
        f"({validity}), or a certificate would be due for renewal the day it is issued"
    )


def dns_name_message(path: str, value: str) -> str:
    return (
        f"{path} ({value}) is not a DNS name a certificate can carry: lower-case labels of a-z, 0-9 and "
        f"'-' (1 to 63 characters, no '-' at either end) separated by dots, {DNS_NAME_MAX} characters in all"
    )


def subject_shape_message(value: str) -> str:
    return (
        f"spec.tls.backendClients.allowedSubjects[] ({value}) must be an RFC 4514 subject: TYPE=value "
        "pairs separated by commas, e.g. CN=SAP-ERP-PRD,O=Example"
    )


@dataclass(frozen=True)
class TlsSecrets:
    """Mode Secrets: the user's Secrets (cert-manager's shape), which the operator only reads."""

    server: str  # tls.crt, tls.key: the brokers' serving certificate; its ca.crt is SAP's trust
    operator_client: str  # the operator's client certificate; its ca.crt: the admin port's trust


@dataclass(frozen=True)
class BackendClients:
    """Mutual TLS on the main port: the CA of the backend's client certificates (the customer's
    PKI) and the RFC 4514 subjects allowed to call SendMessages, as written."""

    ca: SecretRef
    allowed_subjects: tuple[str, ...]


@dataclass(frozen=True)
class CertificateLifetimes:
    """Mode Operator: how long the certificates the operator issues live, in days."""

    validity_days: int = fields.CERTIFICATE_VALIDITY_DAYS.default or 0
    renew_before_days: int = fields.CERTIFICATE_RENEW_BEFORE_DAYS.default or 0
    ca_validity_days: int = fields.CA_VALIDITY_DAYS.default or 0

    def renewal_policy(self) -> RenewalPolicy:
        """The PKI's policy for these lifetimes. The CRD's bounds and its renewBeforeDays rule make
        every accepted spec a valid policy (tests/unit/controller/test_tls_spec.py tries the edges)."""
        return RenewalPolicy(
            certificate_days=self.validity_days,
            renew_before_days=self.renew_before_days,
            ca_days=self.ca_validity_days,
            warn_before_days=min(WARN_BEFORE_DAYS, self.renew_before_days - 1),
        )


@dataclass(frozen=True)
class TlsSpec:
    mode: str = fields.TLS_MODE.default
    cluster_domain: str = fields.TLS_CLUSTER_DOMAIN.default
    extra_dns_names: tuple[str, ...] = ()
    secrets: TlsSecrets | None = None  # mode Secrets only, and then always
    backend_clients: BackendClients | None = None  # never with mode Disabled
    upstream_ca: SecretRef | None = None  # None: the system's trust store
    certificates: CertificateLifetimes = field(default_factory=CertificateLifetimes)

    @property
    def enabled(self) -> bool:
        """Whether the brokers serve TLS (both ports) under this spec."""
        return self.mode != fields.TLS_MODE_DISABLED

    @property
    def operator_issues(self) -> bool:
        return self.mode == fields.TLS_MODE_OPERATOR


def parse_tls(raw: Mapping[str, Any], problems: list[str]) -> TlsSpec:
    """``spec.tls`` (``{}`` when absent) defaulted and checked as the CRD does."""
    mode = fields.TLS_MODE.read(raw, problems)
    domain = raw.get("clusterDomain", fields.TLS_CLUSTER_DOMAIN.default)
    if not _dns_name(domain):
        problems.append(dns_name_message("spec.tls.clusterDomain", str(domain)))
        domain = fields.TLS_CLUSTER_DOMAIN.default
    extra = _extra_dns_names(raw.get("extraDNSNames"), problems)
    if extra and mode != fields.TLS_MODE_OPERATOR:
        problems.append(extra_dns_names_forbidden_message(mode))
    secrets = _secrets(raw.get("secrets"), mode, problems)
    backend_clients = _backend_clients(raw.get("backendClients"), problems)
    if backend_clients is not None and mode == fields.TLS_MODE_DISABLED:
        problems.append(BACKEND_CLIENTS_NEED_TLS_MESSAGE)
    certificates = _certificates(raw.get("certificates"), mode, problems)
    return TlsSpec(
        mode=mode,
        cluster_domain=str(domain),
        extra_dns_names=extra,
        secrets=secrets,
        backend_clients=backend_clients,
        upstream_ca=read_secret_ref(raw.get("upstreamCASecretRef"), fields.UPSTREAM_CA_KEY, problems),
        certificates=certificates,
    )


def _dns_name(value: object) -> bool:
    """A DNS name the PKI puts in a certificate (``pki.names.check_dns_names``, whose label rule the
    CRD's pattern spells out), and already lower-case: the PKI lowercases, the CRD refuses upper
    case instead, so that what is stored is what is issued."""
    if not isinstance(value, str):
        return False
    try:
        return check_dns_names([value]) == (value,)
    except ValueError:
        return False


def _extra_dns_names(raw: object, problems: list[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) > EXTRA_DNS_NAMES_MAX:
        problems.append(
            f"spec.tls.extraDNSNames must be a list of at most {EXTRA_DNS_NAMES_MAX} DNS names, got {raw!r}"
        )
        return ()
    names: list[str] = []
    for value in raw:
        if _dns_name(value):
            names.append(value)
        else:
            problems.append(dns_name_message("spec.tls.extraDNSNames[]", str(value)))
    return tuple(names)


def _secret_name(raw: Mapping[str, Any], key: str, problems: list[str]) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        problems.append(
            f"spec.tls.secrets.{key} must name a Secret in the BrokerCluster's namespace, got {value!r}"
        )
        return ""
    return value


def _secrets(raw: object, mode: str, problems: list[str]) -> TlsSecrets | None:
    if raw is None:
        if mode == fields.TLS_MODE_SECRETS:
            problems.append(SECRETS_REQUIRED_MESSAGE)
        return None
    if not isinstance(raw, Mapping):
        problems.append(f"spec.tls.secrets must be an object {{server, operatorClient}}, got {raw!r}")
        return None
    secrets = TlsSecrets(_secret_name(raw, "server", problems), _secret_name(raw, "operatorClient", problems))
    if mode != fields.TLS_MODE_SECRETS:
        problems.append(secrets_forbidden_message(mode))
        return None
    return secrets


def _backend_clients(raw: object, problems: list[str]) -> BackendClients | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append(
            f"spec.tls.backendClients must be an object {{caSecretRef, allowedSubjects}}, got {raw!r}"
        )
        return None
    ca = read_secret_ref(raw.get("caSecretRef"), fields.BACKEND_CLIENTS_CA_KEY, problems)
    if ca is None and "caSecretRef" not in raw:
        problems.append(
            "spec.tls.backendClients.caSecretRef is required: the Secret key holding the CA of the "
            "backend's client certificates"
        )
    subjects = raw.get("allowedSubjects")
    if not isinstance(subjects, Sequence) or isinstance(subjects, str) or not subjects:
        problems.append(SUBJECTS_REQUIRED_MESSAGE)
        subjects = ()
    elif len(subjects) > ALLOWED_SUBJECTS_MAX:
        problems.append(
            f"spec.tls.backendClients.allowedSubjects lists {len(subjects)} subjects, "
            f"over {ALLOWED_SUBJECTS_MAX}"
        )
    checked: list[str] = []
    for index, subject in enumerate(subjects):
        text = str(subject)
        if not isinstance(subject, str) or re.match(SUBJECT_START, subject) is None:
            problems.append(subject_shape_message(text))
            continue
        try:
            parse_subject(subject)  # the broker's own parser: what it would refuse at start
        except SubjectError as error:
            problems.append(f"spec.tls.backendClients.allowedSubjects[{index}]: {error}")
            continue
        checked.append(subject)
    return None if ca is None else BackendClients(ca, tuple(checked))


def _certificates(raw: object, mode: str, problems: list[str]) -> CertificateLifetimes:
    if raw is None:
        return CertificateLifetimes()
    if mode != fields.TLS_MODE_OPERATOR:
        problems.append(certificates_forbidden_message(mode))
        return CertificateLifetimes()
    if not isinstance(raw, Mapping):
        problems.append(f"spec.tls.certificates must be an object, got {raw!r}")
        return CertificateLifetimes()
    lifetimes = CertificateLifetimes(
        validity_days=fields.CERTIFICATE_VALIDITY_DAYS.read(raw, problems),
        renew_before_days=fields.CERTIFICATE_RENEW_BEFORE_DAYS.read(raw, problems),
        ca_validity_days=fields.CA_VALIDITY_DAYS.read(raw, problems),
    )
    if lifetimes.renew_before_days >= lifetimes.validity_days:
        problems.append(renew_before_message(lifetimes.renew_before_days, lifetimes.validity_days))
        return CertificateLifetimes()
    return lifetimes
