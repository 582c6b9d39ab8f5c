"""Crashes and failover with real processes: kill -9 mid-bundle, journal replay, a second broker."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from broker_service.journal import FILE_HEADER, accepted_frame
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.conftest import reserve_address, start_relay
from tests.integration.broker.helpers import (
    Renewals,
    assert_complete_and_ordered,
    backend_status,
    cloud_received,
    get_json,
    get_text,
    heartbeat,
    metric,
    post_bundle,
    start_sending,
    wait_until,
)

pytestmark = pytest.mark.integration


def cloud_taken(relay_cloud_url: str) -> int:
    return int(get_json(relay_cloud_url + "/sim/status")["outboundTaken"])


def test_kill_9_mid_bundle_then_restart_delivers_everything_once_in_order(
    processes: ProcessSet, tmp_path: Path
) -> None:
    streams, per_stream = 40, 250
    relay = start_relay(processes, tmp_path, streams=streams, messages_per_stream=per_stream)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    start_sending(relay.backend)
    total = streams * per_stream
    wait_until(lambda: cloud_taken(relay.cloud.url) > total // 5, 60, 0.05, what="traffic flowing")

    relay.broker.kill(signal.SIGKILL)  # bundles are in flight in both directions right now
    assert cloud_taken(relay.cloud.url) < total
    relay.broker.restart()
    assert heartbeat(relay.broker, active=True, epoch=2).state == "Active"

    wait_until(lambda: backend_status(relay.backend)["allConfirmed"], 90, 0.2, what="all confirmed")
    assert_complete_and_ordered(cloud_received(relay.cloud), streams, per_stream, "orders-")
    assert backend_status(relay.backend)["rewindsBelowConfirmed"] == 0


def test_journal_alone_delivers_acknowledged_messages_after_kill_9(
    processes: ProcessSet, tmp_path: Path
) -> None:
    # The backend simulator has no streams, so its resend replays nothing: only the journal can deliver these.
    relay = start_relay(
        processes, tmp_path, streams=0, broker_args={"extra_args": ["--relay-timeout-seconds", "1"]}
    )
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    relay.cloud.kill(signal.SIGSTOP)  # the cloud stops answering: acknowledged messages pile up in the broker
    acked: dict[str, list[int]] = {}
    for bundle in range(10):
        messages = [
            (f"j{stream}", bundle * 5 + i + 1, f"m{stream}-{bundle}-{i}", "x" * 50)
            for stream in range(6)
            for i in range(5)
        ]
        status, reply = post_bundle(relay.broker.soap_url, build_envelope("acme", "1000", messages))
        assert status == 200 and reply.count(b"Accepted") == len(messages)
        for stream, seq, _, _ in messages:
            acked.setdefault(stream, []).append(seq)

    relay.broker.kill(signal.SIGKILL)
    relay.cloud.kill(signal.SIGCONT)
    relay.broker.restart()
    assert heartbeat(relay.broker, active=True, epoch=2).state == "Active"

    wait_until(lambda: sum(map(len, cloud_received(relay.cloud).values())) == 300, 30, what="journal replay")
    assert cloud_received(relay.cloud) == acked


def test_torn_journal_tail_is_cut_and_corruption_inside_is_refused(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(processes, tmp_path, streams=0)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    relay.cloud.kill(signal.SIGSTOP)
    messages = [("s", seq, f"m{seq}", "payload") for seq in range(1, 21)]
    status, _ = post_bundle(relay.broker.soap_url, build_envelope("acme", "1000", messages))
    assert status == 200
    relay.broker.kill(signal.SIGKILL)
    relay.cloud.kill(signal.SIGCONT)
    journal = next((tmp_path / "broker-0" / "data" / "journal").glob("journal-*.log"))
    with journal.open("ab") as handle:  # a write the crash tore: a header promising more than is there
        handle.write(accepted_frame([("s", 21, "m21", "payload")] * 40)[:60])
    relay.broker.restart()

    assert get_text(relay.broker.url + "/readyz")[0] == 200
    assert "torn tail" in relay.broker.log_text()
    assert heartbeat(relay.broker, active=True, epoch=2).state == "Active"
    wait_until(
        lambda: cloud_received(relay.cloud).get("s") == list(range(1, 21)), 20, what="all 20 delivered"
    )

    # Now damage a record in the middle of the (new, compacted) journal: that is not a torn write.
    relay.broker.kill(signal.SIGKILL)
    journal = next((tmp_path / "broker-0" / "data" / "journal").glob("journal-*.log"))
    data = bytearray(journal.read_bytes())
    first = len(FILE_HEADER)
    assert len(data) > first + 40
    data[first + 1] ^= 0xFF  # the first frame's length field: format 1 took this for a torn tail
    journal.write_bytes(bytes(data))
    relay.broker.restart()
    assert get_text(relay.broker.url + "/readyz")[0] == 503
    reply = heartbeat(relay.broker, active=True, epoch=3)
    assert (reply.state, reply.unavailabilityCode) == ("Unavailable", "JOURNAL_ERROR")
    # Where and what kind of damage, never the bytes: the message reaches the BrokerCluster's status.
    assert f"{journal.name}: frame 1 at offset {first}" in reply.unavailabilityMessage
    assert "payload" not in reply.unavailabilityMessage and "m1" not in reply.unavailabilityMessage
    assert journal.read_bytes() == bytes(data)  # nothing was cut
    assert "journal cannot be used" in relay.broker.log_text()


def test_failover_to_second_broker_replays_unconfirmed_without_gap_or_duplicate(
    processes: ProcessSet, tmp_path: Path
) -> None:
    streams, per_stream = 30, 200
    second = reserve_address()
    first = reserve_address()
    cloud = processes.start_cloud_simulator(tmp_path)
    backend = processes.start_backend_simulator(
        tmp_path, broker_urls=[first.url, second.url], streams=streams, messages_per_stream=per_stream
    )
    common: dict[str, Any] = {"backend_url": backend.url, "cloud_url": cloud.url}
    broker_a = processes.start_broker(tmp_path, name="broker-a", host=first.host, port=first.port, **common)
    broker_b = processes.start_broker(tmp_path, name="broker-b", host=second.host, port=second.port, **common)
    assert heartbeat(broker_a, active=True, epoch=1).state == "Active"
    start_sending(backend)
    total = streams * per_stream
    wait_until(lambda: cloud_taken(cloud.url) > total // 4, 60, 0.05, what="traffic flowing")

    # The operator's order: the old active is known inactive before the next is activated.
    assert heartbeat(broker_a, active=False, epoch=1).state == "Inactive"
    assert cloud_taken(cloud.url) < total
    assert heartbeat(broker_b, active=True, epoch=2).state == "Active"

    wait_until(lambda: backend_status(backend)["allConfirmed"], 90, 0.2, what="all confirmed via broker-b")
    assert_complete_and_ordered(cloud_received(cloud), streams, per_stream, "orders-")
    status = backend_status(backend)
    assert status["resends"] == 2 and status["rewindsBelowConfirmed"] == 0
    # The first broker's epoch is now stale at the targets: it cannot come back as a second active.
    reply = heartbeat(broker_a, active=True, epoch=1)
    assert (reply.state, reply.unavailabilityCode) == ("Unavailable", "STALE_EPOCH")


def test_partitioned_active_fences_itself_and_the_new_active_carries_on(
    processes: ProcessSet, tmp_path: Path
) -> None:
    streams, per_stream = 20, 200
    first, second = reserve_address(), reserve_address()
    cloud = processes.start_cloud_simulator(tmp_path)
    backend = processes.start_backend_simulator(
        tmp_path,
        broker_urls=[first.url, second.url],
        streams=streams,
        messages_per_stream=per_stream,
        extra_args=["--request-timeout-seconds", "1"],
    )
    common: dict[str, Any] = {"backend_url": backend.url, "cloud_url": cloud.url, "lease_seconds": 1.0}
    broker_a = processes.start_broker(tmp_path, name="broker-a", host=first.host, port=first.port, **common)
    broker_b = processes.start_broker(tmp_path, name="broker-b", host=second.host, port=second.port, **common)
    assert heartbeat(broker_a, active=True, epoch=1).state == "Active"
    start_sending(backend)
    total = streams * per_stream
    wait_until(lambda: cloud_taken(cloud.url) > total // 5, 60, 0.05, what="traffic flowing")

    broker_a.kill(signal.SIGSTOP)  # a partition: the operator cannot reach it, it cannot act
    time.sleep(1.5)  # the operator waits out leaseSeconds (plus a margin) before failing over
    assert heartbeat(broker_b, active=True, epoch=2).state == "Active"
    broker_a.kill(signal.SIGCONT)  # the partition heals with A still believing it is active

    # The operator's part: renew B's 1 s lease while the rest goes through it (however slow CI is).
    with Renewals(broker_b, 2) as renewals:
        try:
            wait_until(lambda: backend_status(backend)["allConfirmed"], 90, 0.2, what="all confirmed via B")
        except AssertionError as timed_out:
            # A lapsed lease fences B for good: say whether the test's own renewals failed.
            failed = renewals.failures[-3:]
            raise AssertionError(f"{timed_out}; renewals of B that failed: {failed}") from None
    assert_complete_and_ordered(cloud_received(cloud), streams, per_stream, "orders-")
    # A fences itself: its lease ran out while it was stopped, or a target refused its old epoch first.
    wait_until(lambda: "deactivated (epoch 1)" in broker_a.log_text(), 10, what="A fenced itself")
    assert metric(broker_a, "broker_active") == 0
    assert backend_status(backend)["rewindsBelowConfirmed"] == 0
    # A's fenced term stays fenced: a renewal at epoch 1 (say, a late copy) cannot revive it.
    reply = heartbeat(broker_a, active=True, epoch=1)
    assert (reply.state, reply.unavailabilityCode) == ("Unavailable", "LEASE_EXPIRED")
