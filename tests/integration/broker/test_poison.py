"""Poison messages under both onPoison policies, in both directions, and the admin replay/discard."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import zeep

from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import (
    backend_status,
    cloud_received,
    fault_code,
    get_json,
    heartbeat,
    soap_service,
    start_sending,
    wait_until,
)

pytestmark = pytest.mark.integration

FAST_RETRIES = ["--retry-base-seconds", "0.02", "--retry-max-seconds", "0.1"]


def held(service: zeep.proxy.ServiceProxy) -> list[tuple[str, str, int, int]]:
    return [(h.direction, h.stream, h.seq, h.attempts) for h in service.ListHeld() or []]


def test_outbound_block_stream_holds_and_replay_releases(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        streams=3,
        messages_per_stream=20,
        backend_args={"poison": ["orders-0001:5:3"]},  # refused three times, then taken
        broker_args={"max_deliveries": 2, "on_poison": "BlockStream", "extra_args": FAST_RETRIES},
    )
    service = soap_service(relay.broker)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    start_sending(relay.backend)

    wait_until(lambda: held(service), 20, what="a held message")
    assert held(service) == [("outbound", "orders-0001", 5, 2)]
    wait_until(
        lambda: len(cloud_received(relay.cloud).get("orders-0002", [])) == 20, 20, what="other streams"
    )
    received = cloud_received(relay.cloud)
    assert received["orders-0001"] == [1, 2, 3, 4]  # stopped at the poison message
    assert received["orders-0000"] == list(range(1, 21))
    assert not backend_status(relay.backend)["allConfirmed"]

    reply = service.ReplayHeld(direction="outbound", stream="orders-0001", seq=5)
    assert reply.done is True

    wait_until(lambda: backend_status(relay.backend)["allConfirmed"], 20, what="stream released")
    assert cloud_received(relay.cloud)["orders-0001"] == list(range(1, 21))
    assert held(service) == []


def test_outbound_hold_parks_the_message_and_discard_lets_the_backend_forget_it(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        streams=2,
        messages_per_stream=15,
        backend_args={"poison": ["orders-0001:5:always"]},
        broker_args={"max_deliveries": 3, "on_poison": "Hold", "extra_args": FAST_RETRIES},
    )
    service = soap_service(relay.broker)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    start_sending(relay.backend)

    expected_rest = [s for s in range(1, 16) if s != 5]
    wait_until(
        lambda: cloud_received(relay.cloud).get("orders-0001") == expected_rest, 20, what="stream went on"
    )
    assert held(service) == [("outbound", "orders-0001", 5, 3)]
    # The held message is kept: the backend has not had it (or anything after it) confirmed.
    assert backend_status(relay.backend)["cursors"]["orders-0001"] == 5

    with pytest.raises(zeep.exceptions.Fault) as missing:
        service.DiscardHeld(direction="outbound", stream="orders-0001", seq=6)
    assert fault_code(missing.value) == "NOT_FOUND"
    assert service.DiscardHeld(direction="outbound", stream="orders-0001", seq=5).done is True

    wait_until(lambda: backend_status(relay.backend)["allConfirmed"], 20, what="confirmed past the discard")
    assert held(service) == []
    assert 5 not in cloud_received(relay.cloud)["orders-0001"]


def test_inbound_block_stream_then_discard(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        streams=0,
        cloud_args={
            "inbound_streams": 2,
            "inbound_messages_per_stream": 10,
            "poison": ["invoices-0000:3:always"],
        },
        broker_args={"max_deliveries": 2, "on_poison": "BlockStream", "extra_args": FAST_RETRIES},
    )
    service = soap_service(relay.broker)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"

    wait_until(lambda: held(service), 20, what="inbound held")
    assert held(service) == [("inbound", "invoices-0000", 3, 2)]
    wait_until(
        lambda: len(get_json(relay.backend.url + "/sim/received").get("invoices-0001", [])) == 10,
        20,
        what="other",
    )
    assert get_json(relay.backend.url + "/sim/received")["invoices-0000"] == [1, 2]

    assert service.DiscardHeld(direction="inbound", stream="invoices-0000", seq=3).done is True

    wait_until(lambda: get_json(relay.cloud.url + "/sim/status")["inboundAllConfirmed"], 20, what="discarded")
    assert get_json(relay.backend.url + "/sim/received")["invoices-0000"] == [1, 2, 4, 5, 6, 7, 8, 9, 10]


def test_inbound_hold_then_replay_delivers_it(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        streams=0,
        cloud_args={"inbound_streams": 1, "inbound_messages_per_stream": 8, "poison": ["invoices-0000:3:2"]},
        broker_args={"max_deliveries": 2, "on_poison": "Hold", "extra_args": FAST_RETRIES},
    )
    service = soap_service(relay.broker)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"

    rest = [1, 2, 4, 5, 6, 7, 8]
    wait_until(
        lambda: get_json(relay.backend.url + "/sim/received").get("invoices-0000") == rest, 20, what="went on"
    )
    assert held(service) == [("inbound", "invoices-0000", 3, 2)]
    assert not get_json(relay.cloud.url + "/sim/status")["inboundAllConfirmed"]  # the cloud still keeps it

    assert service.ReplayHeld(direction="inbound", stream="invoices-0000", seq=3).done is True

    wait_until(lambda: get_json(relay.cloud.url + "/sim/status")["inboundAllConfirmed"], 20, what="replayed")
    assert get_json(relay.backend.url + "/sim/received")["invoices-0000"] == [*rest, 3]


def test_a_cloud_outage_is_retried_and_never_turns_messages_into_poison(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        streams=4,
        messages_per_stream=100,
        broker_args={"max_deliveries": 1, "extra_args": [*FAST_RETRIES, "--relay-timeout-seconds", "0.5"]},
    )
    service = soap_service(relay.broker)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    relay.cloud.kill(signal.SIGSTOP)  # the cloud hangs: every forward times out
    start_sending(relay.backend)
    wait_until(lambda: backend_status(relay.backend)["accepted"] > 0, 20, what="bundles accepted meanwhile")
    time.sleep(1.5)  # several timed-out forwards: with maxDeliveries=1 any counted attempt would hold
    heartbeat(relay.broker, active=True, epoch=1)  # keep the lease
    relay.cloud.kill(signal.SIGCONT)

    wait_until(lambda: backend_status(relay.backend)["allConfirmed"], 30, what="delivered after the outage")
    assert held(service) == []
    assert {name: seqs == list(range(1, 101)) for name, seqs in cloud_received(relay.cloud).items()} == {
        f"orders-{i:04d}": True for i in range(4)
    }
