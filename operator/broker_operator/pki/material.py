"""Certificates and keys as the PKI stores them (PEM), and a parsed view of a certificate.

``KeyPair`` is what a Secret holds: a certificate and its private key, both PEM. It is the only
form the rest of the package passes around, so what is issued, stored and read back is the same
bytes. ``CertificateInfo`` is the parsed view the renewal and replacement rules read: serial,
validity (aware UTC datetimes), subject, DNS names, and the key identifiers that say which CA key
signed a leaf (``authority_key_id``, the issuer's ``subject_key_id``). A CA renewed with the same
key keeps its ``subject_key_id``, so "signed by this CA" stays true across a same-key renewal and
becomes false only when the CA's key is replaced, which is the distinction the rules need.

Why parsing is bounded: the bytes come from Secrets and from a peer's TLS handshake, which anyone
able to edit a Secret or answer on a broker's port controls. A blob over ``MAX_PEM_BYTES``, more
than ``MAX_BUNDLE_CERTIFICATES`` certificates in a bundle, a private key inside a bundle that is
handed to brokers, or anything that does not parse raises ``CertificateError`` naming what was
wrong, before any of it is used.

What it does not do: issue, verify a chain, or decide anything (``authority``, ``trust``,
``renewal``); read or write Secrets (the controller's shell).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from broker_contracts.tls.serial import serial_hex

__all__ = [
    "MAX_BUNDLE_CERTIFICATES",
    "MAX_PEM_BYTES",
    "CertificateError",
    "CertificateInfo",
    "KeyPair",
    "certificate_info",
    "load_certificate",
    "load_certificates",
    "load_key_pair",
    "load_private_key",
]

# A CA bundle of a few RSA-3072 certificates is under 10 KiB; 64 KiB leaves room and bounds the work.
MAX_PEM_BYTES: Final = 64 * 1024
# A bundle holds the CA, and during a key replacement the old and the new one; a few more are
# tolerated (a user-supplied client CA, say), dozens are not ours.
MAX_BUNDLE_CERTIFICATES: Final = 8

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")


class CertificateError(ValueError):
    """A certificate, bundle or key that cannot be used, with what was wrong and where it came from."""


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, PEM (the key unencrypted PKCS#8), as a Secret stores them."""

    certificate_pem: bytes
    key_pem: bytes = field(repr=False)  # never in a log line or an event

    def info(self) -> CertificateInfo:
        return certificate_info(self.certificate_pem)


@dataclass(frozen=True)
class CertificateInfo:
    """What the renewal and replacement rules read of a certificate."""

    serial: str  # `openssl x509 -serial`, lower-cased: two hex digits an octet (serial_hex)
    not_before: datetime  # aware, UTC
    not_after: datetime  # aware, UTC
    subject: str  # RFC 4514
    issuer: str  # RFC 4514
    dns_names: tuple[str, ...]  # the subjectAltName's DNS names, in certificate order
    is_ca: bool
    subject_key_id: str  # hex; for a CA, what its leaves carry as authority_key_id
    authority_key_id: str | None  # hex; which CA key signed this (a self-signed CA: its own)
    fingerprint: str  # SHA-256 of the DER, hex: tells two certificates apart, even of one key

    def signed_by(self, ca: CertificateInfo) -> bool:
        """Issued under ``ca``'s key (by key identifier; the signature itself is ``trust``'s to check)."""
        return self.authority_key_id is not None and self.authority_key_id == ca.subject_key_id


def _source(what: str) -> str:
    return f" ({what})" if what else ""


def _check_size(data: bytes, what: str) -> None:
    if not isinstance(data, bytes | bytearray):
        raise CertificateError(f"expected bytes{_source(what)}, got {type(data).__name__}")
    if len(data) > MAX_PEM_BYTES:
        raise CertificateError(
            f"{len(data)} bytes{_source(what)} is over the {MAX_PEM_BYTES}-byte limit of a certificate "
            "or bundle: this is not one the operator wrote; restore the Secret or delete it to reissue"
        )
    if not data.strip():
        raise CertificateError(f"empty{_source(what)}: expected a PEM certificate")


def load_certificates(data: bytes, *, what: str = "") -> tuple[x509.Certificate, ...]:
    """Every certificate of a PEM bundle, in order; anything but CERTIFICATE blocks is refused.

    ``what`` names the source in the error ("Secret orders-tls ca.crt").
    """
    _check_size(data, what)
    kinds = [match.group(1).decode() for match in _PEM_BLOCK.finditer(data)]
    if not kinds:
        raise CertificateError(f"no PEM block{_source(what)}: expected '-----BEGIN CERTIFICATE-----'")
    if len(kinds) > MAX_BUNDLE_CERTIFICATES:
        raise CertificateError(
            f"{len(kinds)} PEM blocks{_source(what)}, "
            f"more than the {MAX_BUNDLE_CERTIFICATES} a bundle may hold"
        )
    others = sorted({kind for kind in kinds if kind != "CERTIFICATE"})
    if others:
        # A key pasted into a bundle would be handed to every broker that mounts the bundle.
        raise CertificateError(f"{', '.join(others)} block in a certificate bundle{_source(what)}: refused")
    try:
        certificates = x509.load_pem_x509_certificates(bytes(data))
    except ValueError as error:
        raise CertificateError(f"unreadable certificate{_source(what)}: {error}") from error
    if len(certificates) != len(kinds):
        raise CertificateError(f"{len(kinds)} PEM blocks{_source(what)} but {len(certificates)} certificates")
    return tuple(certificates)


def load_certificate(data: bytes, *, what: str = "") -> x509.Certificate:
    """Exactly one certificate, PEM or DER (a peer's, from ``getpeercert(binary_form=True)``)."""
    _check_size(data, what)
    if b"-----BEGIN" not in data:
        try:
            return x509.load_der_x509_certificate(bytes(data))
        except ValueError as error:
            raise CertificateError(f"neither PEM nor a DER certificate{_source(what)}: {error}") from error
    certificates = load_certificates(data, what=what)
    if len(certificates) != 1:
        raise CertificateError(f"{len(certificates)} certificates{_source(what)}, expected exactly one")
    return certificates[0]


def load_private_key(data: bytes, *, what: str = "", validate: bool = True) -> rsa.RSAPrivateKey:
    """An unencrypted RSA private key, PEM; the PKI issues and signs with RSA only.

    ``validate=False`` skips cryptography's consistency check of the private numbers (about
    130 ms for an RSA-3072 key, 20 for RSA-2048): enough to compare the public key with a
    certificate's, which ``renewal`` does on every check of every cluster. A key about to sign
    is always loaded validated (``authority``).
    """
    _check_size(data, what)
    kinds = [match.group(1).decode() for match in _PEM_BLOCK.finditer(data)]
    if len(kinds) != 1 or not kinds[0].endswith("PRIVATE KEY"):
        raise CertificateError(
            f"expected exactly one PEM private key{_source(what)}, found {kinds or 'none'}"
        )
    try:
        key = serialization.load_pem_private_key(
            bytes(data), password=None, unsafe_skip_rsa_key_validation=not validate
        )
    except (ValueError, TypeError) as error:
        raise CertificateError(f"unreadable private key{_source(what)}: {error}") from error
    if not isinstance(key, rsa.RSAPrivateKey):
        raise CertificateError(f"{type(key).__name__}{_source(what)}: the PKI signs with RSA keys only")
    return key


def load_key_pair(
    pair: KeyPair, *, what: str = "", validate: bool = True
) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    """The certificate and key of ``pair``, refused unless the key is the certificate's.

    ``validate`` as for ``load_private_key``.
    """
    certificate = load_certificate(pair.certificate_pem, what=f"{what} certificate".strip())
    key = load_private_key(pair.key_pem, what=f"{what} key".strip(), validate=validate)
    if certificate.public_key() != key.public_key():
        raise CertificateError(f"the private key{_source(what)} is not the certificate's")
    return certificate, key


def certificate_info(data: bytes | x509.Certificate, *, what: str = "") -> CertificateInfo:
    """The parsed view of one certificate (PEM, DER, or already loaded)."""
    certificate = data if isinstance(data, x509.Certificate) else load_certificate(data, what=what)
    extensions = certificate.extensions
    try:
        dns_names = tuple(
            extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName
            )
        )
    except x509.ExtensionNotFound:
        dns_names = ()
    try:
        is_ca = extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    try:
        subject_key_id = extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest.hex()
    except x509.ExtensionNotFound:
        # Not one of ours; the identifier RFC 5280 §4.2.1.2 (1) describes, so comparisons still work.
        subject_key_id = x509.SubjectKeyIdentifier.from_public_key(certificate.public_key()).digest.hex()
    try:
        identifier = extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
        authority_key_id = identifier.hex() if identifier is not None else None
    except x509.ExtensionNotFound:
        authority_key_id = None
    return CertificateInfo(
        serial=serial_hex(certificate.serial_number),
        not_before=certificate.not_valid_before_utc.astimezone(UTC),
        not_after=certificate.not_valid_after_utc.astimezone(UTC),
        subject=certificate.subject.rfc4514_string(),
        issuer=certificate.issuer.rfc4514_string(),
        dns_names=dns_names,
        is_ca=is_ca,
        subject_key_id=subject_key_id,
        authority_key_id=authority_key_id,
        fingerprint=certificate.fingerprint(hashes.SHA256()).hex(),
    )
