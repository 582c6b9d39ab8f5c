"""A trust bundle's version: one definition, the broker's (standard library) and the operator's
(``pki.trust``, after its checks) agree; and a listener reports the bundle of its live context."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_contracts.tls import (
    BundleVersionError,
    ClientCertificates,
    ReloadingServerContext,
    TlsDirectory,
    bundle_version,
    server_context,
)
from broker_contracts.tls.bundle import is_version
from broker_operator.pki import trust
from local_cluster.broker_certificates import tls_secret, write_secret_volume
from tests.unit.tls.conftest import UnitPki


def test_the_broker_and_the_operator_name_a_bundle_alike(unit_pki: UnitPki) -> None:
    one = unit_pki.ca.cert.read_bytes()
    other = unit_pki.other_ca.cert.read_bytes()
    both, reversed_ = one + other, other + b"\n# a comment between blocks\n" + one
    for pem in (one, both, reversed_, both + one):
        assert bundle_version(pem) == trust.bundle_version(pem)
        assert is_version(bundle_version(pem))
    assert bundle_version(both) == bundle_version(reversed_) == bundle_version(both + one)
    assert len({bundle_version(one), bundle_version(other), bundle_version(both)}) == 3


@pytest.mark.parametrize(
    "text", [b"", b"garbage", b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n"]
)
def test_no_certificate_no_version(text: bytes) -> None:
    with pytest.raises(BundleVersionError):
        bundle_version(text)


def test_a_listener_names_the_bundle_its_live_context_trusts(unit_pki: UnitPki, tmp_path: Path) -> None:
    directory = TlsDirectory(tmp_path / "tls")
    write_secret_volume(directory.path, tls_secret(unit_pki.server, [unit_pki.ca.cert]))
    listener = ReloadingServerContext(
        "admin port 1",
        lambda: server_context(
            directory.cert,
            directory.key,
            client_certificates=ClientCertificates.REQUIRED,
            client_ca_file=directory.ca,
        ),
        [directory.cert, directory.key, directory.ca],
        directory.cert,
        trust_file=directory.ca,
    )
    assert listener.trust_bundle_version == bundle_version(unit_pki.ca.cert.read_bytes())
    # The Secret gains the second CA: named once the context built from it is swapped in.
    write_secret_volume(
        directory.path, tls_secret(unit_pki.server, [unit_pki.ca.cert, unit_pki.other_ca.cert])
    )
    assert listener.check()
    both = unit_pki.ca.cert.read_bytes() + unit_pki.other_ca.cert.read_bytes()
    assert listener.trust_bundle_version == bundle_version(both)
    # A bundle that does not load keeps the version of the context still in use.
    (directory.path / "..data" / "ca.crt").write_bytes(
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    assert not listener.check()
    assert listener.trust_bundle_version == bundle_version(both)
