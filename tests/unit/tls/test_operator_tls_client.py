"""The operator's client TLS context (``broker_operator.tls_client``) and what its failures show.

The context: built from a ``ClientTlsMaterial`` with the contracts' floor, trusting the bundle
alone, rebuilt only for a new material version or after ``fresh_handshake_seconds``, and the key
never left on disk. The failures: a heartbeat to an in-process TLS server on loopback that does
not verify (wrong CA), or that refuses the operator's certificate, is a ``tls_error``, and neither
its text nor any log record holds a byte of the key or the certificates.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker_contracts.tls import MINIMUM_VERSION, ClientCertificates, server_context
from broker_operator.core import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatError
from broker_operator.tls_client import CATCH_UP_SECONDS, TlsClient, TlsMaterialError, client_ssl_context
from broker_operator.tls_material import ClientTlsMaterial
from local_cluster.broker_certificates import CertificateFiles
from tests.unit.tls.conftest import UnitPki

SERVER_NAME = "broker.test"  # what unit_pki's server certificates carry


def material(
    pki: UnitPki, client: CertificateFiles | None = None, trust: Path | None = None
) -> ClientTlsMaterial:
    client = client or pki.client
    return ClientTlsMaterial(
        certificate_pem=client.cert.read_bytes(),
        key_pem=client.key.read_bytes(),
        trust_bundle_pem=(trust or pki.ca.cert).read_bytes(),
    )


def secret_fragments(*materials: ClientTlsMaterial) -> list[str]:
    """Every base64 line of the material's PEM blocks: none may appear in a message or a log."""
    lines = []
    for each in materials:
        for pem in (each.certificate_pem, each.key_pem, each.trust_bundle_pem):
            lines += [line for line in pem.decode().splitlines() if line and not line.startswith("-----")]
    return lines


def test_the_context_follows_the_contracts_and_trusts_the_bundle_alone(unit_pki: UnitPki) -> None:
    context = client_ssl_context(material(unit_pki))
    assert context.minimum_version == MINIMUM_VERSION
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    # The bundle's one CA, not the system's store: a public CA has no say over which broker is trusted.
    assert [ca["subject"] for ca in context.get_ca_certs()] == [((("commonName", "unit-ca"),),)]


def test_a_new_context_only_for_a_new_version_or_after_the_fresh_handshake_period(unit_pki: UnitPki) -> None:
    now = [0.0]
    client = TlsClient(material(unit_pki), fresh_handshake_seconds=300, clock=lambda: now[0])
    first = client.context()
    assert client.update(material(unit_pki)) is False  # same bytes, same version
    assert client.context() is first
    now[0] = 299.0
    assert client.context() is first
    now[0] = 300.0
    periodic = client.context()
    assert periodic is not first and client.version == material(unit_pki).version
    rotated = material(unit_pki, trust=unit_pki.other_ca.cert)
    assert client.update(rotated) is True
    assert client.context() is not periodic and client.version == rotated.version
    assert client.contexts_built == 3


def test_while_a_broker_serves_an_old_serial_contexts_renew_every_ten_seconds(unit_pki: UnitPki) -> None:
    """The controller says which serial the Secret holds; a broker whose last handshake served
    another one gets a fresh handshake every CATCH_UP_SECONDS, not every 5 minutes, until it
    serves it; a broker not handshaken for two periods (gone) is no reason to hurry."""
    now = [0.0]
    client = TlsClient(material(unit_pki), fresh_handshake_seconds=300, clock=lambda: now[0])
    first = client.context()
    # What the real handshake hook reports (test_served_status drives it with real handshakes).
    client._handshake_done("orders-0.test", "0a1b")
    client._handshake_done("orders-1.test", "0a1b")
    client.expect_serving("a1b")  # the same serial, another spelling: nothing to catch up
    now[0] = CATCH_UP_SECONDS
    assert client.context() is first
    client.expect_serving("0c0d")  # renewed: the brokers still serve 0a1b on kept-alive connections
    now[0] = CATCH_UP_SECONDS - 0.5  # not yet ten seconds since the context was built
    assert client.context() is first
    now[0] = CATCH_UP_SECONDS
    second = client.context()
    assert second is not first
    client._handshake_done("orders-0.test", "0c0d")  # one has reloaded, the other not yet
    now[0] = 2 * CATCH_UP_SECONDS
    third = client.context()
    assert third is not second
    client._handshake_done("orders-1.test", "0C0D")  # both serve it: back to the 5-minute period
    now[0] = 3 * CATCH_UP_SECONDS
    assert client.context() is third
    # A broker that served the old serial once and was never heard of again (scaled away) stops
    # counting two periods after its last handshake.
    client._handshake_done("orders-2.test", "0a1b")
    now[0] = 4 * CATCH_UP_SECONDS
    fourth = client.context()
    assert fourth is not third
    now[0] = 4 * CATCH_UP_SECONDS + 600.0  # orders-0 and -1 would re-handshake here in real life
    client._handshake_done("orders-0.test", "0c0d")
    client._handshake_done("orders-1.test", "0c0d")
    fifth = client.context()  # the 5-minute period
    now[0] += CATCH_UP_SECONDS
    assert client.context() is fifth  # orders-2's record is older than two periods


def test_a_material_that_does_not_load_keeps_the_current_context(
    unit_pki: UnitPki, caplog: pytest.LogCaptureFixture
) -> None:
    client = TlsClient(material(unit_pki))
    current = client.context()
    # The server's certificate with the client's key: OpenSSL refuses the pair.
    mismatched = ClientTlsMaterial(
        certificate_pem=unit_pki.server.cert.read_bytes(),
        key_pem=unit_pki.client.key.read_bytes(),
        trust_bundle_pem=unit_pki.ca.cert.read_bytes(),
    )
    with caplog.at_level(logging.DEBUG), pytest.raises(TlsMaterialError) as raised:
        client.update(mismatched)
    assert "KEY_VALUES_MISMATCH" in str(raised.value)
    assert client.context() is current and client.version == material(unit_pki).version
    shown = str(raised.value) + caplog.text
    assert not [line for line in secret_fragments(mismatched) if line in shown]
    with pytest.raises(TlsMaterialError, match="trust bundle"):
        TlsClient(ClientTlsMaterial(b"x", b"y", b""))
    with pytest.raises(TlsMaterialError, match="trust bundle"):
        client_ssl_context(ClientTlsMaterial(b"x", b"y", b"not a certificate"))
    with pytest.raises(ValueError, match="fresh_handshake_seconds"):
        TlsClient(material(unit_pki), fresh_handshake_seconds=0)


def test_the_key_is_never_left_on_disk(
    unit_pki: UnitPki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where there is no memfd_create, the files go to a private directory, removed at once.
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    modes: list[int] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args: object, **kwargs: object) -> str:
        made = real_mkdtemp(*args, **kwargs)  # type: ignore[call-overload]
        modes.append(os.stat(made).st_mode & 0o777)
        return str(made)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    TlsClient(material(unit_pki))
    assert modes == [0o700]
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
async def tls_server(unit_pki: UnitPki) -> AsyncIterator[tuple[int, list[int]]]:
    """A TLS server on loopback serving ``broker.test`` from the unit CA, which asks for a client
    certificate from that same CA (the unit client's comes from the other one) and answers
    nothing; yields its port and the connection count."""
    context = server_context(
        unit_pki.server.cert,
        unit_pki.server.key,
        client_certificates=ClientCertificates.REQUIRED,
        client_ca_file=unit_pki.ca.cert,
    )
    connections = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], connections
    finally:
        server.close()
        await server.wait_closed()


async def heartbeat_error(client: HeartbeatClient, target: BrokerTarget) -> HeartbeatError:
    try:
        await client.heartbeat(target, True, 1)
    except HeartbeatError as error:
        return error
    raise AssertionError("the heartbeat was answered")


async def test_tls_failures_say_what_failed_and_never_what_the_material_holds(
    unit_pki: UnitPki, tls_server: tuple[int, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    port, _ = tls_server
    url = f"https://127.0.0.1:{port}/soap"
    untrusting = material(unit_pki, trust=unit_pki.other_ca.cert)  # does not trust the server's CA
    refused = material(unit_pki)  # trusts it, but its client certificate is not the server's CA's
    errors = []
    with caplog.at_level(logging.DEBUG):
        for each in (untrusting, refused):
            client = HeartbeatClient("t" * 32, "unit-test", 2.0, tls=TlsClient(each))
            try:
                errors.append(await heartbeat_error(client, BrokerTarget("b0", url, 0, SERVER_NAME)))
                wrong_name = BrokerTarget("b0", url, 0, "other.test")
                errors.append(await heartbeat_error(client, wrong_name))
            finally:
                await client.close()
    assert all(error.tls_error for error in errors), [str(error) for error in errors]
    assert "certificate verify failed: self-signed certificate in certificate chain for broker.test" in str(
        errors[0]
    )
    assert "refused the TLS handshake" in str(errors[2]) and "broker.test" in str(errors[2])
    assert "Hostname mismatch" in str(errors[3]) and "other.test" in str(errors[3])
    shown = "\n".join(str(error) for error in errors) + caplog.text
    assert "PRIVATE KEY" not in shown and "BEGIN CERTIFICATE" not in shown
    assert not [line for line in secret_fragments(untrusting, refused) if line in shown]
    # Logged once per distinct problem, not once per heartbeat.
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "fail in TLS" in r.getMessage()]
    assert len(warnings) == len({str(error) for error in errors})


async def test_an_https_target_without_client_material_is_a_tls_error() -> None:
    client = HeartbeatClient("t" * 32, "unit-test", 1.0)
    try:
        target = BrokerTarget("b0", "https://127.0.0.1:9/soap", 0, SERVER_NAME)
        error = await heartbeat_error(client, target)
    finally:
        await client.close()
    assert error.tls_error and not error.reached
    assert "no client certificate" in error.reason
