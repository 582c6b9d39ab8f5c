"""A broker serving TLS (``--tls-dir``), a real process: who gets a handshake, who gets an answer.

The certificates come from ``local_cluster.broker_certificates`` (openssl): the operator's CA
signs the broker's serving certificate and the operator's client certificate; a rogue CA signs a
client certificate with the operator's subject; the customer's CA signs the SAP backend's client
certificate (listed in ``--allowed-client-subjects``) and an intruder's (not listed).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.helpers import heartbeat_envelope, raw_fault_code, reply_state, wait_until
from tests.integration.broker.tls_helpers import (
    BACKEND_TOKEN,
    OPERATOR_TOKEN,
    Pki,
    TlsConnection,
    call,
    client_ssl,
    make_pki,
    metrics_text,
    once,
    sample,
    served_serial,
    start_tls_broker,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    yield make_pki(tmp_path_factory.mktemp("pki"))


def _handshake_error(context: ssl.SSLContext, host: str, port: int, server_name: str) -> ssl.SSLError:
    with pytest.raises(ssl.SSLError) as refused:
        once(host, port, context, "GET", "/healthz", server_name=server_name)
    return refused.value


def test_the_server_certificate_verifies_under_its_dns_name_and_a_wrong_ca_name_or_date_fails(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    trusting = client_ssl(pki.operator_ca.cert)
    host, port = broker.host, broker.main.port
    connection = TlsConnection(host, port, trusting)
    assert call(connection, "GET", "/healthz") == (200, b"ok\n")
    expected_serial = served_serial(host, port, trusting)
    assert connection.served_serial == expected_serial
    connection.close()
    # The other SAN (the -active Service's name) verifies too; a TLS 1.2-only client (an SAP kernel
    # without 1.3) is served.
    assert once(host, port, trusting, "GET", "/healthz", server_name="acme-1000-active.erp.svc")[0] == 200
    tls12 = client_ssl(pki.operator_ca.cert)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    assert once(host, port, tls12, "GET", "/healthz")[0] == 200

    wrong_ca = _handshake_error(client_ssl(pki.rogue_ca.cert), host, port, "acme-1000-0.acme-1000.erp.svc")
    assert isinstance(wrong_ca, ssl.SSLCertVerificationError)
    assert "unable to get local issuer certificate" in wrong_ca.verify_message
    wrong_name = _handshake_error(trusting, host, port, "acme-1000-1.acme-1000.erp.svc")
    assert isinstance(wrong_name, ssl.SSLCertVerificationError)
    assert "Hostname mismatch" in wrong_name.verify_message

    # An expired certificate, rotated in as the kubelet would: served (the broker does not judge
    # dates), and refused by every client that checks them.
    pki.write_tls_dir(broker.tls_dir.path, pki.issue_server("expired", days=-1))

    def expired_error() -> str:
        try:
            once(host, port, trusting, "GET", "/healthz")
        except ssl.SSLCertVerificationError as error:
            return error.verify_message
        return ""

    assert "certificate has expired" in wait_until(
        expired_error, 30, 0.2, what="the expired certificate served"
    )


def test_the_admin_port_needs_the_operators_client_certificate_and_then_its_token(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    host, port = broker.host, broker.admin_port
    check = heartbeat_envelope(active=False, epoch=0)

    # No client certificate, or one from a CA the broker does not trust (with the operator's own
    # subject, and the right token): the handshake fails. Under TLS 1.3 the client's side of the
    # handshake is done before the server has judged its certificate, so the client sees the
    # connection closed at its first read (DAY2_FACTS.md); under TLS 1.2 the handshake itself
    # fails. Either way the client reads an end of stream, not an alert: asyncio's TLS closes the
    # connection without sending the alert OpenSSL wrote.
    for certificate in (None, pki.rogue):
        context = client_ssl(pki.operator_ca.cert, certificate)
        with pytest.raises((ConnectionError, ssl.SSLEOFError)):  # at the write or at the read
            once(host, port, context, "POST", "/soap", heartbeat_envelope(True, 1), OPERATOR_TOKEN)
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError, match="UNEXPECTED_EOF"):
            once(host, port, context, "POST", "/soap", heartbeat_envelope(True, 1), OPERATOR_TOKEN)

    operator = client_ssl(pki.operator_ca.cert, pki.operator)
    # The right certificate and a wrong token, or none: refused as without TLS; the backend's token
    # opens nothing on this port.
    for token, code in (
        ("not-the-token", "UNAUTHENTICATED"),
        (None, "UNAUTHENTICATED"),
        (BACKEND_TOKEN, "WRONG_PORT"),
    ):
        status, body = once(host, port, operator, "POST", "/soap", heartbeat_envelope(True, 1), token)
        assert (status, raw_fault_code(body)) == (500, code)
    # Both: the heartbeat works (a check, and a renewal on a kept-alive connection).
    connection = TlsConnection(host, port, operator)
    assert reply_state(call(connection, "POST", "/soap", check, OPERATOR_TOKEN)[1]) == ("Inactive", None)
    assert reply_state(call(connection, "POST", "/soap", check, OPERATOR_TOKEN)[1]) == ("Inactive", None)
    assert connection.connects == 1
    connection.close()
    text = metrics_text(broker, pki)
    assert sample(text, "broker_active") == 0  # nothing refused above changed anything
    assert sample(text, 'broker_auth_failures_total{reason="unknown",role="operator"}') == 1
    assert sample(text, 'broker_auth_failures_total{reason="missing",role="operator"}') == 1


def test_send_messages_needs_a_listed_client_certificate_and_probes_need_none(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    cloud = processes.start_cloud_simulator(tmp_path)
    backend = processes.start_backend_simulator(tmp_path, streams=0)
    broker = start_tls_broker(
        processes, tmp_path, pki, backend_url=backend.url, cloud_url=cloud.url, allowed_subjects=True
    )
    host, port = broker.host, broker.main.port
    operator = client_ssl(pki.operator_ca.cert, pki.operator)
    activate = heartbeat_envelope(True, 1)
    assert reply_state(once(host, broker.admin_port, operator, "POST", "/soap", activate, OPERATOR_TOKEN)[1])[
        0
    ] == ("Active")

    def bundle(seq: int) -> bytes:
        return build_envelope("acme", "1000", [("orders-0000", seq, f"m-{seq}", "hello")])

    # No client certificate (and the right token): refused before the token is looked at.
    status, body = once(
        host, port, client_ssl(pki.operator_ca.cert), "POST", "/soap", bundle(1), BACKEND_TOKEN
    )
    assert (status, raw_fault_code(body)) == (500, "UNAUTHENTICATED")
    assert b"presented none" in body and b"--allowed-client-subjects" in body
    # A certificate of the customer's CA with a subject that is not listed: refused, naming it.
    intruder = client_ssl(pki.operator_ca.cert, pki.intruder)
    status, body = once(host, port, intruder, "POST", "/soap", bundle(1), BACKEND_TOKEN)
    assert (status, raw_fault_code(body)) == (500, "UNAUTHENTICATED")
    assert b"CN=sap-erp-test,OU=Basis,O=ACME,C=DE" in body
    assert BACKEND_TOKEN.encode() not in body
    # A certificate from a CA the main port does not trust fails the handshake.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        once(
            host,
            port,
            client_ssl(pki.operator_ca.cert, pki.operator),
            "POST",
            "/soap",
            bundle(1),
            BACKEND_TOKEN,
        )

    # The listed certificate: accepted, twice on one connection.
    listed = TlsConnection(host, port, client_ssl(pki.operator_ca.cert, pki.backend))
    for seq in (1, 2):
        status, body = call(listed, "POST", "/soap", bundle(seq), BACKEND_TOKEN)
        assert status == 200 and b"Accepted" in body, body[:300]
    listed.close()

    # Probes, the WSDL and /metrics need no client certificate.
    anonymous = client_ssl(pki.operator_ca.cert)
    for path in ("/healthz", "/readyz", "/soap?wsdl"):
        assert once(host, port, anonymous, "GET", path)[0] == 200, path
    text = metrics_text(broker, pki)
    assert sample(text, "broker_messages_accepted_total") == 2
    assert sample(text, 'broker_auth_failures_total{reason="no_client_certificate",role="backend"}') == 1
    assert sample(text, 'broker_auth_failures_total{reason="client_subject_not_allowed",role="backend"}') == 1
    assert "refused POST /soap" in broker.main.log_text()


def test_plain_http_to_a_tls_port_gets_no_http_answer_and_its_credential_changes_nothing(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    body = heartbeat_envelope(True, 1)
    for port, token in ((broker.admin_port, OPERATOR_TOKEN), (broker.main.port, BACKEND_TOKEN)):
        request = (
            f"POST /soap HTTP/1.1\r\nHost: {broker.host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: text/xml\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        with socket.create_connection((broker.host, port), timeout=10) as plain:
            plain.sendall(request)
            answer = b""
            while chunk := plain.recv(4096):  # to the broker's close; bounded by the socket timeout
                answer += chunk
        # Nothing HTTP: at most a TLS alert record (content type 21), then the connection closes.
        assert not answer.startswith(b"HTTP/"), answer[:100]
        assert answer == b"" or answer[0] == 0x15, answer[:100]
    text = metrics_text(broker, pki)
    assert sample(text, "broker_active") == 0
    assert "broker_auth_failures_total{" not in text  # the credentials were never even looked at


def test_connections_stay_bounded_under_tls_handshake_headers_and_count(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(
        processes,
        tmp_path,
        pki,
        extra_args=(
            "--tls-handshake-timeout-seconds", "1", "--header-timeout-seconds", "1", "--max-connections", "2",
        ),
    )  # fmt: skip
    host = broker.host
    # A connection that never starts its handshake is closed by the broker (else recv would time out).
    with socket.create_connection((host, broker.admin_port), timeout=10) as silent:
        started = time.monotonic()
        assert silent.recv(1) == b""
        assert time.monotonic() - started < 9
    # A handshake done and no request: the header deadline closes it, as over plain HTTP.
    anonymous = client_ssl(pki.operator_ca.cert)
    with (
        socket.create_connection((host, broker.main.port), timeout=10) as raw,
        anonymous.wrap_socket(raw, server_hostname="acme-1000-0.acme-1000.erp.svc") as idle,
    ):
        assert idle.recv(1) == b""
    # The cap: two kept-alive connections hold the port's two places; a third is closed unanswered.
    held = [TlsConnection(host, broker.main.port, anonymous) for _ in range(2)]
    for connection in held:
        assert call(connection, "GET", "/healthz")[0] == 200
    with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
        once(host, broker.main.port, anonymous, "GET", "/healthz")
    for connection in held:
        connection.close()
