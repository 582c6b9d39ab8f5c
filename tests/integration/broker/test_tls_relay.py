"""The whole relay path with TLS on every leg (real processes): nothing lost, reordered or doubled.

backend simulator → broker main port (``https://``, the backend's client certificate, the broker
in allowed-subjects mode) → cloud simulator (``https://``, verified against the run's CA), and
back: the broker's resend request, its confirmations and the inbound deliveries to the backend
simulator over ``https://``; the heartbeats over the admin port with the operator's certificate.
Every listener is shown to refuse plain HTTP first, so a leg that went plain could not have
carried a message; a refused leg would leave messages unconfirmed. Then a backend with the wrong
CA and one without its client certificate: refused, retried, and said once in its log.
"""

from __future__ import annotations

import http.client
import urllib.parse
from pathlib import Path

import pytest

from broker_simulators.local_processes import ProcessSet, RunningProcess
from local_cluster import loopback_relay
from local_cluster.broker_certificates import create_ca
from local_cluster.run_pki import LocalPki
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import (
    assert_complete_and_ordered,
    backend_status,
    caller_context,
    cloud_received,
    get_text,
    heartbeat,
    sim_json,
    start_sending,
    wait_until,
)

pytestmark = pytest.mark.integration

STREAMS, PER_STREAM = 6, 60
INBOUND_STREAMS, INBOUND_PER_STREAM = 4, 40


def refuses_plain_http(url: str) -> bool:
    """A plain-HTTP GET to ``url`` gets no HTTP answer (a TLS listener closes on a non-ClientHello)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
    try:
        connection.request("GET", "/healthz")
        connection.getresponse().read()
    except (OSError, http.client.HTTPException):
        return True
    finally:
        connection.close()
    return False


def test_every_leg_over_tls_delivers_each_message_once_and_in_order(
    processes: ProcessSet, tmp_path: Path, local_pki: LocalPki
) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        pki=local_pki,
        streams=STREAMS,
        messages_per_stream=PER_STREAM,
        backend_args={"lanes": 3, "per_stream_in_bundle": 7, "payload_bytes": 200},
        cloud_args={"inbound_streams": INBOUND_STREAMS, "inbound_messages_per_stream": INBOUND_PER_STREAM},
    )
    broker, backend, cloud = relay.broker, relay.backend, relay.cloud
    listeners = [backend.url, cloud.url, broker.url, broker.admin_url]
    assert all(url.startswith("https://") for url in listeners), listeners
    assert broker.admin_url != broker.url
    assert [url for url in listeners if not refuses_plain_http(url)] == []

    assert heartbeat(broker, active=True, epoch=1).state == "Active"  # resend request over https
    start_sending(backend)
    wait_until(lambda: backend_status(backend)["allConfirmed"], 60, 0.2, what="outbound confirmed")
    wait_until(lambda: sim_json(cloud, "/sim/status")["inboundAllConfirmed"], 60, 0.2, what="inbound")

    assert_complete_and_ordered(cloud_received(cloud), STREAMS, PER_STREAM, "orders-")
    assert_complete_and_ordered(
        sim_json(backend, "/sim/received"), INBOUND_STREAMS, INBOUND_PER_STREAM, "invoices-"
    )
    status = backend_status(backend)
    assert status["faults"] == {}, status["faults"]  # not one refused send on the way
    assert (status["accepted"], status["duplicates"], status["gaps"]) == (STREAMS * PER_STREAM, 0, 0)
    assert status["inboundDuplicates"] == 0 and status["rewindsBelowConfirmed"] == 0
    cloud_status = sim_json(cloud, "/sim/status")
    assert (cloud_status["outboundTaken"], cloud_status["outboundDuplicates"]) == (STREAMS * PER_STREAM, 0)
    assert cloud_status["inboundConfirmed"] == INBOUND_STREAMS * INBOUND_PER_STREAM
    # The broker's own calls, as each simulator saw them: over TLS, never plain.
    for relay_status in (status, cloud_status):
        transports = relay_status["relayTransports"]
        assert transports and set(transports) <= {"TLSv1.2", "TLSv1.3"}, transports


def auth_failures(broker: RunningProcess, reason: str) -> float:
    _, text = get_text(broker.url + "/metrics", caller_context(broker))
    prefix = "broker_auth_failures_total{"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and f'reason="{reason}"' in line
    )


def test_a_backend_with_the_wrong_ca_or_without_its_certificate_is_refused_retried_and_logged_once(
    processes: ProcessSet, tmp_path: Path, local_pki: LocalPki
) -> None:
    relay = start_relay(processes, tmp_path, pki=local_pki, streams=0)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    other_ca = create_ca(tmp_path / "other-pki", "not-the-brokers")
    sending = {"broker_urls": [relay.broker.url], "streams": 1, "messages_per_stream": 5, "autostart": True}

    wrong_ca = processes.start_backend_simulator(
        tmp_path,
        name="wrong-ca",
        extra_args=[
            *("--broker-ca-file", str(other_ca.cert)),
            *("--client-cert-file", str(local_pki.backend_client.cert)),
            *("--client-key-file", str(local_pki.backend_client.key)),
        ],
        **sending,  # type: ignore[arg-type]
    )
    no_certificate = loopback_relay.start_backend_simulator(
        processes, tmp_path, local_pki, name="no-certificate", client_certificate=False, **sending
    )
    wait_until(
        lambda: backend_status(wrong_ca)["faults"].get("ClientConnectorCertificateError", 0) >= 3,
        20,
        what="the wrong CA refused three times",
    )
    wait_until(
        lambda: backend_status(no_certificate)["faults"].get("UNAUTHENTICATED", 0) >= 3,
        20,
        what="no client certificate refused three times",
    )

    for process in (wrong_ca, no_certificate):
        assert backend_status(process)["accepted"] == 0
    assert cloud_received(relay.cloud) == {}
    log = wrong_ca.log_text()
    assert log.count("certificate was refused") == 1, log
    assert "certificate verify failed" in log and f"--broker-ca-file {other_ca.cert}" in log
    log = no_certificate.log_text()
    assert log.count("UNAUTHENTICATED") == 1, log
    assert "presented none" in log
    assert auth_failures(relay.broker, "no_client_certificate") >= 3
