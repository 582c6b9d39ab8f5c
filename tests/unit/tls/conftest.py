"""Certificates for the TLS unit tests, made once per session with openssl (local_cluster)."""

from __future__ import annotations

import ssl
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


def memory_handshake(server_side: ssl.SSLContext, client_side: ssl.SSLContext) -> ssl.SSLObject:
    """One handshake and one byte over memory BIOs, as ``broker.test``; the client's end, or the
    refusing side's ``ssl.SSLError``."""
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server = server_side.wrap_bio(server_in, server_out, server_side=True)
    client = client_side.wrap_bio(client_in, client_out, server_hostname="broker.test")
    done = {"client": False, "server": False}
    for _ in range(20):  # a TLS 1.3 handshake takes two round trips; more is a bug
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            break
    # Under TLS 1.3 the server judges the client's certificate after the client is done: read once.
    client.write(b"x")
    server_in.write(client_out.read())
    assert server.read(1) == b"x"
    return client
