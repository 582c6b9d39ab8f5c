"""Held messages are journaled: kill -9 keeps them, and a failover re-detects rather than inherits.

What is decided (docs/broker.md, "Delivery failures and poison"):

* A broker's holds survive its own crash: after kill -9 and a restart, ``ListHeld`` answers
  exactly as before (same attempts, same ``heldSince``), before and after activation, and the
  held message is not tried again until an operator replays it.
* Brokers do not share journals, so a new active knows nothing of the old one's holds. The
  sources still have every held message (the backend was never confirmed past it, the cloud
  was never confirmed it), so the new active receives it again, tries it ``maxDeliveries``
  times and holds it under its own count.
* A broker that becomes active again reconciles its journaled holds with the sources: a hold
  another broker resolved (the backend's resend cursor is past it, or the cloud no longer
  offers it) is dropped instead of blocking its stream forever.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import zeep

from broker_simulators.local_processes import ProcessSet, RunningProcess
from tests.integration.broker.conftest import reserve_address, start_relay
from tests.integration.broker.helpers import (
    backend_status,
    cloud_received,
    get_json,
    heartbeat,
    post_json,
    soap_service,
    start_sending,
    wait_until,
)

pytestmark = pytest.mark.integration

FAST_RETRIES = ["--retry-base-seconds", "0.02", "--retry-max-seconds", "0.1"]
HeldView = tuple[str, str, int, str, int, str, str]


def held(broker: RunningProcess) -> list[HeldView]:
    """Every field ``ListHeld`` answers, so "the same" means the same attempts and ``heldSince``."""
    service: Any = soap_service(broker)
    return [
        (h.direction, h.stream, h.seq, h.msgId, h.attempts, h.lastError, h.heldSince.isoformat())
        for h in service.ListHeld() or []
    ]


def refusals(relay_target: RunningProcess, field: str) -> int:
    return int(get_json(relay_target.url + "/sim/status")[field])


@pytest.mark.parametrize("policy", ["BlockStream", "Hold"])
def test_outbound_holds_survive_kill_9_and_are_not_tried_again(
    processes: ProcessSet, tmp_path: Path, policy: str
) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        streams=2,
        messages_per_stream=10,
        backend_args={"poison": ["orders-0001:5:always"]},
        broker_args={"max_deliveries": 2, "on_poison": policy, "extra_args": FAST_RETRIES},
    )
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    start_sending(relay.backend)
    wait_until(lambda: held(relay.broker), 20, what="a held message")
    wait_until(
        lambda: cloud_received(relay.cloud).get("orders-0000") == list(range(1, 11)), 20, what="other stream"
    )
    before = held(relay.broker)
    assert [h[:5] for h in before] == [("outbound", "orders-0001", 5, "orders-0001-5", 2)]
    rejected = refusals(relay.cloud, "outboundRejected")
    assert rejected == 2

    # Twice: the first restart reads the records as written, the second the snapshot the first
    # compacted the journal to.
    for _ in range(2):
        relay.broker.kill(signal.SIGKILL)
        relay.broker.restart()
        assert held(relay.broker) == before  # inactive, straight from the journal
    assert heartbeat(relay.broker, active=True, epoch=2).state == "Active"
    expected = [1, 2, 3, 4] if policy == "BlockStream" else [s for s in range(1, 11) if s != 5]
    wait_until(
        lambda: cloud_received(relay.cloud).get("orders-0001") == expected, 20, what="stream as before"
    )
    time.sleep(1.0)  # many retry periods: a hold forgotten by the restart would be tried and held again
    assert held(relay.broker) == before
    assert refusals(relay.cloud, "outboundRejected") == rejected
    assert backend_status(relay.backend)["cursors"]["orders-0001"] == 5  # still kept by the backend

    # The restored hold is a real one: discarding it lets the backend forget the message.
    assert soap_service(relay.broker).DiscardHeld(direction="outbound", stream="orders-0001", seq=5).done
    wait_until(lambda: backend_status(relay.backend)["allConfirmed"], 20, what="confirmed past the discard")
    assert 5 not in cloud_received(relay.cloud)["orders-0001"]

    relay.broker.kill(signal.SIGKILL)
    relay.broker.restart()
    assert held(relay.broker) == []


def test_inbound_holds_survive_kill_9_and_replay_still_works(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        streams=0,
        cloud_args={"inbound_streams": 2, "inbound_messages_per_stream": 8, "poison": ["invoices-0000:3:2"]},
        broker_args={"max_deliveries": 2, "on_poison": "BlockStream", "extra_args": FAST_RETRIES},
    )
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    wait_until(lambda: held(relay.broker), 20, what="inbound held")
    wait_until(
        lambda: get_json(relay.backend.url + "/sim/received").get("invoices-0001") == list(range(1, 9)),
        20,
        what="the other stream",
    )
    before = held(relay.broker)
    assert [h[:5] for h in before] == [("inbound", "invoices-0000", 3, "invoices-0000-3", 2)]
    rejected = refusals(relay.backend, "inboundRejected")

    for _ in range(2):  # the records as written, then the compacted snapshot
        relay.broker.kill(signal.SIGKILL)
        relay.broker.restart()
        assert held(relay.broker) == before
    assert heartbeat(relay.broker, active=True, epoch=2).state == "Active"
    time.sleep(1.0)  # the cloud offers seq 3 on every poll; a forgotten hold would be delivered again
    assert held(relay.broker) == before
    assert refusals(relay.backend, "inboundRejected") == rejected
    assert get_json(relay.backend.url + "/sim/received")["invoices-0000"] == [1, 2]

    # The poison was refused twice and is taken the third time: a replay after the restart delivers it.
    assert soap_service(relay.broker).ReplayHeld(direction="inbound", stream="invoices-0000", seq=3).done
    wait_until(lambda: get_json(relay.cloud.url + "/sim/status")["inboundAllConfirmed"], 20, what="replayed")
    assert get_json(relay.backend.url + "/sim/received")["invoices-0000"] == list(range(1, 9))
    relay.broker.kill(signal.SIGKILL)
    relay.broker.restart()
    assert held(relay.broker) == []


def two_brokers(processes: ProcessSet, tmp_path: Path, **relay: Any) -> tuple[Any, ...]:
    first, second = reserve_address(), reserve_address()
    cloud = processes.start_cloud_simulator(tmp_path, **relay.get("cloud_args", {}))
    backend = processes.start_backend_simulator(
        tmp_path, broker_urls=[first.url, second.url], **relay.get("backend_args", {})
    )
    common: dict[str, Any] = {
        "backend_url": backend.url,
        "cloud_url": cloud.url,
        "max_deliveries": 2,
        "extra_args": FAST_RETRIES,
        **relay.get("broker_args", {}),
    }
    broker_a = processes.start_broker(tmp_path, name="broker-a", host=first.host, port=first.port, **common)
    broker_b = processes.start_broker(tmp_path, name="broker-b", host=second.host, port=second.port, **common)
    return backend, cloud, broker_a, broker_b


def test_a_new_active_re_detects_outbound_holds_and_the_old_one_drops_what_was_resolved(
    processes: ProcessSet, tmp_path: Path
) -> None:
    backend, cloud, broker_a, broker_b = two_brokers(
        processes,
        tmp_path,
        backend_args={"streams": 2, "messages_per_stream": 10, "poison": ["orders-0001:5:always"]},
        broker_args={"on_poison": "Hold"},
    )
    assert heartbeat(broker_a, active=True, epoch=1).state == "Active"
    start_sending(backend)
    wait_until(lambda: held(broker_a), 20, what="A holds the poison message")
    held_by_a = held(broker_a)

    # Failover: A is known inactive first, then B is activated with the next epoch.
    assert heartbeat(broker_a, active=False, epoch=1).state == "Inactive"
    assert heartbeat(broker_b, active=True, epoch=2).state == "Active"
    # B was not told about A's hold: the backend resends the message, B tries it maxDeliveries
    # times itself and holds it under its own count (2, not A's 2 plus B's 2).
    wait_until(lambda: held(broker_b), 20, what="B re-detects the hold")
    (held_by_b,) = held(broker_b)
    assert held_by_b[:5] == ("outbound", "orders-0001", 5, "orders-0001-5", 2)
    assert held_by_b[6] >= held_by_a[0][6]
    assert refusals(cloud, "outboundRejected") == 4
    assert held(broker_a) == held_by_a  # A's journal still says what A did

    assert soap_service(broker_b).DiscardHeld(direction="outbound", stream="orders-0001", seq=5).done
    wait_until(lambda: backend_status(backend)["allConfirmed"], 20, what="B confirmed past the discard")

    # Failback: the backend's resend cursor is past seq 5, so A drops the hold B resolved.
    assert heartbeat(broker_b, active=False, epoch=2).state == "Inactive"
    assert heartbeat(broker_a, active=True, epoch=3).state == "Active"
    assert held(broker_a) == []
    post_json(backend.url + "/sim/produce", {"count": 3})
    wait_until(lambda: backend_status(backend)["allConfirmed"], 20, what="A carries on")
    assert cloud_received(cloud)["orders-0001"] == [s for s in range(1, 14) if s != 5]
    assert refusals(cloud, "outboundRejected") == 4


def test_an_inbound_hold_resolved_by_another_broker_does_not_block_the_stream_after_failback(
    processes: ProcessSet, tmp_path: Path
) -> None:
    backend, cloud, broker_a, broker_b = two_brokers(
        processes,
        tmp_path,
        backend_args={"streams": 0},
        cloud_args={
            "inbound_streams": 1,
            "inbound_messages_per_stream": 6,
            "poison": ["invoices-0000:3:always"],
        },
        broker_args={"on_poison": "BlockStream"},
    )
    assert heartbeat(broker_a, active=True, epoch=1).state == "Active"
    wait_until(lambda: held(broker_a), 20, what="A holds the poison message")
    assert heartbeat(broker_a, active=False, epoch=1).state == "Inactive"
    # A kill -9 on top: what A knows of its hold now lives only in its journal.
    broker_a.kill(signal.SIGKILL)
    broker_a.restart()
    assert [h[:3] for h in held(broker_a)] == [("inbound", "invoices-0000", 3)]

    assert heartbeat(broker_b, active=True, epoch=2).state == "Active"
    wait_until(lambda: held(broker_b), 20, what="B re-detects the hold")
    assert [h[:5] for h in held(broker_b)] == [("inbound", "invoices-0000", 3, "invoices-0000-3", 2)]
    assert soap_service(broker_b).DiscardHeld(direction="inbound", stream="invoices-0000", seq=3).done
    received = lambda: get_json(backend.url + "/sim/received").get("invoices-0000")  # noqa: E731
    wait_until(lambda: received() == [1, 2, 4, 5, 6], 20, what="B delivers past the discard")

    assert heartbeat(broker_b, active=False, epoch=2).state == "Inactive"
    assert heartbeat(broker_a, active=True, epoch=3).state == "Active"
    post_json(cloud.url + "/sim/produce", {"count": 3})
    # The cloud no longer offers seq 3 (B had it discarded): A's hold is stale, and A drops it
    # instead of filtering the stream from seq 3 on forever.
    wait_until(lambda: received() == [1, 2, 4, 5, 6, 7, 8, 9], 20, what="A delivers the new messages")
    assert held(broker_a) == []
    with pytest.raises(zeep.exceptions.Fault):
        soap_service(broker_a).ReplayHeld(direction="inbound", stream="invoices-0000", seq=3)
