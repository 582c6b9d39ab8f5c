"""The heartbeat contract on a real broker process: activation, epochs, lease, checks, stalls, SIGTERM."""

from __future__ import annotations

import http.client
import signal
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import zeep

from broker_contracts.message_log import decode
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import DEFAULT_BACKEND_TOKEN, ProcessSet
from tests.integration.broker.conftest import reserve_address, start_relay
from tests.integration.broker.helpers import (
    QueuedRequest,
    backend_status,
    fault_code,
    get_json,
    get_text,
    heartbeat,
    heartbeat_envelope,
    metric,
    post_bundle,
    reply_state,
    soap_service,
    wait_until,
)

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


def test_a_higher_epoch_for_an_active_broker_is_a_new_term_in_the_message_log(
    processes: ProcessSet, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    relay = start_relay(processes, tmp_path, broker_args={"message_log_dir": store})
    assert heartbeat(relay.broker, active=True, epoch=3).state == "Active"
    assert heartbeat(relay.broker, active=True, epoch=5).state == "Active"  # still Active, new epoch
    relay.broker.stop()  # closes the segment

    lifecycle = [
        (record["event"], record["epoch"])
        for segment in sorted(store.glob("*/*/*.jsonl"))
        for record in map(decode, segment.read_bytes().splitlines())
        if record["event"] in ("activated", "deactivated")
    ]
    assert lifecycle == [("activated", 3), ("deactivated", 3), ("activated", 5), ("deactivated", 5)]


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
    status, _ = post_bundle(relay.broker.soap_url, envelope)
    assert status == 200

    wait_until(lambda: metric(relay.broker, "broker_active") == 0, 10, what="lease expiry")

    status, body = post_bundle(relay.broker.soap_url, envelope)
    assert status == 500 and b"BROKER_INACTIVE" in body and b"not Active" in body
    assert "lease expired" in relay.broker.log_text()
    resends = backend_status(relay.backend)["resends"]

    # The fenced term stays fenced: a (late copy of a) renewal at epoch 1 changes nothing ...
    reply = heartbeat(relay.broker, active=True, epoch=1)
    assert (reply.state, reply.unavailabilityCode, reply.epoch) == ("Unavailable", "LEASE_EXPIRED", 1)
    assert "above 1" in reply.unavailabilityMessage and "lease expired" in reply.unavailabilityMessage
    # ... and neither does an active=false in between; only a higher epoch activates it again.
    assert heartbeat(relay.broker, active=False, epoch=1).state == "Inactive"
    assert heartbeat(relay.broker, active=True, epoch=1).unavailabilityCode == "LEASE_EXPIRED"
    assert metric(relay.broker, "broker_active") == 0
    assert backend_status(relay.backend)["resends"] == resends  # no activation was attempted

    reply = heartbeat(relay.broker, active=True, epoch=2)
    assert (reply.state, reply.epoch) == ("Active", 2)
    assert backend_status(relay.backend)["resends"] == resends + 1
    envelope = build_envelope("acme", "1000", [("orders-0000", 2, "m-2", "again")])
    assert post_bundle(relay.broker.soap_url, envelope)[0] == 200


def test_a_drained_broker_is_activated_again_at_the_same_epoch(processes: ProcessSet, tmp_path: Path) -> None:
    """Only self-fencing forbids the same epoch again; the operator's own active=false does not."""
    relay = start_relay(processes, tmp_path)
    assert heartbeat(relay.broker, active=True, epoch=3).state == "Active"
    assert heartbeat(relay.broker, active=False, epoch=3).state == "Inactive"

    reply = heartbeat(relay.broker, active=True, epoch=3)

    assert (reply.state, reply.epoch) == ("Active", 3)
    assert backend_status(relay.backend)["resends"] == 2


def test_a_check_answers_active_and_never_renews_activates_or_stores(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(processes, tmp_path, broker_args={"lease_seconds": 1.0})
    service = soap_service(relay.broker)

    def check(epoch: int) -> Any:
        return service.Heartbeat(active=True, epoch=epoch, operatorId="test-operator", renewLease=False)

    # On an Inactive broker a check activates nothing and stores nothing.
    reply = check(4)
    assert (reply.state, reply.epoch, reply.unavailabilityCode) == ("Inactive", 0, None)
    assert metric(relay.broker, "broker_epoch") == 0
    assert backend_status(relay.backend)["resends"] == 0

    assert heartbeat(relay.broker, active=True, epoch=4).state == "Active"
    stale = check(3)
    assert (stale.state, stale.unavailabilityCode) == ("Unavailable", "STALE_EPOCH")

    # Nothing but checks from here on: the lease must run out under them.
    answers: list[Any] = []

    def lease_ran_out() -> bool:
        answers.append(check(4))
        return bool(answers[-1].state != "Active")

    wait_until(lease_ran_out, 15, 0.05, what="the lease to run out while only checks arrive")
    assert (answers[0].state, answers[0].epoch) == ("Active", 4)
    assert (answers[-1].state, answers[-1].unavailabilityCode) == ("Unavailable", "LEASE_EXPIRED")
    assert metric(relay.broker, "broker_active") == 0
    assert "lease expired" in relay.broker.log_text()
    assert backend_status(relay.backend)["resends"] == 1


def test_a_check_does_not_queue_behind_an_activation(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path, broker_args={"extra_args": ["--relay-timeout-seconds", "60"]})
    relay.cloud.kill(signal.SIGSTOP)  # the activation will hang at its cloud probe, holding the lock
    try:
        activation = QueuedRequest(relay.broker.soap_url, heartbeat_envelope(True, 1), timeout=90)
        # The epoch is stored before the activation steps: from then on the activation holds the lock.
        wait_until(lambda: metric(relay.broker, "broker_epoch") == 1, 10, what="activation under way")

        reply = heartbeat(relay.broker, active=True, epoch=1, renew=False)  # zeep gives up after 30 s

        assert (reply.state, reply.epoch) == ("Inactive", 1)
        assert activation.pending  # the activation it did not wait for is still going on
    finally:
        relay.cloud.kill(signal.SIGCONT)
    status, body = activation.answer(60)
    assert status == 200 and reply_state(body) == ("Active", None)
    assert heartbeat(relay.broker, active=True, epoch=1, renew=False).state == "Active"


def test_a_sigstopped_active_is_not_active_after_resume_whatever_queued_meanwhile(
    processes: ProcessSet, tmp_path: Path
) -> None:
    """The operator waits out the lease of a silent active, then activates another broker.

    Whatever reached the stopped broker meanwhile sits in its socket buffers: a renewal the
    operator sent before it noticed (and gave up on), a check, a bundle. On resume none of it
    may make the broker Active again. The stop (1.5 s) is shorter than the lease (3 s) and
    longer than a tick plus the lease margin (0.1 + 0.3 s): only the stall rule can catch it.
    """
    relay = start_relay(processes, tmp_path, streams=0, broker_args={"lease_seconds": 3.0})
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    url = relay.broker.soap_url
    bundle = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "hello")])

    relay.broker.kill(signal.SIGSTOP)
    try:
        renewal = QueuedRequest(url, heartbeat_envelope(True, 1), timeout=60)
        abandoned = QueuedRequest(url, heartbeat_envelope(True, 1), timeout=0.3)  # as the operator's
        queued_check = QueuedRequest(url, heartbeat_envelope(True, 1, renew=False), timeout=60)
        queued_bundle = QueuedRequest(url, bundle, timeout=60, token=DEFAULT_BACKEND_TOKEN)
        for request in (renewal, abandoned, queued_check, queued_bundle):
            request.wait_sent()
        time.sleep(1.5)  # the stall itself (setup, not an assertion)
    finally:
        relay.broker.kill(signal.SIGCONT)

    for request in (renewal, queued_check):
        status, body = request.answer()
        assert status == 200
        state, code = reply_state(body)
        assert (state, code) in {("Unavailable", "EVENT_LOOP_STALLED"), ("Unavailable", "LEASE_EXPIRED")}
    status, body = queued_bundle.answer()
    assert status == 500 and b"BROKER_INACTIVE" in body
    abandoned.answer()  # whatever it got (most likely nothing), the state below is what counts

    check = heartbeat(relay.broker, active=True, epoch=1, renew=False)
    assert (check.state, check.unavailabilityCode) == ("Unavailable", "LEASE_EXPIRED")
    assert "stalled" in check.unavailabilityMessage
    assert metric(relay.broker, "broker_active") == 0
    assert metric(relay.broker, "broker_event_loop_stalls_total") >= 1
    status, body = post_bundle(url, bundle)
    assert status == 500 and b"BROKER_INACTIVE" in body
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Unavailable"
    assert "fencing itself at epoch 1: event loop stalled" in relay.broker.log_text()

    # The operator's next activation carries a higher epoch, and that works.
    wait_until(lambda: heartbeat(relay.broker, active=True, epoch=2).state == "Active", 10, what="epoch 2")
    assert post_bundle(url, bundle)[0] == 200


def test_an_activation_that_waited_out_a_stall_is_refused(processes: ProcessSet, tmp_path: Path) -> None:
    """A stopped standby gets an activation, the operator gives up on it and moves on: on resume
    the stale activation must not make this broker a second active."""
    relay = start_relay(processes, tmp_path, broker_args={"lease_seconds": 3.0})
    relay.broker.kill(signal.SIGSTOP)
    try:
        activation = QueuedRequest(relay.broker.soap_url, heartbeat_envelope(True, 5), timeout=60)
        activation.wait_sent()
        time.sleep(1.5)  # the stall (setup)
    finally:
        relay.broker.kill(signal.SIGCONT)

    status, body = activation.answer()
    assert status == 200 and reply_state(body) == ("Unavailable", "EVENT_LOOP_STALLED")
    assert b"nothing changed" in body
    assert metric(relay.broker, "broker_active") == 0
    assert metric(relay.broker, "broker_epoch") == 0  # not even the epoch was stored
    assert backend_status(relay.backend)["resends"] == 0


def test_active_false_deactivates_and_inactive_broker_refuses_bundles(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(processes, tmp_path)
    envelope = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "hello")])
    status, body = post_bundle(relay.broker.soap_url, envelope)
    assert status == 500 and b"BROKER_INACTIVE" in body  # Inactive from the start

    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    assert heartbeat(relay.broker, active=False, epoch=1).state == "Inactive"

    status, body = post_bundle(relay.broker.soap_url, envelope)
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
        headers = {"Content-Type": "text/xml", "Authorization": f"Bearer {DEFAULT_BACKEND_TOKEN}"}
        connection.request("POST", url.path, body=envelope, headers=headers)
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
