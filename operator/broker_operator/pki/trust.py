"""Trust: CA bundles, their version, and whether a leaf verifies against one.

A *trust bundle* is the PEM concatenation of the CAs a party trusts: one CA normally, the old
and the new one while a CA key is being replaced (``replacement``). ``trust_bundle`` builds it
from any mix of PEMs, keeping the first of each certificate (by SHA-256 fingerprint) in order;
``bundle_version`` names its content (``broker_contracts.tls.bundle``: the brokers name what they
loaded the same way), so "every broker has loaded version X" is a comparison of
two short strings, and the same set of CAs has the same version however it was written.

``verification_error`` checks a leaf the way a TLS peer would, with cryptography's RFC 5280 /
Web PKI verifier (``cryptography.x509.verification``): a server leaf against a DNS name with
``ServerVerifier`` (serverAuth, subjectAltName match), a client leaf with ``ClientVerifier``
(clientAuth), both at the ``now`` passed in. It returns the verifier's reason rather than a bare
``False``, because that reason ends up in an event.

What it does not do: decide anything from the answer (``renewal``), or stand in for the TLS
stacks' own checks in the brokers and in SAP; the tests also run real handshakes with ``ssl``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.verification import DNSName, PolicyBuilder, Store, VerificationError

from broker_contracts.tls.bundle import fingerprints_version
from broker_operator.pki.material import (
    MAX_BUNDLE_CERTIFICATES,
    CertificateError,
    load_certificate,
    load_certificates,
)

__all__ = ["bundle_certificates", "bundle_version", "trust_bundle", "verification_error", "verifies"]


def bundle_certificates(*pems: bytes) -> tuple[x509.Certificate, ...]:
    """The certificates of ``pems`` (each one or more PEM certificates), first of each kept, in order."""
    seen: dict[bytes, x509.Certificate] = {}
    for pem in pems:
        for certificate in load_certificates(pem, what="trust bundle"):
            seen.setdefault(certificate.fingerprint(hashes.SHA256()), certificate)
    if len(seen) > MAX_BUNDLE_CERTIFICATES:
        raise CertificateError(
            f"{len(seen)} distinct certificates, "
            f"more than the {MAX_BUNDLE_CERTIFICATES} a trust bundle may hold"
        )
    for certificate in seen.values():
        try:
            is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise CertificateError(
                f"{certificate.subject.rfc4514_string()} in a trust bundle is not a CA certificate"
            )
    return tuple(seen.values())


def trust_bundle(*pems: bytes) -> bytes:
    """One PEM bundle of the CAs in ``pems``, each once, in the order first given."""
    return b"".join(
        certificate.public_bytes(serialization.Encoding.PEM) for certificate in bundle_certificates(*pems)
    )


def bundle_version(bundle: bytes) -> str:
    """A short name of the set of CAs in ``bundle``: order and duplicates do not change it.

    The bundle is checked here (CAs only, bounded); the version itself is the one definition the
    brokers report too (``broker_contracts.tls.bundle``)."""
    return fingerprints_version(
        certificate.fingerprint(hashes.SHA256()) for certificate in bundle_certificates(bundle)
    )


def _trust(trust: bytes | Sequence[bytes]) -> tuple[x509.Certificate, ...]:
    return bundle_certificates(trust) if isinstance(trust, bytes) else bundle_certificates(*trust)


def verification_error(
    leaf: bytes, trust: bytes | Sequence[bytes], *, dns_name: str | None = None, now: datetime
) -> str | None:
    """Why ``leaf`` (PEM or DER) does not verify against ``trust`` at ``now``; None when it does.

    With ``dns_name``, as the server certificate a client dialling that name receives;
    without, as a client certificate. Unreadable input raises ``CertificateError``.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now ({now.isoformat()}) must be an aware datetime (UTC)")
    certificate = load_certificate(leaf, what="leaf")
    builder = PolicyBuilder().store(Store(list(_trust(trust)))).time(now)
    try:
        if dns_name is None:
            builder.build_client_verifier().verify(certificate, [])
        else:
            builder.build_server_verifier(DNSName(dns_name)).verify(certificate, [])
    except VerificationError as error:
        return str(error)
    except ValueError as error:  # a dns_name the verifier cannot take
        return f"cannot verify against {dns_name!r}: {error}"
    return None


def verifies(
    leaf: bytes, trust: bytes | Sequence[bytes], *, dns_name: str | None = None, now: datetime
) -> bool:
    """``leaf`` verifies against ``trust`` at ``now`` (see ``verification_error``)."""
    return verification_error(leaf, trust, dns_name=dns_name, now=now) is None
