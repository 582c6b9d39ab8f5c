"""The server certificate's names, and trust bundles: order-free versions, dedup, refusals."""

from __future__ import annotations

import pytest

from broker_operator.pki import (
    MAX_BUNDLE_CERTIFICATES,
    CertificateError,
    KeyPair,
    bundle_certificates,
    bundle_version,
    check_dns_names,
    load_certificates,
    server_dns_names,
    trust_bundle,
    verifies,
)
from tests.unit.pki.conftest import ACTIVE, NOW


def test_every_name_a_client_may_dial_with_the_active_service_first() -> None:
    names = server_dns_names("orders", "shop", [1, 0, 1], cluster_domain="corp.example")
    assert names == (
        "orders-active.shop.svc.corp.example",
        "orders-active.shop.svc",
        "orders-active.shop",
        "orders-active",
        "orders-brokers.shop.svc.corp.example",
        "orders-0.orders-brokers.shop.svc.corp.example",
        "orders-0.orders-brokers.shop.svc",
        "orders-0.orders-brokers.shop",
        "orders-0.orders-brokers",
        "orders-1.orders-brokers.shop.svc.corp.example",
        "orders-1.orders-brokers.shop.svc",
        "orders-1.orders-brokers.shop",
        "orders-1.orders-brokers",
    )
    assert server_dns_names("orders", "shop", [])[0] == ACTIVE


def test_names_that_cannot_be_in_a_certificate_are_refused() -> None:
    assert check_dns_names(["A.Example", "a.example", "b"]) == ("a.example", "b")
    for bad in ["", "a..b", "-a", "a-", "a.", "a b", "10.0.0.1x_", "a" * 64, ".".join(["a" * 63] * 5)]:
        with pytest.raises(ValueError, match="is not a DNS name"):
            check_dns_names([bad])
    with pytest.raises(ValueError, match=r"'cluster\.local\.' is not a DNS name"):
        server_dns_names("orders", "shop", [0], cluster_domain="cluster.local.")
    with pytest.raises(ValueError, match="never negative"):
        server_dns_names("orders", "shop", [-1])


def test_a_bundle_keeps_each_ca_once_in_order_and_its_version_ignores_order(
    ca: KeyPair, other_ca: KeyPair
) -> None:
    both = trust_bundle(ca.certificate_pem, other_ca.certificate_pem, ca.certificate_pem)
    assert [c.subject for c in load_certificates(both)] == [c.subject for c in bundle_certificates(both)]
    assert both == ca.certificate_pem + other_ca.certificate_pem
    reversed_ = trust_bundle(other_ca.certificate_pem + ca.certificate_pem)
    assert reversed_ != both and bundle_version(reversed_) == bundle_version(both)
    assert bundle_version(both) != bundle_version(trust_bundle(ca.certificate_pem))
    assert bundle_version(trust_bundle(ca.certificate_pem)) != bundle_version(
        trust_bundle(other_ca.certificate_pem)
    )
    assert len(bundle_version(both)) == 16


def test_a_bundle_holds_cas_only_and_a_handful_of_them(ca: KeyPair, server: KeyPair) -> None:
    with pytest.raises(CertificateError, match="is not a CA certificate"):
        trust_bundle(ca.certificate_pem, server.certificate_pem)
    with pytest.raises(CertificateError, match="unreadable"):
        trust_bundle(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    many = [ca.certificate_pem] * (MAX_BUNDLE_CERTIFICATES + 1)
    assert bundle_certificates(*many) == bundle_certificates(ca.certificate_pem)  # duplicates: one


def test_a_bundle_of_old_and_new_ca_trusts_leaves_of_both(
    ca: KeyPair, other_ca: KeyPair, server: KeyPair
) -> None:
    both = trust_bundle(other_ca.certificate_pem, ca.certificate_pem)
    assert verifies(server.certificate_pem, both, dns_name=ACTIVE, now=NOW)
    assert not verifies(
        server.certificate_pem, trust_bundle(other_ca.certificate_pem), dns_name=ACTIVE, now=NOW
    )
