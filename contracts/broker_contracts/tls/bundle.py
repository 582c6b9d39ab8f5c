"""The version of a trust bundle (the set of CAs in a ``ca.crt``), and the header a broker reports it in.

While the CA's key is replaced (``broker_operator.pki.replacement``) the operator must know which
trust bundle each broker has *loaded*, not which one the Secret holds: the kubelet refreshes a
Secret volume a minute or more after the write, and the broker's listener builds its context from
the files only at its next check. So the broker names the bundle its live admin-port context was
built from in a header on every reply of the admin port (:data:`TRUST_BUNDLE_HEADER`), which the
operator's heartbeat client records per broker. A header, not a SOAP field: the heartbeat contract
is unchanged, and TLS (with what it trusts) wraps it.

:func:`bundle_version` is the one definition both sides use: the first 16 hex digits of the
SHA-256 over the sorted, distinct SHA-256 fingerprints of the bundle's certificates (their DER).
Order, duplicates and PEM spelling (line length, text between blocks) do not change it; the set of
CAs does. The broker computes it with the standard library alone (it must not import the operator,
nor need ``cryptography``); the operator's ``pki.trust.bundle_version`` checks its bundle first and
then calls this.

Not here: whether the certificates are CAs or verify anything (OpenSSL and ``pki.trust`` do).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from typing import Final

__all__ = [
    "TRUST_BUNDLE_HEADER",
    "BundleVersionError",
    "bundle_version",
    "fingerprints_version",
    "is_version",
]

TRUST_BUNDLE_HEADER: Final = "X-Broker-Trust-Bundle"
VERSION_LENGTH: Final = 16
MAX_BUNDLE_CHARS: Final = 1024 * 1024  # as reloading.MAX_FILE_BYTES: a bound on work
_BLOCK = re.compile(r"-----BEGIN CERTIFICATE-----([^-]*)-----END CERTIFICATE-----")
_SEQUENCE: Final = 0x30
_VERSION = re.compile(rf"[0-9a-f]{{{VERSION_LENGTH}}}")


class BundleVersionError(ValueError):
    """The text holds no certificate to name; says why, never the content."""


def fingerprints_version(fingerprints: Iterable[bytes]) -> str:
    """The version of the bundle whose certificates have these SHA-256 fingerprints (raw digests)."""
    return hashlib.sha256(b"".join(sorted(set(fingerprints)))).hexdigest()[:VERSION_LENGTH]


def bundle_version(pem: bytes | str) -> str:
    """The version of a PEM bundle (see the module's docstring); :class:`BundleVersionError` if it
    holds no readable certificate block."""
    text = pem.decode("ascii", errors="replace") if isinstance(pem, bytes) else pem
    if len(text) > MAX_BUNDLE_CHARS:
        raise BundleVersionError(f"a bundle of {len(text)} characters is over {MAX_BUNDLE_CHARS}")
    blocks = _BLOCK.findall(text)
    if not blocks:
        raise BundleVersionError("no '-----BEGIN CERTIFICATE-----' block")
    ders = []
    for block in blocks:
        try:  # strict: ssl.PEM_cert_to_DER_cert skips what is not base64, so garbage would get a version
            der = base64.b64decode("".join(block.split()), validate=True)
        except ValueError as error:  # binascii.Error is a ValueError
            raise BundleVersionError(f"a certificate block is not base64: {error}") from None
        if not der or der[0] != _SEQUENCE:
            raise BundleVersionError("a certificate block does not hold a DER certificate")
        ders.append(der)
    return fingerprints_version(hashlib.sha256(der).digest() for der in ders)


def is_version(text: str | None) -> bool:
    """``text`` has the shape of a version (what the operator accepts from a reply header)."""
    return text is not None and _VERSION.fullmatch(text) is not None
