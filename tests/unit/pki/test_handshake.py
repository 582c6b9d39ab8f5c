"""The certificates in real TLS handshakes with Python's ``ssl`` (OpenSSL), mutual TLS as between the
operator and a broker's admin port: the server's certificate verified by a client that trusts the
CA, the client's certificate required by the server. Also capped at TLS 1.2 with the cipher suites
SAP's older stacks offer, RSA key transport among them. Both ends verify with ``VERIFY_X509_STRICT``
(RFC 5280's rules, Python 3.13's default), which refuses a leaf without an authority key identifier
or a CA whose basicConstraints are not critical.

Each handshake runs over a ``socket.socketpair()``: no address at all, both ends closed here.
The certificates are issued at the machine's clock, which OpenSSL checks them against.
"""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker_operator.pki import (
    KeyPair,
    certificate_info,
    issue_client,
    issue_server,
    new_ca,
    renew_ca,
    server_dns_names,
    trust_bundle,
)

NAMES = server_dns_names("orders", "shop", range(2))
ACTIVE = NAMES[0]
OPERATOR = "broker-failover-operator.operators.svc"
TIMEOUT = 10.0


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    other_ca: KeyPair
    server: KeyPair
    client: KeyPair
    foreign_client: KeyPair  # of other_ca


@pytest.fixture(scope="module")
def pki() -> Pki:
    now = datetime.now(UTC)
    ca = new_ca("orders CA", days=3650, now=now)
    other = new_ca("orders CA", days=3650, now=now, key_bits=2048)
    return Pki(
        ca=ca,
        other_ca=other,
        server=issue_server(ca, NAMES, days=90, now=now),
        client=issue_client(ca, OPERATOR, days=90, now=now),
        foreign_client=issue_client(other, OPERATOR, days=90, now=now),
    )


def _files(tmp_path: Path, pair: KeyPair, name: str) -> tuple[str, str]:
    certificate, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    certificate.write_bytes(pair.certificate_pem)
    key.write_bytes(pair.key_pem)
    key.chmod(0o600)
    return str(certificate), str(key)


def context(
    tmp_path: Path,
    *,
    server_side: bool,
    trust: bytes,
    own: KeyPair | None,
    tls12_only: bool = False,
    ciphers: str | None = None,
) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls12_only:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if ciphers:
        ctx.set_ciphers(ciphers)
    ctx.verify_mode = ssl.CERT_REQUIRED  # the client's default; the server requires a client certificate
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # RFC 5280 strictly, as Python 3.13 does by default
    ctx.load_verify_locations(cadata=trust.decode())
    if own is not None:
        ctx.load_cert_chain(*_files(tmp_path, own, "server" if server_side else "client"))
    return ctx


@dataclass
class Outcome:
    server_error: BaseException | None = None
    client_error: BaseException | None = None
    version: str | None = None
    cipher: str | None = None
    reply: bytes = b""
    server_saw: bytes | None = None  # the client certificate, DER
    client_saw: bytes | None = None  # the server certificate, DER

    @property
    def ok(self) -> bool:
        return self.server_error is None and self.client_error is None and self.reply == b"pong:ping!"


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str = ACTIVE) -> Outcome:
    outcome = Outcome()
    server_end, client_end = socket.socketpair()
    server_end.settimeout(TIMEOUT)
    client_end.settimeout(TIMEOUT)

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(server_end, server_side=True) as tls:
                outcome.server_saw = tls.getpeercert(binary_form=True)
                request = tls.recv(5)
                tls.sendall(b"pong:" + request)
        except (OSError, ssl.SSLError) as error:
            outcome.server_error = error
        finally:
            server_end.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        with client_ctx.wrap_socket(client_end, server_hostname=hostname) as tls:
            outcome.version, outcome.cipher = tls.version(), tls.cipher()[0]  # type: ignore[index]
            outcome.client_saw = tls.getpeercert(binary_form=True)
            tls.sendall(b"ping!")
            while len(outcome.reply) < 10:
                chunk = tls.recv(10 - len(outcome.reply))
                if not chunk:
                    break
                outcome.reply += chunk
    except (OSError, ssl.SSLError) as error:
        outcome.client_error = error
    finally:
        client_end.close()
        server.join(TIMEOUT)
    assert not server.is_alive(), "the server end did not finish"
    return outcome


def test_mutual_tls_with_the_defaults(tmp_path: Path, pki: Pki) -> None:
    server = context(tmp_path, server_side=True, trust=pki.ca.certificate_pem, own=pki.server)
    client = context(tmp_path, server_side=False, trust=pki.ca.certificate_pem, own=pki.client)
    outcome = handshake(server, client)
    assert outcome.ok, outcome
    assert outcome.server_saw is not None and outcome.client_saw is not None
    assert certificate_info(outcome.server_saw).serial == pki.client.info().serial
    assert certificate_info(outcome.client_saw).serial == pki.server.info().serial


@pytest.mark.parametrize(
    "ciphers",
    [
        "ECDHE-RSA-AES256-GCM-SHA384",  # what current SAP kernels negotiate with an RSA certificate
        # RSA key transport, older stacks. Java's and other strict stacks then require keyEncipherment;
        # OpenSSL does not check it, so test_authority checks the bit itself.
        "AES256-GCM-SHA384",
        "AES128-SHA256",
    ],
)
@pytest.mark.parametrize(
    "hostname", [ACTIVE, "orders-active", "orders-1.orders-brokers.shop.svc.cluster.local"]
)
def test_tls12_only_as_sap_stacks_without_tls13(
    tmp_path: Path, pki: Pki, ciphers: str, hostname: str
) -> None:
    # Python's server default offers ECDHE suites only: a server for such clients names its suites.
    server = context(
        tmp_path,
        server_side=True,
        trust=pki.ca.certificate_pem,
        own=pki.server,
        tls12_only=True,
        ciphers=ciphers,
    )
    client = context(
        tmp_path,
        server_side=False,
        trust=pki.ca.certificate_pem,
        own=pki.client,
        tls12_only=True,
        ciphers=ciphers,
    )
    outcome = handshake(server, client, hostname)
    assert outcome.ok, outcome
    assert (outcome.version, outcome.cipher) == ("TLSv1.2", ciphers)


@pytest.mark.parametrize("tls12_only", [False, True])
def test_a_server_certificate_of_another_ca_or_name_is_refused(
    tmp_path: Path, pki: Pki, tls12_only: bool
) -> None:
    server = context(
        tmp_path, server_side=True, trust=pki.ca.certificate_pem, own=pki.server, tls12_only=tls12_only
    )
    untrusting = context(tmp_path, server_side=False, trust=pki.other_ca.certificate_pem, own=pki.client)
    outcome = handshake(server, untrusting)
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError), outcome
    # OpenSSL's server sends its CA along (it is in its verify store): the client sees a chain
    # ending in a self-signed CA it does not trust.
    assert "certificate verify failed" in str(outcome.client_error)
    trusting = context(tmp_path, server_side=False, trust=pki.ca.certificate_pem, own=pki.client)
    outcome = handshake(server, trusting, "orders-9.orders-brokers.shop.svc.cluster.local")
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError), outcome
    assert "Hostname mismatch" in str(outcome.client_error)


@pytest.mark.parametrize("tls12_only", [False, True])
@pytest.mark.parametrize("presented", ["foreign", "none"])
def test_the_server_refuses_a_client_without_a_certificate_of_its_ca(
    tmp_path: Path, pki: Pki, tls12_only: bool, presented: str
) -> None:
    server = context(
        tmp_path, server_side=True, trust=pki.ca.certificate_pem, own=pki.server, tls12_only=tls12_only
    )
    own = pki.foreign_client if presented == "foreign" else None
    client = context(tmp_path, server_side=False, trust=pki.ca.certificate_pem, own=own)
    outcome = handshake(server, client)
    assert isinstance(outcome.server_error, ssl.SSLError), outcome
    expected = "certificate verify failed" if presented == "foreign" else "peer did not return a certificate"
    assert expected in str(outcome.server_error)
    assert not outcome.ok


def test_mid_replacement_both_sides_trust_leaves_of_the_old_and_the_new_ca(tmp_path: Path, pki: Pki) -> None:
    """Reissuing: the broker serves a leaf of the new CA while the operator still presents one of the old."""
    both = trust_bundle(pki.ca.certificate_pem, pki.other_ca.certificate_pem)
    now = datetime.now(UTC)
    new_server = issue_server(pki.other_ca, NAMES, days=90, now=now)
    server = context(tmp_path, server_side=True, trust=both, own=new_server)
    client = context(tmp_path, server_side=False, trust=both, own=pki.client)
    assert handshake(server, client).ok
    # And the same pair with the old CA dropped too early on the operator's side fails.
    hasty = context(tmp_path, server_side=False, trust=pki.ca.certificate_pem, own=pki.client)
    assert isinstance(handshake(server, hasty).client_error, ssl.SSLCertVerificationError)


def test_a_same_key_renewed_ca_alone_trusts_the_leaves_of_the_old_certificate(
    tmp_path: Path, pki: Pki
) -> None:
    renewed = renew_ca(pki.ca, days=3650, now=datetime.now(UTC) + timedelta(seconds=1))
    assert renewed.certificate_pem != pki.ca.certificate_pem
    server = context(tmp_path, server_side=True, trust=renewed.certificate_pem, own=pki.server)
    client = context(tmp_path, server_side=False, trust=renewed.certificate_pem, own=pki.client)
    assert handshake(server, client).ok
