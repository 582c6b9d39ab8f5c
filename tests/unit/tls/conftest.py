"""Certificates for the TLS unit tests, made once per session with openssl (local_cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from local_cluster.broker_certificates import CertificateAuthority, CertificateFiles, create_ca


@dataclass(frozen=True)
class UnitPki:
    ca: CertificateAuthority
    other_ca: CertificateAuthority
    server: CertificateFiles
    rotated: CertificateFiles
    client: CertificateFiles


@pytest.fixture(scope="session")
def unit_pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UnitPki]:
    root: Path = tmp_path_factory.mktemp("unit-pki")
    ca = create_ca(root / "ca", "unit-ca")
    other = create_ca(root / "other", "other-ca")
    yield UnitPki(
        ca=ca,
        other_ca=other,
        server=ca.issue_server("server", ["broker.test"]),
        rotated=ca.issue_server("rotated", ["broker.test"]),
        client=other.issue_client("client", "/C=DE/O=ACME/CN=sap-erp"),
    )
