"""The backend simulator's calls to ``https://`` brokers (``calling_tls.py``), in-process.

A stand-in broker serves TLS on 127.0.0.1 and requires a client certificate; it records the
subject each request came with and which connection it came on. The simulator must verify the
stand-in against ``--broker-ca-file``, present its certificate, keep one connection per lane
across bundles, and, when the CA is wrong, keep retrying with its backoff while saying so once;
when the CA file then changes, take it up while sending, with no restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from broker_contracts.soap import AcceptStatus
from broker_contracts.tls import TLS_CA_FILE, ClientCertificates, peer_subject, render_subject, server_context
from broker_service import soap_codec
from broker_simulators.backend import BackendSettings, BackendSimulator, parse_args
from broker_simulators.calling_tls import BrokerClientTls, describe_send_failure
from broker_simulators.local_processes import free_port
from local_cluster.broker_certificates import CertificateFiles, write_secret_volume
from tests.unit.tls.conftest import UnitPki


@pytest.fixture(scope="module")
def loopback_server(unit_pki: UnitPki) -> CertificateFiles:
    """A serving certificate for 127.0.0.1 (the address the simulator dials), from the unit CA."""
    return unit_pki.ca.issue_server("loopback", ["localhost"], ip_addresses=["127.0.0.1"])


class TlsStandIn:
    """Accepts every SendMessages; records (client subject, client port) per request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.credentials: set[str | None] = set()

    async def soap(self, request: web.Request) -> web.Response:
        transport = request.transport
        assert transport is not None
        certificate = transport.get_extra_info("peercert") or {}
        subject = render_subject(peer_subject(certificate.get("subject", ())))
        self.seen.append((subject, transport.get_extra_info("peername")[1]))
        self.credentials.add(request.headers.get("Authorization"))
        parsed = soap_codec.parse_request(await request.read())
        assert isinstance(parsed, soap_codec.SendMessagesRequest)
        results = [
            (s, q, AcceptStatus.ACCEPTED, None) for s, q in zip(parsed.streams, parsed.seqs, strict=True)
        ]
        return web.Response(body=soap_codec.render_send_messages(1, results), content_type="text/xml")


@pytest.fixture
async def stand_in(
    unit_pki: UnitPki, loopback_server: CertificateFiles
) -> AsyncIterator[tuple[TlsStandIn, str]]:
    service = TlsStandIn()
    app = web.Application()
    app.router.add_post("/soap", service.soap)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    context = server_context(
        loopback_server.cert,
        loopback_server.key,
        client_certificates=ClientCertificates.REQUIRED,
        client_ca_file=unit_pki.other_ca.cert,  # the customer's CA: it signed unit_pki.client
    )
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    try:
        yield service, f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def simulator_for(url: str, tls: BrokerClientTls) -> BackendSimulator:
    return BackendSimulator(
        BackendSettings(
            broker_urls=[url],
            streams=2,
            messages_per_stream=20,
            bundle_size=4,
            per_stream_in_bundle=2,
            lanes=1,
            token="backend-secret",
            broker_tls=tls,
        )
    )


async def stop(simulator: BackendSimulator) -> None:
    await simulator.stop_sending()


async def test_https_brokers_are_verified_sent_a_client_certificate_and_kept_alive(
    unit_pki: UnitPki, stand_in: tuple[TlsStandIn, str]
) -> None:
    service, url = stand_in
    simulator = simulator_for(
        url, BrokerClientTls(unit_pki.ca.cert, unit_pki.client.cert, unit_pki.client.key)
    )
    simulator.start_sending()
    try:
        async with asyncio.timeout(20):
            while simulator.accepted < 40:  # noqa: ASYNC110 - the simulator has no event to await
                await asyncio.sleep(0.02)
    finally:
        await stop(simulator)

    assert simulator.status()["faults"] == {}
    assert len(service.seen) == 10  # 40 messages, 4 per bundle
    assert {subject for subject, _ in service.seen} == {"CN=sap-erp,O=ACME,C=DE"}
    assert len({port for _, port in service.seen}) == 1  # one handshake, then keep-alive
    assert service.credentials == {"Bearer backend-secret"}  # the token stays a second factor


async def test_a_broker_certificate_from_another_ca_is_retried_with_backoff_and_logged_once(
    unit_pki: UnitPki, stand_in: tuple[TlsStandIn, str], caplog: pytest.LogCaptureFixture
) -> None:
    service, url = stand_in
    simulator = simulator_for(
        url, BrokerClientTls(unit_pki.other_ca.cert, unit_pki.client.cert, unit_pki.client.key)
    )
    caplog.set_level(logging.WARNING, logger="backend-simulator")
    simulator.start_sending()
    try:
        async with asyncio.timeout(20):
            while simulator.faults.get("ClientConnectorCertificateError", 0) < 4:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        await stop(simulator)

    assert service.seen == []
    assert simulator.accepted == 0
    assert simulator.backoffs >= 4  # retried, at the capped pace of any fast failure
    refused = [r.getMessage() for r in caplog.records if "certificate was refused" in r.getMessage()]
    assert len(refused) == 1, refused
    assert (
        "certificate verify failed" in refused[0]
        and f"--broker-ca-file {unit_pki.other_ca.cert}" in refused[0]
    )


async def test_a_broker_ca_file_that_changes_is_followed_while_sending_with_no_restart(
    unit_pki: UnitPki, stand_in: tuple[TlsStandIn, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SAP's admin imports the brokers' new CA into STRUST: here the CA file gains the stand-in's CA
    (as the operator writes both CAs into ``ca.crt`` during a CA key replacement)."""
    service, url = stand_in
    volume = tmp_path / "broker-ca"
    write_secret_volume(volume, {TLS_CA_FILE: unit_pki.other_ca.cert.read_bytes()})  # not the broker's CA
    tls = BrokerClientTls(
        volume / TLS_CA_FILE, unit_pki.client.cert, unit_pki.client.key, reload_seconds=0.05
    )
    simulator = simulator_for(url, tls)
    caplog.set_level(logging.WARNING)
    simulator.start_sending()
    try:
        async with asyncio.timeout(20):
            while simulator.faults.get("ClientConnectorCertificateError", 0) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            # Half a file (a careless copy): a warning, once; the trust in use stays.
            write_secret_volume(volume, {TLS_CA_FILE: unit_pki.ca.cert.read_bytes()[:300]})
            while simulator.status()["brokerTrustReloadFailures"] == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            assert simulator.accepted == 0 and service.seen == []
            both = unit_pki.other_ca.cert.read_bytes() + unit_pki.ca.cert.read_bytes()
            write_secret_volume(volume, {TLS_CA_FILE: both})
            while simulator.accepted < 40:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        await stop(simulator)

    status = simulator.status()
    assert (status["brokerTrustReloads"], status["brokerTrustReloadFailures"]) == (1, 1)
    assert len(service.seen) == 10  # every bundle, over the new trust
    assert len({port for _, port in service.seen}) == 1  # and then kept alive as before
    unloadable = [r.getMessage() for r in caplog.records if "cannot be loaded" in r.getMessage()]
    assert len(unloadable) == 1, unloadable
    assert "does not hold whole PEM blocks" in unloadable[0]


def test_the_flags_load_their_files_at_start_and_go_in_pairs(
    unit_pki: UnitPki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = ["--client-cert-file", str(unit_pki.client.cert), "--client-key-file", str(unit_pki.client.key)]
    settings = parse_args(["--broker-ca-file", str(unit_pki.ca.cert), *client], {})
    assert settings.broker_tls == BrokerClientTls(unit_pki.ca.cert, unit_pki.client.cert, unit_pki.client.key)
    assert parse_args([], {}).broker_tls == BrokerClientTls()  # https:// against the system's store
    assert parse_args(["--tls-reload-seconds", "0.5"], {}).broker_tls.reload_seconds == 0.5
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(SystemExit):
            parse_args(["--tls-reload-seconds", bad], {})
        assert "--tls-reload-seconds" in capsys.readouterr().err

    with pytest.raises(SystemExit):
        parse_args(["--client-cert-file", str(unit_pki.client.cert)], {})
    assert "--client-cert-file and --client-key-file go together" in capsys.readouterr().err

    with pytest.raises(SystemExit):  # a leaf is no CA: every broker would be refused
        parse_args(["--broker-ca-file", str(unit_pki.client.cert)], {})
    assert f"cannot load --broker-ca-file {unit_pki.client.cert}" in capsys.readouterr().err

    with pytest.raises(SystemExit):  # a key that is not the certificate's
        parse_args(
            ["--client-cert-file", str(unit_pki.client.cert), "--client-key-file", str(unit_pki.server.key)],
            {},
        )
    assert "cannot load --client-cert-file" in capsys.readouterr().err


def test_a_closed_connection_is_explained_by_what_the_url_and_certificate_make_likely() -> None:
    closed = aiohttp.ServerDisconnectedError()
    with_cert = BrokerClientTls(Path("ca.crt"), Path("client.crt"), Path("client.key"))
    assert "client.crt chains to the broker's --client-ca-file" in describe_send_failure(
        closed, "https://b/soap", with_cert
    )
    assert "use an https:// URL" in describe_send_failure(closed, "http://b/soap", BrokerClientTls())
    refused = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("b", 1, True, True, None, None, None),
        ConnectionRefusedError(111, "no"),
    )
    # A refused connection is not a closed one: no TLS hint.
    assert "client-ca-file" not in describe_send_failure(refused, "https://b/soap", with_cert)
