"""The heartbeat contract on a real broker process: activation, epochs, lease, deactivation, SIGTERM."""

from __future__ import annotations

import http.client
import signal
import time
import urllib.parse
from pathlib import Path

import pytest
import zeep

from broker_simulators.backend import build_envelope
from tests.integration.broker.conftest import reserve_address, start_relay
from tests.integration.broker.helpers import (
    backend_status,
    fault_code,
    get_json,
    get_text,
    heartbeat,
    metric,
    post_raw,
    wait_until,
)
from tests.integration.processes import ProcessSet

pytestmark = pytest.mark.integration


def test_activation_stores_epoch_sends_resend_and_starts_polling(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(processes, tmp_path)
    assert heartbeat(relay.broker, active=False, epoch=0).state == "Inactive"
    assert get_json(relay.cloud.url + "/sim/status")["polls"] == 0

    reply = heartbeat(relay.broker, active=True, epoch=3)

    assert (reply.state, reply.epoch, reply.unavailabilityCode) == ("Active", 3, None)
    assert (tmp_path / "broker-0" / "data" / "epoch").read_text().strip() == "3"
    status = backend_status(relay.backend)
    assert (status["resends"], status["seenEpoch"]) == (1, 3)
    wait_until(lambda: get_json(relay.cloud.url + "/sim/status")["polls"] > 0, 10, what="cloud polled")
    assert metric(relay.broker, "broker_active") == 1
    # A renewal at the same epoch is not a second activation.
    assert heartbeat(relay.broker, active=True, epoch=3).state == "Active"
    assert backend_status(relay.backend)["resends"] == 1


def test_stale_epoch_is_refused_and_changes_nothing(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path)
    assert heartbeat(relay.broker, active=True, epoch=7).state == "Active"
    heartbeat(relay.broker, active=False, epoch=7)

    reply = heartbeat(relay.broker, active=True, epoch=6)

    assert (reply.state, reply.unavailabilityCode, reply.epoch) == ("Unavailable", "STALE_EPOCH", 7)
    assert "6" in reply.unavailabilityMessage and "7" in reply.unavailabilityMessage
    assert metric(relay.broker, "broker_active") == 0
    assert backend_status(relay.backend)["resends"] == 1  # no second activation happened


def test_stored_epoch_survives_kill_9(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path)
    assert heartbeat(relay.broker, active=True, epoch=5).state == "Active"
    relay.broker.kill(signal.SIGKILL)
    relay.broker.restart()

    assert heartbeat(relay.broker, active=False, epoch=0).epoch == 5
    reply = heartbeat(relay.broker, active=True, epoch=4)
    assert (reply.state, reply.unavailabilityCode) == ("Unavailable", "STALE_EPOCH")
    assert heartbeat(relay.broker, active=True, epoch=5).state == "Active"


def test_lease_expiry_deactivates_and_bundles_are_then_refused(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path, broker_args={"lease_seconds": 1.0})
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    envelope = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "hello")])
    status, _ = post_raw(relay.broker.soap_url, envelope)
    assert status == 200

    wait_until(lambda: metric(relay.broker, "broker_active") == 0, 10, what="lease expiry")

    status, body = post_raw(relay.broker.soap_url, envelope)
    assert status == 500 and b"BROKER_INACTIVE" in body and b"not Active" in body
    assert "lease expired" in relay.broker.log_text()
    # The operator can take it back with a fresh heartbeat.
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"


def test_active_false_deactivates_and_inactive_broker_refuses_bundles(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(processes, tmp_path)
    envelope = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "hello")])
    status, body = post_raw(relay.broker.soap_url, envelope, token=None)
    assert status == 500 and b"BROKER_INACTIVE" in body  # Inactive from the start

    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    assert heartbeat(relay.broker, active=False, epoch=1).state == "Inactive"

    status, body = post_raw(relay.broker.soap_url, envelope, token=None)
    assert status == 500 and b"BROKER_INACTIVE" in body
    polls = get_json(relay.cloud.url + "/sim/status")["polls"]
    time.sleep(0.5)  # a quiet interval: nothing may happen in it
    assert get_json(relay.cloud.url + "/sim/status")["polls"] == polls  # polling stopped


@pytest.mark.parametrize(
    ("down", "code"), [("backend", "BACKEND_UNREACHABLE"), ("cloud", "CLOUD_UNREACHABLE")]
)
def test_activation_fails_with_the_unreachable_target(
    processes: ProcessSet, tmp_path: Path, down: str, code: str
) -> None:
    nothing = reserve_address()  # a port nobody listens on
    cloud = processes.start_cloud_simulator(tmp_path)
    backend = processes.start_backend_simulator(tmp_path)
    broker = processes.start_broker(
        tmp_path,
        backend_url=nothing.url if down == "backend" else backend.url,
        cloud_url=nothing.url if down == "cloud" else cloud.url,
        extra_args=["--relay-timeout-seconds", "2"],
    )

    reply = heartbeat(broker, active=True, epoch=1)

    assert (reply.state, reply.unavailabilityCode) == ("Unavailable", code)
    assert metric(broker, "broker_active") == 0
    assert heartbeat(broker, active=False, epoch=1).state == "Inactive"


def test_health_readiness_metrics_and_wsdl(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path)
    assert get_text(relay.broker.url + "/healthz")[0] == 200
    assert get_text(relay.broker.url + "/readyz")[0] == 200  # ready while Inactive
    status, wsdl = get_text(relay.broker.soap_url + "?wsdl")
    assert status == 200 and relay.broker.soap_url in wsdl and "Heartbeat" in wsdl
    assert metric(relay.broker, "broker_epoch") == 0


def test_wrong_token_is_refused_without_activating(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path)
    for token in (None, "not-the-token"):
        with pytest.raises(zeep.exceptions.Fault) as fault:
            heartbeat(relay.broker, active=True, epoch=9, token=token)
        assert fault_code(fault.value) == "UNAUTHENTICATED"
    assert metric(relay.broker, "broker_active") == 0
    assert metric(relay.broker, "broker_epoch") == 0
    assert backend_status(relay.backend)["resends"] == 0


def test_sigterm_deactivates_drains_and_exits_zero(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path)
    assert heartbeat(relay.broker, active=True, epoch=2).state == "Active"

    relay.broker.kill(signal.SIGTERM)
    assert relay.broker.popen.wait(timeout=20) == 0
    assert "deactivated (epoch 2)" in relay.broker.log_text()


def test_inactive_fault_closes_the_connection_so_the_backend_reconnects_through_the_service(
    processes: ProcessSet, tmp_path: Path
) -> None:
    """kube-proxy pins a kept-alive connection to one pod: an Inactive broker must drop it."""
    relay = start_relay(processes, tmp_path)
    envelope = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "hello")])
    url = urllib.parse.urlsplit(relay.broker.soap_url)

    def send_on(connection: http.client.HTTPConnection) -> http.client.HTTPResponse:
        connection.request("POST", url.path, body=envelope, headers={"Content-Type": "text/xml"})
        response = connection.getresponse()
        response.read()
        return response

    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        refused = send_on(connection)
        assert refused.status == 500
        assert refused.getheader("Connection") == "close"
    finally:
        connection.close()

    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        accepted = send_on(connection)
        assert accepted.status == 200
        assert accepted.getheader("Connection") != "close"  # the active broker keeps its clients
    finally:
        connection.close()
