"""What the certificates of a BrokerCluster look like now: ``status.tls`` and condition ``CertificatesValid``.

Pure: given what the Secrets hold (already read, and in mode Operator already renewed), it says
which certificates are in use (their Secret, serial and ``notAfter``, never a key or a
certificate), what is wrong with them, and how to say it. The checks of a user's Secret (mode
Secrets) and of a CA bundle the spec names are here too, as they only read.

The condition's reasons, most severe first; each False one is also a Warning event
(``certificates.py``, once per distinct message):

- ``NotOwned`` (False): ``<name>-ca`` or ``<name>-tls`` exists and is not recorded as this
  BrokerCluster's (``tls_secrets.ownership``); the operator never overwrites it.
- ``Invalid`` (False): does not parse, is not its key's, carries none of the names the brokers are
  dialled by, or does not chain to the CA that should trust it.
- ``Expired`` (False).
- ``Missing`` (False): a Secret or one of its keys is absent.
- ``WriteFailed`` (False): the operator could not write its Secret (RBAC, admission).
- ``CredentialRefused`` (Unknown): a Secret the spec names exists but does not opt in as a
  credential; it is not read, and ``CredentialsAllowed`` (``permitted.py``) says why, with its own
  event, so this one posts none.
- ``ExpiringSoon`` (True): usable, but one ends within the warning window (``warn_within``; in mode
  Operator the policy's ``warn_before_days``, below ``renewBeforeDays``, so it means a renewal
  failed; in mode Secrets 14 days: cert-manager, or a person, did not renew it).
- ``Valid`` (True).

``status.tls.served[]`` (:func:`served_status`) is what the heartbeats saw: the serial each broker's
serving certificate had in the operator's latest handshake with it.

Messages name dates, not "in 3 days": a message that changed with the clock would rewrite the
status and post an event on every pass.

What it does not do: read or write Secrets, issue, or decide what to renew (``pki.renewal``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from cryptography.hazmat.primitives.serialization import Encoding

from broker_operator.controller.tls_secrets import TLS_CA_KEY, TLS_CERT_KEY, TLS_KEY_KEY, secret_pem
from broker_operator.core import spec_fields as fields
from broker_operator.pki import (
    CertificateError,
    CertificateInfo,
    bundle_certificates,
    certificate_info,
    expiry_warnings,
    load_certificates,
    load_private_key,
    verification_error,
)

CONDITION_CERTIFICATES: Final = "CertificatesValid"
VALID: Final = "Valid"
EXPIRING_SOON: Final = "ExpiringSoon"
NOT_OWNED: Final = "NotOwned"
INVALID: Final = "Invalid"
EXPIRED: Final = "Expired"
MISSING: Final = "Missing"
WRITE_FAILED: Final = "WriteFailed"
CREDENTIAL_REFUSED: Final = "CredentialRefused"
SEVERITY: Final = (NOT_OWNED, INVALID, EXPIRED, MISSING, WRITE_FAILED, CREDENTIAL_REFUSED)
# status.tls.certificates[].name
CA: Final = "ca"
SERVER: Final = "server"
OPERATOR_CLIENT: Final = "operatorClient"
BACKEND_CLIENTS_CA: Final = "backendClientsCA"
UPSTREAM_CA: Final = "upstreamCA"


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Entry:
    """One certificate in use: ``status.tls.certificates[]``."""

    name: str
    secret: str  # the Secret, and ":key" where the spec names the key
    info: CertificateInfo | None = None

    def status(self) -> dict[str, str]:
        entry = {"name": self.name, "secret": self.secret}
        if self.info is not None:
            entry.update(serial=self.info.serial, notAfter=rfc3339(self.info.not_after))
        return entry


@dataclass(frozen=True)
class Problem:
    reason: str  # one of SEVERITY
    message: str


@dataclass(frozen=True)
class Condition:
    status: bool | None  # None: Unknown
    reason: str
    message: str


@dataclass(frozen=True)
class CertificateReport:
    mode: str
    entries: tuple[Entry, ...] = ()
    problems: tuple[Problem, ...] = ()
    warn_within: timedelta = timedelta(days=14)
    renews: bool = False  # mode Operator: an expiring certificate means a renewal failed

    def status_tls(self) -> dict[str, Any]:
        """``status.tls`` without ``served`` and ``caReplacement`` (not this report's): a merge patch
        of it leaves them as they are. Mode Disabled removes the certificates."""
        if self.mode == fields.TLS_MODE_DISABLED:
            return {"mode": self.mode, "certificates": None}
        return {"mode": self.mode, "certificates": [entry.status() for entry in self.entries]}

    def condition(self, now: datetime) -> Condition | None:
        """``CertificatesValid`` at ``now``; None in mode Disabled (no certificate to speak of)."""
        if self.mode == fields.TLS_MODE_DISABLED:
            return None
        problems = list(self.problems)
        for entry in self.entries:
            if entry.info is not None and entry.info.not_after <= now:
                problems.append(
                    Problem(
                        EXPIRED,
                        f"{entry.name} (Secret {entry.secret}) expired at {rfc3339(entry.info.not_after)}: "
                        + self._expired_advice(entry),
                    )
                )
        if problems:
            worst = min(problems, key=lambda p: SEVERITY.index(p.reason))
            message = "; ".join(p.message for p in sorted(problems, key=lambda p: SEVERITY.index(p.reason)))
            return Condition(None if worst.reason == CREDENTIAL_REFUSED else False, worst.reason, message)
        infos = {entry.name: entry.info for entry in self.entries if entry.info is not None}
        secrets = {entry.name: entry.secret for entry in self.entries}
        warnings = expiry_warnings(infos, within=self.warn_within, now=now)
        if warnings:
            advice = (
                "it was not renewed: see the operator's events and log"
                if self.renews
                else "renew it (cert-manager, or a new tls.crt and tls.key in the Secret)"
            )
            text = "; ".join(
                f"{w.name} (Secret {secrets[w.name]}) expires at {rfc3339(w.not_after)}" for w in warnings
            )
            return Condition(True, EXPIRING_SOON, f"{text}: {advice}")
        if not infos:
            return Condition(True, VALID, "no certificate in use")
        first = min(infos.items(), key=lambda item: item[1].not_after)
        return Condition(
            True,
            VALID,
            f"every certificate is usable; the first to end is {first[0]}, at {rfc3339(first[1].not_after)}",
        )

    def _expired_advice(self, entry: Entry) -> str:
        if self.renews and entry.name in (SERVER, OPERATOR_CLIENT, CA):
            return "the operator could not renew it: see its events and log"
        return "replace it"


SERVED_MAX: Final = 16  # the CRD's maxItems of status.tls.served


def served_status(
    seen: Mapping[str, str], current: Iterable[Mapping[str, Any]], brokers: Iterable[str] | None
) -> list[dict[str, str]]:
    """``status.tls.served[]``: ``current`` (what the status holds) updated with ``seen`` (broker ->
    the serial of its latest handshake; a broker not handshaken since the operator started keeps
    what was recorded), limited to ``brokers`` when they are known (a broker scaled away goes),
    sorted by broker, at most ``SERVED_MAX``."""
    served = {str(e["broker"]): str(e["serial"]) for e in current if e.get("broker") and e.get("serial")}
    served.update(seen)
    wanted = set(brokers) if brokers is not None else None
    kept = sorted((b, s) for b, s in served.items() if wanted is None or b in wanted)
    return [{"broker": broker, "serial": serial} for broker, serial in kept[:SERVED_MAX]]


def _where(namespace: str, secret: str, field: str) -> str:
    return f"Secret {namespace}/{secret} ({field})"


def _bundle_entry(
    name: str, secret: Mapping[str, Any], key: str, where: str, label: str
) -> tuple[Entry, Problem | None]:
    try:
        pem = secret_pem(secret, key, what=f"{where} key {key}")
        if pem is None:
            return Entry(name, label), Problem(MISSING, f"{where} has no key {key}: add the CA bundle (PEM)")
        first = bundle_certificates(pem)[0]
    except CertificateError as error:
        return Entry(name, label), Problem(INVALID, f"{where} key {key}: {error}")
    return Entry(name, label, certificate_info(first)), None


def check_bundle(
    name: str, secret: Mapping[str, Any] | None, *, namespace: str, secret_name: str, key: str, field: str
) -> tuple[Entry, Problem | None]:
    """A CA bundle the spec names (``backendClientsCA``, ``upstreamCA``): its first certificate."""
    where, label = _where(namespace, secret_name, field), f"{secret_name}:{key}"
    if secret is None:
        return Entry(name, label), Problem(MISSING, f"{where} does not exist: create it with key {key}")
    return _bundle_entry(name, secret, key, where, label)


@dataclass(frozen=True)
class UserPair:
    """What ``check_user_pair`` found in one user Secret (mode Secrets)."""

    entry: Entry  # its leaf (tls.crt's first certificate)
    ca: Entry | None  # its ca.crt's first certificate
    problems: tuple[Problem, ...]


def check_user_pair(
    name: str,
    secret: Mapping[str, Any] | None,
    *,
    namespace: str,
    secret_name: str,
    field: str,
    dns_names: tuple[str, ...] | None,
    now: datetime,
) -> UserPair:
    """A user's Secret of cert-manager's shape: ``tls.crt`` (leaf first), ``tls.key`` (its key) and
    ``ca.crt`` (what the leaf chains to). ``dns_names``: for the server, the names it is dialled by
    (it must carry one, and verify for it); None for a client certificate. Expiry is left to the
    report's condition; a certificate outside its validity is not also verified, so that an expired
    one is called Expired, not Invalid."""
    where = _where(namespace, secret_name, field)
    if secret is None:
        return UserPair(
            Entry(name, secret_name),
            None,
            (
                Problem(
                    MISSING,
                    f"{where} does not exist: create it (type kubernetes.io/tls with tls.crt, tls.key and "
                    "ca.crt, as cert-manager writes it)",
                ),
            ),
        )
    problems: list[Problem] = []
    raw: dict[str, bytes] = {}
    for key in (TLS_CERT_KEY, TLS_KEY_KEY, TLS_CA_KEY):
        try:
            value = secret_pem(secret, key, what=f"{where} key {key}")
        except CertificateError as error:
            problems.append(Problem(INVALID, str(error)))
            continue
        if value is None:
            problems.append(Problem(MISSING, f"{where} has no key {key}: cert-manager's shape has all three"))
        else:
            raw[key] = value
    entry, ca_entry, leaf_pem, ca_pem = Entry(name, secret_name), None, None, None
    if TLS_CERT_KEY in raw:
        try:
            leaf = load_certificates(raw[TLS_CERT_KEY], what=f"{where} key {TLS_CERT_KEY}")[0]
            entry, leaf_pem = (
                Entry(name, secret_name, certificate_info(leaf)),
                leaf.public_bytes(Encoding.PEM),
            )
            if TLS_KEY_KEY in raw:
                private = load_private_key(
                    raw[TLS_KEY_KEY], what=f"{where} key {TLS_KEY_KEY}", validate=False
                )
                if private.public_key() != leaf.public_key():
                    problems.append(Problem(INVALID, f"{where}: tls.key is not the key of tls.crt"))
        except CertificateError as error:
            problems.append(Problem(INVALID, str(error)))
    if TLS_CA_KEY in raw:
        try:
            first = bundle_certificates(raw[TLS_CA_KEY])[0]
            ca_entry, ca_pem = (
                Entry(CA, f"{secret_name}:{TLS_CA_KEY}", certificate_info(first)),
                raw[TLS_CA_KEY],
            )
        except CertificateError as error:
            problems.append(Problem(INVALID, f"{where} key {TLS_CA_KEY}: {error}"))
    if leaf_pem is not None and ca_pem is not None and entry.info is not None and not problems:
        problems += _chain_problems(
            entry.info, leaf_pem, ca_pem=ca_pem, where=where, dns_names=dns_names, now=now
        )
    return UserPair(entry, ca_entry, tuple(problems))


def _chain_problems(
    info: CertificateInfo,
    leaf_pem: bytes,
    *,
    ca_pem: bytes,
    where: str,
    dns_names: tuple[str, ...] | None,
    now: datetime,
) -> list[Problem]:
    if not info.not_before <= now < info.not_after:
        return []  # Expired (the condition's), or not valid yet: verifying would only repeat it
    dialled = None
    if dns_names is not None:
        dialled = next((n for n in info.dns_names if n in dns_names), None)
        if dialled is None:
            return [
                Problem(
                    INVALID,
                    f"{where}: tls.crt carries none of the names the brokers are dialled by "
                    f"(e.g. {dns_names[0]}); it has {', '.join(info.dns_names) or 'no DNS name'}",
                )
            ]
    try:
        refusal = verification_error(leaf_pem, ca_pem, dns_name=dialled, now=now)
    except CertificateError as error:
        return [Problem(INVALID, f"{where}: {error}")]
    if refusal is None:
        return []
    return [Problem(INVALID, f"{where}: tls.crt does not verify against its ca.crt ({refusal})")]
