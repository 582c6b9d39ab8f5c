"""The DER serial reader: OpenSSL's answer for real certificates, an error (and only that) for the rest."""

from __future__ import annotations

import contextlib
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_contracts.tls.serial import (
    MAX_SERIAL_OCTETS,
    CertificateSerialError,
    certificate_serial,
    der_serial,
    first_pem_certificate,
)
from tests.unit.tls.conftest import UnitPki


def _tlv(tag: int, content: bytes) -> bytes:
    length = len(content)
    if length < 0x80:
        return bytes([tag, length]) + content
    octets = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(octets)]) + octets + content


def _certificate(serial_content: bytes, *, version: bool = True, padding: int = 0) -> bytes:
    """A DER skeleton with the fields the reader walks (and filler where the rest would be)."""
    tbs = (
        (_tlv(0xA0, _tlv(0x02, b"\x02")) if version else b"")
        + _tlv(0x02, serial_content)
        + b"\x05\x00" * padding
    )
    return _tlv(0x30, _tlv(0x30, tbs) + _tlv(0x30, b"") + _tlv(0x03, b"\x00"))


def test_real_certificates_give_what_openssl_prints(unit_pki: UnitPki) -> None:
    for files in (unit_pki.server, unit_pki.rotated, unit_pki.client):
        printed = subprocess.run(
            ["openssl", "x509", "-in", str(files.cert), "-noout", "-serial"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"serial={certificate_serial(files.cert.read_text())}\n" == printed


def test_the_first_block_of_a_chain_is_the_leaf(unit_pki: UnitPki) -> None:
    chain = unit_pki.server.cert.read_text() + unit_pki.ca.cert.read_text()
    assert certificate_serial(chain) == certificate_serial(unit_pki.server.cert.read_text())
    assert certificate_serial("text before\n" + chain) == certificate_serial(chain)


@pytest.mark.parametrize(
    ("content", "text"),
    [
        (b"\x01", "01"),
        (b"\x00\xff", "FF"),  # DER's sign octet is not part of the value
        (b"\x00", "00"),
        (b"\xff", "-01"),
        (b"\x12\x34\x56", "123456"),
        (b"\x7f" + b"\x00" * 19, "7F" + "00" * 19),  # RFC 5280's longest
    ],
)
def test_serials_read_as_openssl_writes_them(content: bytes, text: str) -> None:
    assert der_serial(_certificate(content)) == text
    assert der_serial(_certificate(content, version=False)) == text
    assert der_serial(_certificate(content, padding=200)) == text  # long-form lengths


@pytest.mark.parametrize(
    ("der", "message"),
    [
        (b"", "input ends"),
        (b"\x30", "input ends"),
        (b"\x31\x00", "tag 0x31"),
        (b"\x30\x80\x30\x00", "indefinite length"),
        (b"\x30\x85\x00\x00\x00\x00\x01", "a length of 5 octets"),
        (b"\x30\x84\xff\xff\xff\xff", "only 0 left"),
        (b"\x30\x82\x01", "inside the length"),
        (_tlv(0x30, _tlv(0x30, _tlv(0x04, b"\x01"))), "tag 0x04"),
        (_tlv(0x30, _tlv(0x30, _tlv(0x02, b""))), "no octets"),
        (_certificate(b"\x01" * (MAX_SERIAL_OCTETS + 1)), f"more than {MAX_SERIAL_OCTETS}"),
        # The tbsCertificate claims more than the Certificate holds; the bytes after it are not read.
        (b"\x30\x04\x30\x06\x02\x01\x05" + b"\x00" * 10, "only 2 left"),
    ],
)
def test_hostile_der_is_refused_with_where_it_stopped(der: bytes, message: str) -> None:
    with pytest.raises(CertificateSerialError, match=message):
        der_serial(der)


def test_every_truncation_of_a_real_certificate_is_refused(unit_pki: UnitPki) -> None:
    der = first_pem_certificate(unit_pki.server.cert.read_text())
    for end in range(len(der)):
        with pytest.raises(CertificateSerialError):
            der_serial(der[:end])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_serial_or_the_readers_error(data: bytes) -> None:
    with contextlib.suppress(CertificateSerialError):
        assert isinstance(der_serial(data), str)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**159 - 1))
def test_any_rfc5280_serial_round_trips(value: int) -> None:
    content = value.to_bytes(value.bit_length() // 8 + 1, "big")  # with DER's sign octet
    assert int(der_serial(_certificate(content)), 16) == value


@pytest.mark.parametrize(
    ("pem", "message"),
    [
        ("", "no '-----BEGIN CERTIFICATE-----' line"),
        ("-----BEGIN CERTIFICATE-----\nMIIB", "truncated"),
        ("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n", "input ends"),
        ("x" * (1024 * 1024 + 1), "over"),
    ],
)
def test_broken_pem_is_refused(pem: str, message: str) -> None:
    with pytest.raises(CertificateSerialError, match=message):
        certificate_serial(pem)
