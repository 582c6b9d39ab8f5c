"""Parsing what a Secret or a peer hands over: bounded, and every refusal says what was wrong."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from broker_contracts.tls.serial import der_serial
from broker_operator.pki import (
    MAX_BUNDLE_CERTIFICATES,
    MAX_PEM_BYTES,
    CertificateError,
    KeyPair,
    certificate_info,
    load_certificate,
    load_certificates,
    load_key_pair,
    load_private_key,
)
from tests.unit.pki.conftest import ACTIVE, NAMES, NOW


def test_the_parsed_view_of_a_server_certificate(ca: KeyPair, server: KeyPair) -> None:
    info = server.info()
    authority = ca.info()
    assert info.dns_names == NAMES
    assert info.subject == f"CN={ACTIVE}"
    assert info.issuer == "CN=orders CA" == authority.subject
    assert not info.is_ca and authority.is_ca
    assert info.not_before.tzinfo is UTC and info.not_after.tzinfo is UTC
    assert info.not_before == NOW - timedelta(minutes=5)
    assert info.not_after == NOW + timedelta(days=90)
    assert int(info.serial, 16) == load_certificate(server.certificate_pem).serial_number
    assert info.authority_key_id == authority.subject_key_id == authority.authority_key_id
    assert info.signed_by(authority)
    assert len(info.fingerprint) == 64 and info.fingerprint != authority.fingerprint


def test_der_from_a_handshake_parses_like_the_pem(server: KeyPair) -> None:
    der = load_certificate(server.certificate_pem).public_bytes(serialization.Encoding.DER)
    assert certificate_info(der) == server.info()


def test_the_key_is_never_in_a_repr(server: KeyPair) -> None:
    assert b"PRIVATE KEY" in server.key_pem
    assert "PRIVATE" not in repr(server) and "key_pem" not in repr(server)


def test_a_key_that_is_not_the_certificates_is_refused(server: KeyPair, client: KeyPair) -> None:
    assert load_key_pair(server)[0].subject.rfc4514_string() == f"CN={ACTIVE}"
    with pytest.raises(CertificateError, match="is not the certificate's"):
        load_key_pair(KeyPair(server.certificate_pem, client.key_pem), what="orders-tls")


def test_an_oversized_blob_is_refused_before_parsing(ca: KeyPair) -> None:
    padded = ca.certificate_pem + b"\n" * (MAX_PEM_BYTES + 1 - len(ca.certificate_pem))
    with pytest.raises(CertificateError, match=rf"{MAX_PEM_BYTES + 1} bytes \(ca.crt\) is over"):
        load_certificates(padded, what="ca.crt")
    with pytest.raises(CertificateError, match="over the"):
        load_private_key(b"-----BEGIN PRIVATE KEY-----\n" + b"A" * MAX_PEM_BYTES)
    # At the limit exactly it is read.
    at_limit = ca.certificate_pem + b"\n" * (MAX_PEM_BYTES - len(ca.certificate_pem))
    assert len(load_certificates(at_limit)) == 1


def test_a_bundle_of_too_many_certificates_is_refused(ca: KeyPair, other_ca: KeyPair) -> None:
    pems = [ca.certificate_pem, other_ca.certificate_pem]
    fits = b"".join(pems[i % 2] for i in range(MAX_BUNDLE_CERTIFICATES))
    assert len(load_certificates(fits)) == MAX_BUNDLE_CERTIFICATES
    with pytest.raises(CertificateError, match=f"{MAX_BUNDLE_CERTIFICATES + 1} PEM blocks"):
        load_certificates(fits + ca.certificate_pem)


@pytest.mark.parametrize(
    ("blob", "complaint"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"hello, world", "neither PEM nor a DER certificate"),
        (b"\x30\x82\x01\x00garbage", "neither PEM nor a DER certificate"),
        (b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n", "unreadable"),
        (b"-----BEGIN CERTIFICATE-----\n", "unreadable"),
    ],
)
def test_garbage_is_refused_with_what_was_wrong(blob: bytes, complaint: str) -> None:
    with pytest.raises(CertificateError, match=complaint):
        load_certificate(blob, what="tls.crt")


def test_not_bytes_is_refused() -> None:
    with pytest.raises(CertificateError, match="expected bytes"):
        load_certificate("-----BEGIN CERTIFICATE-----")  # type: ignore[arg-type]


def test_two_certificates_where_one_is_expected(ca: KeyPair, server: KeyPair) -> None:
    with pytest.raises(CertificateError, match=r"2 certificates \(tls\.crt\), expected exactly one"):
        load_certificate(server.certificate_pem + ca.certificate_pem, what="tls.crt")


def test_a_private_key_inside_a_bundle_is_refused(ca: KeyPair) -> None:
    """A bundle goes to every broker: a key pasted into it must not travel with it."""
    with pytest.raises(CertificateError, match="PRIVATE KEY block in a certificate bundle"):
        load_certificates(ca.certificate_pem + ca.key_pem, what="ca.crt")


def test_keys_other_than_one_unencrypted_rsa_key_are_refused(server: KeyPair) -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(CertificateError, match="RSA keys only"):
        load_private_key(ec_key)
    with pytest.raises(CertificateError, match="exactly one PEM private key"):
        load_private_key(server.key_pem + server.key_pem)
    with pytest.raises(CertificateError, match="exactly one PEM private key"):
        load_private_key(server.certificate_pem)
    encrypted = load_private_key(server.key_pem).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    with pytest.raises(CertificateError, match="unreadable private key"):
        load_private_key(encrypted)


def test_a_foreign_certificate_without_key_identifiers_still_has_a_subject_key_id(ca: KeyPair) -> None:
    key = load_private_key(ca.key_pem)
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "bare")])
    bare = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(NOW)
        .not_valid_after(NOW + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    info = certificate_info(bare)
    assert info.subject_key_id == ca.info().subject_key_id  # same key, identifier of RFC 5280
    assert info.authority_key_id is None and not info.is_ca and info.dns_names == ()


@pytest.mark.parametrize("serial", [0x0A1B2C, 0xA1B2C3, 0x01, 0x7F00000000000001])
def test_a_serial_reads_as_the_handshake_and_openssl_give_it(serial: int) -> None:
    """status.tls.certificates[] (this) and status.tls.served[] (a handshake's DER, der_serial) name
    one certificate the same way, leading zero octet digit included (``0a1b2c``, not ``a1b2c``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "serial")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(NOW)
        .not_valid_after(NOW + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    der = certificate.public_bytes(serialization.Encoding.DER)
    assert certificate_info(certificate).serial == der_serial(der).lower()
    assert len(certificate_info(certificate).serial) % 2 == 0
