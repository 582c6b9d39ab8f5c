"""The CA and the leaves it issues: the extensions and key types TLS peers (SAP's among them) need,
same-key renewal, and refusals with what was wrong."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from broker_operator.pki import (
    CA_KEY_BITS,
    LEAF_KEY_BITS,
    CertificateError,
    KeyPair,
    issue_client,
    issue_server,
    load_certificate,
    load_key_pair,
    new_ca,
    renew_ca,
    verification_error,
    verifies,
)
from tests.unit.pki.conftest import ACTIVE, NAMES, NOW, OPERATOR

Kind = TypeVar("Kind", bound=x509.ExtensionType)


def extension(pem: bytes, kind: type[Kind]) -> x509.Extension[Kind]:
    return load_certificate(pem).extensions.get_extension_for_class(kind)


def test_the_ca_is_rsa_3072_signs_leaves_only_and_with_sha256(ca: KeyPair) -> None:
    certificate, key = load_key_pair(ca)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == CA_KEY_BITS == 3072
    constraints = extension(ca.certificate_pem, x509.BasicConstraints)
    assert constraints.critical and constraints.value == x509.BasicConstraints(ca=True, path_length=0)
    usage = extension(ca.certificate_pem, x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature and not usage.value.key_encipherment
    assert certificate.signature_hash_algorithm is not None
    assert certificate.signature_hash_algorithm.name == "sha256"
    assert isinstance(certificate.signature_algorithm_parameters, padding.PKCS1v15)
    assert certificate.issuer == certificate.subject
    certificate.verify_directly_issued_by(certificate)


@pytest.mark.parametrize(("leaf", "usage"), [("server", "SERVER_AUTH"), ("client", "CLIENT_AUTH")])
def test_leaves_are_rsa_2048_with_the_tls_extensions(
    leaf: str, usage: str, request: pytest.FixtureRequest, ca: KeyPair
) -> None:
    pair: KeyPair = request.getfixturevalue(leaf)
    certificate, key = load_key_pair(pair)
    assert key.key_size == LEAF_KEY_BITS == 2048
    assert extension(pair.certificate_pem, x509.BasicConstraints).value.ca is False
    key_usage = extension(pair.certificate_pem, x509.KeyUsage)
    assert key_usage.critical
    assert key_usage.value.digital_signature and key_usage.value.key_encipherment
    assert not key_usage.value.key_cert_sign
    assert list(extension(pair.certificate_pem, x509.ExtendedKeyUsage).value) == [
        getattr(ExtendedKeyUsageOID, usage)
    ]
    assert extension(pair.certificate_pem, x509.SubjectKeyIdentifier).value.digest.hex() == (
        pair.info().subject_key_id
    )
    assert pair.info().authority_key_id == ca.info().subject_key_id
    assert certificate.signature_hash_algorithm is not None
    assert certificate.signature_hash_algorithm.name == "sha256"


def test_the_server_certificate_names_the_active_service_first(server: KeyPair, client: KeyPair) -> None:
    assert server.info().subject == f"CN={ACTIVE}"
    assert server.info().dns_names == NAMES and NAMES[0] == ACTIVE
    assert client.info().subject == f"CN={OPERATOR}" and client.info().dns_names == (OPERATOR,)


def test_leaves_verify_for_their_use_only(ca: KeyPair, server: KeyPair, client: KeyPair) -> None:
    for name in NAMES:
        assert verifies(server.certificate_pem, ca.certificate_pem, dns_name=name, now=NOW)
    assert verifies(client.certificate_pem, [ca.certificate_pem], now=NOW)
    unlisted = verification_error(server.certificate_pem, ca.certificate_pem, dns_name="orders-9", now=NOW)
    assert unlisted is not None and "subjectAltName" in unlisted
    as_client = verification_error(server.certificate_pem, ca.certificate_pem, now=NOW)
    assert as_client is not None and "EKU" in as_client
    assert not verifies(client.certificate_pem, ca.certificate_pem, dns_name=OPERATOR, now=NOW)


def test_a_leaf_of_another_ca_is_refused(ca: KeyPair, other_ca: KeyPair, server: KeyPair) -> None:
    """Same CA name, another key: the verifier goes by the key, not the name."""
    assert ca.info().subject == other_ca.info().subject
    assert not verifies(server.certificate_pem, other_ca.certificate_pem, dns_name=ACTIVE, now=NOW)
    foreign = issue_client(other_ca, OPERATOR, days=90, now=NOW)
    assert not verifies(foreign.certificate_pem, ca.certificate_pem, now=NOW)
    assert verifies(foreign.certificate_pem, ca.certificate_pem + other_ca.certificate_pem, now=NOW)


def test_validity_is_backdated_and_checked_at_now(ca: KeyPair, server: KeyPair) -> None:
    def at(moment: datetime) -> bool:
        return verifies(server.certificate_pem, ca.certificate_pem, dns_name=ACTIVE, now=moment)

    assert at(NOW - timedelta(minutes=4))  # a node whose clock runs behind
    assert not at(NOW - timedelta(minutes=6))
    assert at(NOW + timedelta(days=90) - timedelta(seconds=1))
    assert not at(NOW + timedelta(days=90, seconds=1))


def test_same_key_renewal_keeps_every_old_leaf_verifying(ca: KeyPair) -> None:
    def day(n: int) -> datetime:
        return NOW + timedelta(days=n)

    old_leaf = issue_server(ca, NAMES, days=90, now=day(3280))
    old_client = issue_client(ca, OPERATOR, days=90, now=day(3280))
    renewed = renew_ca(ca, days=3650, now=day(3285))  # 365 days before the end, as RenewalPolicy
    old, new = ca.info(), renewed.info()
    assert renewed.key_pem == ca.key_pem
    assert (new.subject, new.subject_key_id) == (old.subject, old.subject_key_id)
    assert new.serial != old.serial and new.fingerprint != old.fingerprint
    assert new.not_after == day(3285 + 3650)
    # Leaves of the old certificate verify against the renewed one alone, and a new leaf of the
    # renewed one against the old certificate alone, while that one lasts: no phase is needed.
    assert verifies(old_leaf.certificate_pem, renewed.certificate_pem, dns_name=ACTIVE, now=day(3300))
    assert verifies(old_client.certificate_pem, renewed.certificate_pem, now=day(3300))
    fresh = issue_server(renewed, NAMES, days=90, now=day(3600))
    assert verifies(fresh.certificate_pem, ca.certificate_pem, dns_name=ACTIVE, now=day(3601))
    # Once the old certificate has expired only the renewed one will do.
    assert not verifies(fresh.certificate_pem, ca.certificate_pem, dns_name=ACTIVE, now=day(3651))
    assert verifies(fresh.certificate_pem, renewed.certificate_pem, dns_name=ACTIVE, now=day(3651))


def test_a_leaf_never_outlives_its_ca(ca: KeyPair) -> None:
    near_end = NOW + timedelta(days=3650 - 10)
    leaf = issue_server(ca, NAMES, days=90, now=near_end)
    assert leaf.info().not_after == ca.info().not_after
    with pytest.raises(CertificateError, match=r"the CA expired at .*renew it"):
        issue_server(ca, NAMES, days=90, now=NOW + timedelta(days=3651))


def test_a_smaller_ca_key_can_be_chosen_and_odd_sizes_cannot() -> None:
    small = new_ca("small", days=30, now=NOW, key_bits=2048)
    assert load_key_pair(small)[1].key_size == 2048
    with pytest.raises(ValueError, match=r"key_bits \(1024\) must be one of"):
        new_ca("weak", days=30, now=NOW, key_bits=1024)


def test_refusals_say_what_was_wrong(ca: KeyPair, server: KeyPair) -> None:
    with pytest.raises(ValueError, match="must be an aware datetime"):
        issue_server(ca, NAMES, days=90, now=NOW.replace(tzinfo=None))
    with pytest.raises(ValueError, match=r"days \(0\) must be at least 1"):
        new_ca("orders CA", days=0, now=NOW)
    with pytest.raises(ValueError, match="at least one DNS name"):
        issue_server(ca, [], days=90, now=NOW)
    with pytest.raises(ValueError, match="'orders_0' is not a DNS name"):
        issue_server(ca, ["orders_0"], days=90, now=NOW)
    with pytest.raises(ValueError, match=r"'\*\.shop' is not a DNS name"):
        issue_server(ca, ["*.shop"], days=90, now=NOW)
    with pytest.raises(ValueError, match="common name"):
        new_ca("x" * 65, days=1, now=NOW)
    with pytest.raises(CertificateError, match="is not a CA: it cannot issue"):
        issue_client(server, OPERATOR, days=90, now=NOW)
    with pytest.raises(CertificateError, match="is not a CA: refusing to renew"):
        renew_ca(server, days=90, now=NOW)


def test_a_long_first_name_yields_the_commonname_to_one_that_fits(ca: KeyPair) -> None:
    long_name = ".".join(["a" * 60, "b" * 60])
    leaf = issue_server(ca, [long_name, "orders-active"], days=1, now=NOW)
    assert leaf.info().subject == "CN=orders-active"
    assert leaf.info().dns_names == (long_name, "orders-active")
    with pytest.raises(ValueError, match="no DNS name fits a commonName"):
        issue_server(ca, [long_name], days=1, now=NOW)
