"""ReloadingServerContext in process: handshakes over memory BIOs, files written as the kubelet does.

A handshake is driven by hand between the listener's context (``.context``, as a server would
hold it) and a client, so what is checked is what a new connection is served: the certificate
(by its serial) and whose client certificates are trusted.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest

from broker_contracts.tls import (
    ClientCertificates,
    ReloadingServerContext,
    TlsDirectory,
    TlsFilesError,
    certificate_serial,
    client_context,
    server_context,
)
from broker_contracts.tls.reloading import MAX_FILE_BYTES
from local_cluster.broker_certificates import CertificateFiles, tls_secret, write_secret_volume
from tests.unit.tls.conftest import UnitPki, memory_handshake


def _handshake(server_side: ssl.SSLContext, client_side: ssl.SSLContext) -> str:
    """The serial the client is served, or the handshake's ``ssl.SSLError``."""
    certificate = memory_handshake(server_side, client_side).getpeercert()
    assert certificate
    return str(certificate["serialNumber"])


def _listener(
    directory: TlsDirectory, mode: ClientCertificates = ClientCertificates.REQUIRED
) -> ReloadingServerContext:
    return ReloadingServerContext(
        "admin port 1",
        lambda: server_context(
            directory.cert, directory.key, client_certificates=mode, client_ca_file=directory.ca
        ),
        [directory.cert, directory.key, directory.ca],
        directory.cert,
    )


def _write(directory: Path, server: CertificateFiles, trust: list[Path]) -> TlsDirectory:
    write_secret_volume(directory, tls_secret(server, trust))
    return TlsDirectory(directory)


def _serial(files: CertificateFiles) -> str:
    return certificate_serial(files.cert.read_text())


def test_a_rotation_is_served_to_new_handshakes_and_the_trust_follows_the_bundle(
    unit_pki: UnitPki, tmp_path: Path
) -> None:
    directory = _write(tmp_path / "tls", unit_pki.server, [unit_pki.ca.cert])
    listener = _listener(directory)
    client = client_context(
        ca_file=unit_pki.ca.cert, cert_file=unit_pki.client.cert, key_file=unit_pki.client.key
    )
    # The client's certificate is of the other CA, which the bundle does not hold yet.
    with pytest.raises(ssl.SSLError):
        _handshake(listener.context, client)
    assert listener.check() is False  # nothing changed
    _write(directory.path, unit_pki.rotated, [unit_pki.ca.cert, unit_pki.other_ca.cert])
    assert listener.check() is True
    assert (listener.serial, listener.reloads) == (_serial(unit_pki.rotated), 1)
    assert _handshake(listener.context, client) == _serial(unit_pki.rotated)
    assert listener.check() is False
    # And back: the other CA leaves the bundle, and its client certificate is refused again.
    _write(directory.path, unit_pki.server, [unit_pki.ca.cert])
    assert listener.check() is True
    with pytest.raises(ssl.SSLError):
        _handshake(listener.context, client)
    anonymous = client_context(ca_file=unit_pki.ca.cert)
    optional = _listener(directory, ClientCertificates.OPTIONAL)
    assert _handshake(optional.context, anonymous) == _serial(unit_pki.server)


def test_files_that_do_not_load_keep_the_served_context_and_warn_once_each(
    unit_pki: UnitPki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = _write(tmp_path / "tls", unit_pki.server, [unit_pki.ca.cert])
    listener = _listener(directory, ClientCertificates.OPTIONAL)
    anonymous = client_context(ca_file=unit_pki.ca.cert)
    good = directory.cert.read_bytes()
    caplog.set_level(logging.WARNING, logger="broker_contracts.tls.reloading")
    broken = {
        "half": good[: len(good) // 2],
        "garbage": b"\x00\xff garbage " * 50,
        "foreign key": unit_pki.rotated.cert.read_bytes(),  # a whole certificate, not this key's
        "empty": b"",
    }
    for content in broken.values():
        directory.cert.write_bytes(content)  # in place, as a careless copy would
        for _ in range(3):
            assert listener.check() is False
        assert _handshake(listener.context, anonymous) == _serial(unit_pki.server)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == len(broken), warnings
    assert "does not hold whole PEM blocks" in warnings[0]
    assert "the key is not the certificate's" in warnings[2]
    assert all(f"still serving certificate serial {_serial(unit_pki.server)}" in text for text in warnings)
    assert (listener.failures, listener.reloads) == (len(broken), 0)
    # A missing file: one warning however often it is looked at.
    directory.key.unlink()
    for _ in range(3):
        assert listener.check() is False
    assert len(caplog.records) == len(broken) + 1
    assert "tls.key cannot be read" in caplog.records[-1].getMessage()
    # Mended: served.
    _write(directory.path, unit_pki.rotated, [unit_pki.ca.cert])
    assert listener.check() is True
    assert _handshake(listener.context, anonymous) == _serial(unit_pki.rotated)


def test_files_that_change_while_they_load_are_read_again_not_swapped_nor_warned_about(
    unit_pki: UnitPki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = _write(tmp_path / "tls", unit_pki.server, [unit_pki.ca.cert])
    rewrites = [
        unit_pki.server
    ]  # each build rewrites the files with the next of these (the first: no change)

    def build() -> ssl.SSLContext:
        context = server_context(directory.cert, directory.key)
        if rewrites:
            _write(directory.path, rewrites.pop(), [unit_pki.ca.cert])
        return context

    listener = ReloadingServerContext("main port 1", build, [directory.cert, directory.key], directory.cert)
    _write(directory.path, unit_pki.rotated, [unit_pki.ca.cert])
    rewrites.append(unit_pki.client)  # any certificate with its key serves
    assert listener.check() is False  # loaded the rotated files, but they changed meanwhile
    assert listener.serial == _serial(unit_pki.server) and not caplog.records
    assert listener.check() is True  # the files as they are now
    assert listener.serial == _serial(unit_pki.client)


def test_a_first_load_that_fails_is_an_error_naming_the_file(unit_pki: UnitPki, tmp_path: Path) -> None:
    directory = _write(tmp_path / "tls", unit_pki.server, [unit_pki.ca.cert])
    directory.key.write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    with pytest.raises(TlsFilesError, match=f"tls.key is larger than {MAX_FILE_BYTES} bytes"):
        _listener(directory)
    directory.key.write_bytes(unit_pki.rotated.key.read_bytes())
    with pytest.raises(TlsFilesError, match="the key is not the certificate's"):
        _listener(directory)


def test_a_trust_bundle_without_a_ca_keeps_the_served_context_and_says_why(
    unit_pki: UnitPki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = _write(tmp_path / "tls", unit_pki.server, [unit_pki.ca.cert])
    listener = _listener(directory)
    caplog.set_level(logging.WARNING, logger="broker_contracts.tls.reloading")
    # contexts.py raises this one itself: an ssl.SSLError without OpenSSL's reason attribute.
    _write(directory.path, unit_pki.rotated, [unit_pki.server.cert])  # a leaf is no CA
    assert listener.check() is False
    assert (listener.serial, listener.failures, listener.reloads) == (_serial(unit_pki.server), 1, 0)
    (warning,) = [record.getMessage() for record in caplog.records]
    assert f"{directory.ca} holds no CA certificate" in warning and "('" not in warning
