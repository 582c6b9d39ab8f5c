"""``status.tls.served[]`` and the ``HeartbeatTLSFailed`` events from real handshakes (issue 41).

The real :class:`HeartbeatClient` with a real :class:`TlsClient` heartbeats a real ``broker-service``
serving TLS on loopback (``tls_helpers``: its certificate names ``SERVER_NAME``, verified while its
``127.x.y.z`` address is dialled). The client's view is handed to the certificates controller's
report as the heartbeat daemon hands it (``ClusterObservations.served_serials`` and
``tls_problems``), and the status patch and events that come out are checked: the serial openssl
put into the broker's certificate, the rotated one after a fresh handshake, nothing on an idle pass,
and a refused client certificate told once as a Warning, then its recovery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import pytest

from broker_contracts.tls import certificate_serial
from broker_operator.controller.certificate_report import CertificateReport, Entry
from broker_operator.controller.certificates import _report
from broker_operator.controller.observed import ClusterObservations
from broker_operator.controller.reconcile import ClusterRef
from broker_operator.core.model import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatError
from broker_operator.tls_client import TlsClient
from broker_operator.tls_material import ClientTlsMaterial
from broker_simulators.local_processes import ProcessSet
from local_cluster.broker_certificates import CertificateFiles
from tests.integration.broker.tls_helpers import (
    OPERATOR_TOKEN,
    SERVER_NAME,
    Pki,
    TlsBroker,
    make_pki,
    start_tls_broker,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NOW = datetime.now(UTC)
REPORT = CertificateReport("Operator", (Entry("ca", "orders-ca"),))  # as the Secrets stand: unchanged


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    yield make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        kopf, "info", lambda body, *, reason, message: posted.append(("Normal", reason, message))
    )
    monkeypatch.setattr(
        kopf, "warn", lambda body, *, reason, message: posted.append(("Warning", reason, message))
    )
    return posted


def material(pki: Pki, client: CertificateFiles) -> ClientTlsMaterial:
    return ClientTlsMaterial(
        client.cert.read_bytes(), client.key.read_bytes(), pki.operator_ca.cert.read_bytes()
    )


def target(broker: TlsBroker) -> BrokerTarget:
    return BrokerTarget("orders-0", f"https://{broker.host}:{broker.admin_port}/soap", 0, SERVER_NAME)


def serial_of(files: CertificateFiles) -> str:
    return certificate_serial(files.cert.read_text()).lower()


def report_pass(status: dict[str, Any], observations: ClusterObservations) -> dict[str, Any]:
    """One pass of the certificates controller's report, its patch applied to ``status``."""
    body = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u"}, "status": status}
    patch: dict[str, Any] = {}
    _report(ClusterRef("shop", "orders", body, status), observations, patch, REPORT, NOW)
    for field, value in (patch.get("tls") or {}).items():
        status.setdefault("tls", {})[field] = value
    status["conditions"] = patch.get("conditions", status.get("conditions"))
    return patch


async def test_served_follows_the_brokers_certificate_and_tls_problems_are_told_once(
    processes: ProcessSet, tmp_path: Path, pki: Pki, events: list[tuple[str, str, str]]
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    now = [0.0]
    tls = TlsClient(material(pki, pki.operator), fresh_handshake_seconds=300, clock=lambda: now[0])
    client = HeartbeatClient(OPERATOR_TOKEN, "served-test", 5.0, tls=tls)
    observations = ClusterObservations()
    observations.served_serials, observations.tls_problems = client.served_serials, client.tls_problems
    status: dict[str, Any] = {"brokers": [{"name": "orders-0"}], "tls": REPORT.status_tls()}
    try:
        assert report_pass(status, observations).get("tls") is None  # no handshake yet: nothing said
        await client.heartbeat(target(broker), False, 0)
        patch = report_pass(status, observations)
        assert patch["tls"] == {"served": [{"broker": "orders-0", "serial": serial_of(pki.server)}]}
        await client.heartbeat(target(broker), False, 0)
        assert "tls" not in report_pass(status, observations)  # the same certificate: no write

        # The broker's certificate is rotated; the next fresh handshake sees it, and so does status.
        rotated = pki.issue_server("rotated-for-served")
        pki.write_tls_dir(broker.tls_dir.path, rotated)
        await asyncio.sleep(1.0)  # the broker reads its files every 0.2 s
        now[0] = 300.0
        await client.heartbeat(target(broker), False, 0)
        patch = report_pass(status, observations)
        assert patch["tls"]["served"] == [{"broker": "orders-0", "serial": serial_of(rotated)}]

        # The operator's certificate is refused (from a CA the broker does not trust): one Warning.
        tls.update(material(pki, pki.rogue))
        for _ in range(2):
            with pytest.raises(HeartbeatError):
                await client.heartbeat(target(broker), False, 0)
            report_pass(status, observations)
        assert [e[:2] for e in events] == [("Warning", "HeartbeatTLSFailed")]
        assert "heartbeats to orders-0 fail TLS:" in events[0][2] and SERVER_NAME in events[0][2]
        assert "BEGIN" not in events[0][2]
        tls.update(material(pki, pki.operator))
        await client.heartbeat(target(broker), False, 0)
        report_pass(status, observations)
        assert events[1] == ("Normal", "HeartbeatTLSRecovered", "heartbeats to orders-0 work over TLS again")
    finally:
        await client.close()
