"""The BrokerCluster's certificate authority: make a CA, renew it with the same key, issue leaves.

One CA per BrokerCluster signs two leaves: the brokers' server certificate (every name a client
may dial: the pods, the headless and the ``-active`` Services, see ``names``) and the operator's
client certificate (mutual TLS on the brokers' admin port). Its key stays in a Secret only the
operator reads.

Key types, and why:

- Leaves are RSA-2048. SAP's ABAP and PI/PO stacks may lack ECDSA and TLS 1.3, and RSA-2048 is
  what STRUST, the PI keystore and their TLS 1.2 handshakes reliably accept. keyUsage is
  digitalSignature + keyEncipherment, so the TLS 1.2 RSA key-exchange suites older stacks offer
  work too. A leaf lives ``days`` (90 by default), so its key's strength needs to hold for months.
- The CA is RSA-3072 (``CA_KEY_BITS``): it lives ten years, and NIST SP 800-57 gives RSA-2048
  112-bit strength only through 2030, RSA-3072 128 bits beyond. A trusted CA in STRUST or a Java
  keystore is only ever used to verify a signature, which SAP's CommonCryptoLib and Java do for
  RSA up to 4096 bits; it never has to be a key SAP itself generates or uses. A site whose stack
  still refuses it can make its CA with ``key_bits=2048``.
- Signatures are SHA-256 with PKCS#1 v1.5, the one every TLS 1.2 stack verifies.
- ``not_before`` is backdated by ``CLOCK_SKEW``: a node whose clock runs a little behind the
  operator's must not see a fresh certificate as not yet valid.
- A leaf never outlives its CA certificate: ``not_after`` is the earlier of ``now + days`` and the
  CA's. (With same-key renewal it would still verify under the renewed CA, but a verifier that
  holds only the old CA certificate would refuse it, and ``renewal`` reissues such a leaf anyway.)

``renew_ca`` keeps the key, the subject and so the subject key identifier: every leaf the CA
signed before verifies against the renewed certificate, and a client that has either certificate
trusts the new leaves. Replacing the key is a different act (``replacement``).

What it does not do: decide when to issue (``renewal``), verify (``trust``), store anything, or
read a clock (``now`` is passed in, an aware datetime). Keys come from the OS's random source.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker_operator.pki.material import CertificateError, KeyPair, load_key_pair
from broker_operator.pki.names import check_dns_names

__all__ = [
    "CA_KEY_BITS",
    "CLOCK_SKEW",
    "LEAF_KEY_BITS",
    "issue_client",
    "issue_server",
    "new_ca",
    "renew_ca",
]

CA_KEY_BITS: Final = 3072
CA_KEY_SIZES: Final = (2048, 3072, 4096)
LEAF_KEY_BITS: Final = 2048
CLOCK_SKEW: Final = timedelta(minutes=5)
_COMMON_NAME_MAX: Final = 64  # RFC 5280's upper bound on a commonName


def _key_usage(*, certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not certificates,
        content_commitment=False,
        key_encipherment=not certificates,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=certificates,
        crl_sign=certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _validity(now: datetime, days: int) -> tuple[datetime, datetime]:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now ({now.isoformat()}) must be an aware datetime (UTC)")
    if days < 1:
        raise ValueError(f"days ({days}) must be at least 1")
    start = now.replace(microsecond=0)  # X.509 times have whole seconds
    return start - CLOCK_SKEW, start + timedelta(days=days)


def _common_name(text: str) -> x509.Name:
    if not 1 <= len(text) <= _COMMON_NAME_MAX:
        raise ValueError(f"common name {text!r} must be 1 to {_COMMON_NAME_MAX} characters")
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _pem(certificate: x509.Certificate, key: rsa.RSAPrivateKey) -> KeyPair:
    return KeyPair(
        certificate_pem=certificate.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _sign_ca(subject: x509.Name, key: rsa.RSAPrivateKey, days: int, now: datetime) -> KeyPair:
    not_before, not_after = _validity(now, days)
    identifier = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        # pathlen 0: this CA signs leaves only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(certificates=True), critical=True)
        .add_extension(identifier, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(identifier), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return _pem(certificate, key)


def new_ca(common_name: str, *, days: int, now: datetime, key_bits: int = CA_KEY_BITS) -> KeyPair:
    """A self-signed CA with a fresh RSA key, valid from ``now`` (less the skew) for ``days``."""
    if key_bits not in CA_KEY_SIZES:
        raise ValueError(f"key_bits ({key_bits}) must be one of {CA_KEY_SIZES}")
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_bits)
    return _sign_ca(_common_name(common_name), key, days, now)


def renew_ca(ca: KeyPair, *, days: int, now: datetime) -> KeyPair:
    """``ca`` again, with the same key and subject, a new serial, valid from ``now`` for ``days``."""
    certificate, key = load_key_pair(ca, what="CA")
    if not _is_ca(certificate):
        raise CertificateError(
            f"{certificate.subject.rfc4514_string()} is not a CA: refusing to renew it as one"
        )
    return _sign_ca(certificate.subject, key, days, now)


def issue_server(ca: KeyPair, dns_names: Iterable[str], *, days: int, now: datetime) -> KeyPair:
    """The brokers' server certificate for ``dns_names`` (serverAuth), signed by ``ca``.

    The commonName is the first name that fits in 64 characters (put the name clients dial
    first): older TLS clients, some SAP kernels among them, still compare the commonName.
    """
    names = check_dns_names(dns_names)
    if not names:
        raise ValueError("a server certificate needs at least one DNS name")
    common = next((name for name in names if len(name) <= _COMMON_NAME_MAX), min(names, key=len))
    if len(common) > _COMMON_NAME_MAX:
        raise ValueError(f"no DNS name fits a commonName (64 characters at most): {', '.join(names)}")
    return _issue_leaf(ca, _common_name(common), names, ExtendedKeyUsageOID.SERVER_AUTH, days=days, now=now)


def issue_client(ca: KeyPair, common_name: str, *, days: int, now: datetime) -> KeyPair:
    """The operator's client certificate (clientAuth), signed by ``ca``.

    ``common_name`` is a DNS-shaped identity (``broker-failover-operator.<namespace>.svc``, say),
    put in the commonName and in the subjectAltName: RFC 5280 verifiers, cryptography's
    ``ClientVerifier`` among them, require a client certificate to carry a subjectAltName.
    """
    names = check_dns_names([common_name])
    return _issue_leaf(
        ca, _common_name(common_name), names, ExtendedKeyUsageOID.CLIENT_AUTH, days=days, now=now
    )


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        return certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _issue_leaf(
    ca: KeyPair,
    subject: x509.Name,
    dns_names: tuple[str, ...],
    usage: x509.ObjectIdentifier,
    *,
    days: int,
    now: datetime,
) -> KeyPair:
    ca_certificate, ca_key = load_key_pair(ca, what="CA")
    if not _is_ca(ca_certificate):
        raise CertificateError(f"{ca_certificate.subject.rfc4514_string()} is not a CA: it cannot issue")
    not_before, not_after = _validity(now, days)
    if ca_certificate.not_valid_after_utc <= now:
        raise CertificateError(
            f"the CA expired at {ca_certificate.not_valid_after_utc.isoformat()}: renew it (renew_ca) first"
        )
    key = rsa.generate_private_key(public_exponent=65537, key_size=LEAF_KEY_BITS)
    try:
        ca_identifier = ca_certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:  # a CA not made here: the identifier RFC 5280 describes
        ca_identifier = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(not_before, ca_certificate.not_valid_before_utc))
        .not_valid_after(min(not_after, ca_certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in dns_names]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_identifier), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _pem(certificate, key)
