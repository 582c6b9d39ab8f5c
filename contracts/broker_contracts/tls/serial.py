"""The serial number of a PEM certificate, read with the standard library alone.

The broker logs and exports the serial of the certificate it serves, so that the operator (and
a person) can tell which certificate a pod has picked up after a rotation. The standard library
decodes a certificate only from a live connection (``getpeercert``) or through the private
``ssl._ssl._test_decode_cert``, and a throwaway context's ``get_ca_certs`` lists CA certificates
only, never a leaf. So the serial is read here, by a bounded walk over the DER that
``ssl.PEM_cert_to_DER_cert`` gives: ``Certificate ::= SEQUENCE { tbsCertificate SEQUENCE {
[0] version OPTIONAL, serialNumber INTEGER, ... } ... }`` (RFC 5280, 4.1). Three tags, one
optional: small enough to check by reading, and nothing else of the certificate is needed.

Every length is checked against what is left of the input before it is used, long-form lengths
have at most four octets, the indefinite form (not DER) and a serial longer than
:data:`MAX_SERIAL_OCTETS` are refused: hostile input gets :class:`CertificateSerialError`, never
an ``IndexError`` or a huge allocation.

The text form is OpenSSL's (``openssl x509 -serial``, ``getpeercert()["serialNumber"]``): the
magnitude's octets in upper-case hex, two digits each, so the three can be compared as strings.

Not here: checking the signature or anything else; the TLS stack does that when it loads it.
"""

from __future__ import annotations

import ssl
from typing import Final

PEM_BEGIN: Final = "-----BEGIN CERTIFICATE-----"
PEM_END: Final = "-----END CERTIFICATE-----"
# RFC 5280 allows 20 octets (21 with DER's sign octet); some CAs overstep it, so the bound is
# looser. It is a bound on work, not a conformance check.
MAX_SERIAL_OCTETS: Final = 64
MAX_PEM_CHARS: Final = 1024 * 1024

_SEQUENCE: Final = 0x30
_INTEGER: Final = 0x02
_VERSION: Final = 0xA0  # [0] EXPLICIT, constructed


class CertificateSerialError(ValueError):
    """The input is not a certificate whose serial can be read; the text says where it stopped."""


def first_pem_certificate(pem: str) -> bytes:
    """The DER of the first ``CERTIFICATE`` block in ``pem`` (a leaf before its chain)."""
    if len(pem) > MAX_PEM_CHARS:
        raise CertificateSerialError(f"PEM text of {len(pem)} characters is over {MAX_PEM_CHARS}")
    start = pem.find(PEM_BEGIN)
    if start < 0:
        raise CertificateSerialError(f"no '{PEM_BEGIN}' line")
    end = pem.find(PEM_END, start)
    if end < 0:
        raise CertificateSerialError(f"no '{PEM_END}' line after '{PEM_BEGIN}' (a truncated file?)")
    try:
        return ssl.PEM_cert_to_DER_cert(pem[start : end + len(PEM_END)])
    except ValueError as error:  # binascii.Error is a ValueError
        raise CertificateSerialError(f"the PEM block is not base64: {error}") from None


def _header(der: bytes, offset: int, expected_tag: int, what: str) -> tuple[int, int]:
    """``(start of the content, its length)`` of the element at ``offset``, checked to fit."""
    if offset + 2 > len(der):
        raise CertificateSerialError(f"{what}: input ends at octet {offset}")
    tag, first = der[offset], der[offset + 1]
    if tag != expected_tag:
        raise CertificateSerialError(
            f"{what}: tag 0x{tag:02x} at octet {offset}, expected 0x{expected_tag:02x}"
        )
    position = offset + 2
    if first < 0x80:
        length = first
    elif first == 0x80:
        raise CertificateSerialError(f"{what}: indefinite length at octet {offset} (not DER)")
    else:
        count = first & 0x7F
        if count > 4:
            raise CertificateSerialError(f"{what}: a length of {count} octets at octet {offset}")
        if position + count > len(der):
            raise CertificateSerialError(f"{what}: input ends inside the length at octet {offset}")
        length = int.from_bytes(der[position : position + count], "big")
        position += count
    if position + length > len(der):
        raise CertificateSerialError(
            f"{what}: {length} octets of content at octet {position}, only {len(der) - position} left"
        )
    return position, length


def der_serial(der: bytes) -> str:
    """The serial of a DER certificate, as OpenSSL prints it (upper-case hex, ``-`` if negative)."""
    certificate, certificate_length = _header(der, 0, _SEQUENCE, "Certificate")
    body = der[: certificate + certificate_length]  # nothing past the certificate is read
    tbs, _ = _header(body, certificate, _SEQUENCE, "tbsCertificate")
    position = tbs
    if position < len(body) and body[position] == _VERSION:
        version, version_length = _header(body, position, _VERSION, "version")
        position = version + version_length
    serial, serial_length = _header(body, position, _INTEGER, "serialNumber")
    if serial_length == 0:
        raise CertificateSerialError("serialNumber: an INTEGER of no octets")
    if serial_length > MAX_SERIAL_OCTETS:
        raise CertificateSerialError(f"serialNumber: {serial_length} octets, more than {MAX_SERIAL_OCTETS}")
    value = int.from_bytes(body[serial : serial + serial_length], "big", signed=True)
    return serial_hex(value).upper()


def serial_hex(value: int) -> str:
    """A serial number as OpenSSL prints it, lower-cased: the magnitude's octets, two hex digits
    each (so ``0a1b``, never ``a1b``), ``-`` before a negative one. The one text form of a serial
    everywhere: status.tls, ``kubectl broker ca``, the served serials of handshakes."""
    magnitude = abs(value)
    text = magnitude.to_bytes(max(1, (magnitude.bit_length() + 7) // 8), "big").hex()
    return f"-{text}" if value < 0 else text


def certificate_serial(pem: str) -> str:
    """The serial of the first certificate in ``pem`` (what a server with this chain serves)."""
    return der_serial(first_pem_certificate(pem))
