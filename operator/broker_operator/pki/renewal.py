"""What must be issued or renewed now, and why: one pure function of the materials and the clock.

``plan_renewal`` answers the controller's one question, "are these certificates still good for
these names, this CA, this date?", with a list of ``Renewal``s, each with human-readable reasons
(they become events: ``server: reissue (SANs changed: +orders-2... -orders-3...)``). An empty
list means nothing to do. The shell then issues with ``authority``: the CA first, the leaves
from the CA that results.

The rules:

- The CA: issued when missing; renewed *with the same key* (``renew-same-key``) when less than
  ``ca_renew_before_days`` of it remain. An unreadable CA, or one whose key is not its
  certificate's, raises ``CertificateError``: making a new key silently would leave every
  client that trusts the old CA (SAP's STRUST among them) refusing the brokers, which is how
  re-keying on renewal broke other operators' users. A new key is an explicit act
  (``replacement``).
- A leaf (the brokers' server certificate, the operator's client certificate): issued when
  missing, reissued when unreadable, not its key's, within ``renew_before_days`` of expiry,
  not yet valid, carrying other names than wanted, or not verifying against the current CA
  (another CA key signed it, or the verifier refuses it). All reasons found are listed.

Why the CA's renewal window is a fixed 365 days rather than a fraction of ``ca_days``: a
same-key renewal changes only the CA certificate, and a party holding the old one keeps
verifying until that one expires; the window is the time the renewed certificate has to
reach the trust stores the operator cannot write (SAP STRUST, the PI/PO keystore), imported by
hand through a change process. A year spans an annual maintenance cycle; a third of ten years
would renew 3.3 years early for nothing. It must be at least ``renew_before_days``, or a leaf
issued from a CA near its end (leaves never outlive their CA) would be due again at once.

"The current CA" is the one that signs leaves now, which during a key replacement is the one
``replacement`` names, so the same rule reissues the leaves in its Reissuing phase.

What it does not do: issue, read a clock, or touch Kubernetes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import Encoding

from broker_operator.pki.material import (
    CertificateError,
    CertificateInfo,
    KeyPair,
    certificate_info,
    load_key_pair,
)
from broker_operator.pki.names import check_dns_names
from broker_operator.pki.trust import verification_error

__all__ = [
    "ExpiryWarning",
    "Materials",
    "Renewal",
    "RenewalPolicy",
    "Target",
    "Verb",
    "describe_expiry",
    "expiry_warnings",
    "plan_renewal",
]


class Target(StrEnum):
    CA = "ca"
    SERVER = "server"
    CLIENT = "client"


class Verb(StrEnum):
    ISSUE = "issue"  # there is none
    REISSUE = "reissue"  # a new key and certificate
    RENEW_SAME_KEY = "renew-same-key"  # the CA only: new certificate, same key and subject


@dataclass(frozen=True)
class RenewalPolicy:
    """How long certificates live and when they are renewed, in days."""

    certificate_days: int = 90
    renew_before_days: int = 30
    ca_days: int = 3650
    ca_renew_before_days: int = 365
    warn_before_days: int = 14  # a leaf this close to expiry was not renewed: warn (expiry_warnings)

    def __post_init__(self) -> None:
        if not 1 <= self.renew_before_days < self.certificate_days:
            raise ValueError(
                f"renew_before_days ({self.renew_before_days}) must be at least 1 and less than "
                f"certificate_days ({self.certificate_days}), or a certificate would be due when issued"
            )
        if not self.renew_before_days <= self.ca_renew_before_days < self.ca_days:
            raise ValueError(
                f"ca_renew_before_days ({self.ca_renew_before_days}) must be at least renew_before_days "
                f"({self.renew_before_days}) and less than ca_days ({self.ca_days})"
            )
        if not 0 <= self.warn_before_days < self.renew_before_days:
            raise ValueError(
                f"warn_before_days ({self.warn_before_days}) must be less than renew_before_days "
                f"({self.renew_before_days}): a warning is for a certificate whose renewal failed"
            )


@dataclass(frozen=True)
class Materials:
    """What the Secrets hold now; ``ca`` is the CA that signs leaves now."""

    ca: KeyPair | None
    server: KeyPair | None
    client: KeyPair | None


@dataclass(frozen=True)
class Renewal:
    target: Target
    verb: Verb
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.target}: {self.verb} ({'; '.join(self.reasons)})"


def _span(delta: timedelta) -> str:
    delta = abs(delta)
    if delta >= timedelta(days=2):
        return f"{delta.days} days"
    if delta >= timedelta(hours=2):
        return f"{delta // timedelta(hours=1)} hours"
    return f"{max(delta // timedelta(minutes=1), 0)} minutes"


def describe_expiry(not_after: datetime, now: datetime) -> str:
    left = not_after - now
    return f"expires in {_span(left)}" if left > timedelta(0) else f"expired {_span(left)} ago"


def plan_renewal(
    materials: Materials,
    *,
    server_dns_names: Iterable[str],
    client_name: str,
    policy: RenewalPolicy,
    now: datetime,
) -> tuple[Renewal, ...]:
    """What to issue now, CA first; empty when every certificate is still good."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now ({now.isoformat()}) must be an aware datetime (UTC)")
    renewals: list[Renewal] = []
    ca_certificate: x509.Certificate | None = None
    if materials.ca is None:
        renewals.append(Renewal(Target.CA, Verb.ISSUE, ("missing",)))
    else:
        # Unvalidated: the public key is compared; authority validates the key when it signs.
        ca_certificate, _ = load_key_pair(materials.ca, what="the CA Secret's", validate=False)
        ca = certificate_info(ca_certificate)
        if not ca.is_ca:
            raise CertificateError(f"the CA Secret holds {ca.subject}, which is not a CA certificate")
        if ca.not_after - now <= timedelta(days=policy.ca_renew_before_days):
            renewals.append(Renewal(Target.CA, Verb.RENEW_SAME_KEY, (describe_expiry(ca.not_after, now),)))
    wanted = {
        Target.SERVER: check_dns_names(server_dns_names),
        Target.CLIENT: check_dns_names([client_name]),
    }
    pairs = {Target.SERVER: materials.server, Target.CLIENT: materials.client}
    for target, pair in pairs.items():
        if pair is None:
            renewals.append(Renewal(target, Verb.ISSUE, ("missing",)))
        elif ca_certificate is None:
            renewals.append(Renewal(target, Verb.REISSUE, ("the CA is issued anew",)))
        else:
            reasons = _leaf_problems(target, pair, wanted[target], ca_certificate, policy=policy, now=now)
            if reasons:
                renewals.append(Renewal(target, Verb.REISSUE, reasons))
    return tuple(renewals)


def _leaf_problems(
    target: Target,
    pair: KeyPair,
    wanted_names: tuple[str, ...],
    ca_certificate: x509.Certificate,
    *,
    policy: RenewalPolicy,
    now: datetime,
) -> tuple[str, ...]:
    try:
        certificate, _ = load_key_pair(pair, what=f"the {target} Secret's", validate=False)
    except CertificateError as error:
        return (f"unreadable: {error}",)
    leaf = certificate_info(certificate)
    reasons: list[str] = []
    added = sorted(set(wanted_names) - set(leaf.dns_names))
    removed = sorted(set(leaf.dns_names) - set(wanted_names))
    if added or removed:
        change = " ".join([*(f"+{name}" for name in added), *(f"-{name}" for name in removed)])
        reasons.append(f"{'SANs' if target is Target.SERVER else 'name'} changed: {change}")
    timely = True
    if leaf.not_before > now:
        reasons.append(f"not valid until {leaf.not_before.isoformat()}")
        timely = False
    if leaf.not_after - now <= timedelta(days=policy.renew_before_days):
        reasons.append(describe_expiry(leaf.not_after, now))
        timely = timely and leaf.not_after > now
    try:
        certificate.verify_directly_issued_by(ca_certificate)
    except (ValueError, TypeError, InvalidSignature):
        return (*reasons, "does not verify against the current CA (another CA signed it)")
    ca_current = ca_certificate.not_valid_before_utc <= now < ca_certificate.not_valid_after_utc
    named = target is Target.CLIENT or bool(leaf.dns_names)
    if timely and ca_current and named:  # otherwise the verifier would only repeat a reason given above
        refusal = verification_error(
            certificate.public_bytes(Encoding.PEM),
            ca_certificate.public_bytes(Encoding.PEM),
            dns_name=leaf.dns_names[0] if target is Target.SERVER else None,
            now=now,
        )
        if refusal is not None:
            reasons.append(f"does not verify against the current CA ({refusal})")
    return tuple(reasons)


@dataclass(frozen=True)
class ExpiryWarning:
    name: str
    not_after: datetime
    message: str  # "server expires in 9 days (2027-01-05T10:00:00+00:00)"

    def __str__(self) -> str:
        return self.message


def expiry_warnings(
    certificates: Mapping[str, CertificateInfo], *, within: timedelta, now: datetime
) -> tuple[ExpiryWarning, ...]:
    """The certificates that expire within ``within`` of ``now`` (or have expired), soonest first."""
    due = sorted(
        (info.not_after, name) for name, info in certificates.items() if info.not_after - now <= within
    )
    return tuple(
        ExpiryWarning(name, not_after, f"{name} {describe_expiry(not_after, now)} ({not_after.isoformat()})")
        for not_after, name in due
    )
