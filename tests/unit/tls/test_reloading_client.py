"""ReloadingClientContext in process: handshakes over memory BIOs, files written as the kubelet does.

A caller takes ``.current`` for each new connection; what is checked is whether a handshake made
with it verifies the server (and which client certificate it presents) after the files changed,
and that a context once handed out never changes.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

import pytest

from broker_contracts.tls import (
    TLS_CA_FILE,
    ClientCertificates,
    ReloadingClientContext,
    TlsFilesError,
    bundle_version,
    certificate_serial,
    server_context,
)
from broker_contracts.tls.reloading_client import _Calling
from local_cluster.broker_certificates import write_secret_volume
from tests.unit.tls.conftest import UnitPki, memory_handshake

LOGGER = "broker_contracts.tls.reloading_client"


@pytest.fixture
def server(unit_pki: UnitPki) -> ssl.SSLContext:
    """A server whose certificate (``broker.test``) is of ``unit_pki.ca``."""
    return server_context(unit_pki.server.cert, unit_pki.server.key)


def _bundle(*cas: Path) -> bytes:
    return b"".join(path.read_bytes() for path in cas)


def test_a_bundle_swapped_in_like_the_kubelet_does_is_used_by_new_connections(
    unit_pki: UnitPki, tmp_path: Path, server: ssl.SSLContext
) -> None:
    volume = tmp_path / "upstream-ca"
    write_secret_volume(volume, {TLS_CA_FILE: _bundle(unit_pki.other_ca.cert)})  # not the server's CA
    client = ReloadingClientContext("upstream", ca_file=volume / TLS_CA_FILE)
    first = client.current
    with pytest.raises(ssl.SSLCertVerificationError):
        memory_handshake(server, first)
    assert client.check() is False
    assert client.current is first
    # The server's CA beside the old one, as during a CA replacement: one ..data swap.
    write_secret_volume(volume, {TLS_CA_FILE: _bundle(unit_pki.other_ca.cert, unit_pki.ca.cert)})
    assert client.check() is True
    assert (client.reloads, client.failures) == (1, 0)
    assert client.trust_bundle_version == bundle_version(_bundle(unit_pki.other_ca.cert, unit_pki.ca.cert))
    memory_handshake(server, client.current)
    with pytest.raises(ssl.SSLCertVerificationError):  # the context handed out before never changed
        memory_handshake(server, first)
    assert client.check() is False
    assert client.reloads == 1


def test_a_file_replaced_atomically_is_taken_and_the_same_contents_are_not_rebuilt(
    unit_pki: UnitPki, tmp_path: Path, server: ssl.SSLContext
) -> None:
    path, staging = tmp_path / "ca.pem", tmp_path / "ca.pem.tmp"
    path.write_bytes(_bundle(unit_pki.other_ca.cert))
    builds: list[_Calling] = []

    class CountingBuilds(ReloadingClientContext):  # the real context, counting what it builds
        def _make(self, contents: dict[Path, bytes]) -> _Calling:
            builds.append(made := super()._make(contents))
            return made

    client = CountingBuilds("upstream", ca_file=path)
    first = client.current
    # The same contents under a new inode and another mtime: nothing to build.
    staging.write_bytes(_bundle(unit_pki.other_ca.cert))
    os.utime(staging, (1, 1))
    os.replace(staging, path)
    for _ in range(3):
        assert client.check() is False
    assert (len(builds), client.reloads, client.current) == (1, 0, first)
    staging.write_bytes(_bundle(unit_pki.ca.cert))
    os.replace(staging, path)  # rename(2): a reader sees the old file or the new one
    assert client.check() is True
    assert len(builds) == 2 and client.current is builds[1].context
    memory_handshake(server, client.current)
    assert client.check() is False and len(builds) == 2


def test_files_that_do_not_load_keep_the_context_in_use_and_warn_once_each(
    unit_pki: UnitPki, tmp_path: Path, server: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    volume = tmp_path / "upstream-ca"
    write_secret_volume(volume, {TLS_CA_FILE: _bundle(unit_pki.ca.cert)})
    ca_file = volume / TLS_CA_FILE
    client = ReloadingClientContext("upstream", ca_file=ca_file)
    first, version = client.current, client.trust_bundle_version
    good = ca_file.read_bytes()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    broken = {
        "half": good[: len(good) // 2],
        "garbage": b"\x00\xff garbage " * 50,
        "a leaf": unit_pki.server.cert.read_bytes(),  # whole PEM, but no CA: would verify nothing
        "empty": b"",
    }
    for content in broken.values():
        ca_file.write_bytes(content)  # in place, as a careless copy would
        for _ in range(3):
            assert client.check() is False
        assert client.current is first
        memory_handshake(server, client.current)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == len(broken), warnings
    assert "does not hold whole PEM blocks" in warnings[0]
    assert "holds no CA certificate" in warnings[2]
    assert all(f"new connections still verify with CA bundle {version}" in text for text in warnings)
    assert (client.failures, client.reloads) == (len(broken), 0)
    # Gone: one warning however often it is looked at.
    ca_file.unlink()
    for _ in range(3):
        assert client.check() is False
    assert len(caplog.records) == len(broken) + 1
    assert "cannot be read" in caplog.records[-1].getMessage()
    # Mended: taken.
    write_secret_volume(volume, {TLS_CA_FILE: _bundle(unit_pki.other_ca.cert, unit_pki.ca.cert)})
    assert client.check() is True
    assert client.current is not first
    memory_handshake(server, client.current)


def test_a_renewed_client_certificate_is_presented_on_new_connections(
    unit_pki: UnitPki, tmp_path: Path
) -> None:
    # A server that takes client certificates of other_ca only (unit_pki.client's CA).
    requiring = server_context(
        unit_pki.server.cert,
        unit_pki.server.key,
        client_certificates=ClientCertificates.REQUIRED,
        client_ca_file=unit_pki.other_ca.cert,
    )
    volume = tmp_path / "client-tls"
    write_secret_volume(
        volume, {"tls.crt": unit_pki.rotated.cert.read_bytes(), "tls.key": unit_pki.rotated.key.read_bytes()}
    )
    client = ReloadingClientContext(
        "calls to brokers",
        ca_file=unit_pki.ca.cert,
        cert_file=volume / "tls.crt",
        key_file=volume / "tls.key",
    )
    assert client.certificate_serial == certificate_serial(unit_pki.rotated.cert.read_text())
    with pytest.raises(ssl.SSLError):  # not of the CA the server takes
        memory_handshake(requiring, client.current)
    write_secret_volume(
        volume, {"tls.crt": unit_pki.client.cert.read_bytes(), "tls.key": unit_pki.client.key.read_bytes()}
    )
    assert client.check() is True
    assert client.certificate_serial == certificate_serial(unit_pki.client.cert.read_text())
    memory_handshake(requiring, client.current)


def test_at_start_files_that_do_not_load_are_an_error_naming_the_file(
    unit_pki: UnitPki, tmp_path: Path
) -> None:
    with pytest.raises(TlsFilesError, match=f"{unit_pki.server.cert} holds no CA certificate"):
        ReloadingClientContext("upstream", ca_file=unit_pki.server.cert)
    with pytest.raises(TlsFilesError, match="the key is not the certificate's"):
        ReloadingClientContext("x", cert_file=unit_pki.client.cert, key_file=unit_pki.server.key)
    with pytest.raises(TlsFilesError, match=r"missing\.pem cannot be read"):
        ReloadingClientContext("upstream", ca_file=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="needs both"):
        ReloadingClientContext("x", cert_file=unit_pki.client.cert)
    # No file at all: the system's store, which check() never replaces.
    system = ReloadingClientContext("upstream")
    assert (system.check(), system.trust_bundle_version, system.certificate_serial) == (False, None, None)
