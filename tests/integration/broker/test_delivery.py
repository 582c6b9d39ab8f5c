"""Outbound and inbound delivery through one real broker: seq rules, order and no loss under load."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from broker_contracts import message_log
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import (
    assert_complete_and_ordered,
    backend_status,
    cloud_received,
    get_json,
    heartbeat,
    post_bundle,
    sim_json,
    start_sending,
    wait_until,
)

pytestmark = pytest.mark.integration


def statuses(reply: bytes) -> list[tuple[str, int, str, int | None]]:
    found = re.findall(
        rb"<tns:stream>([^<]*)</tns:stream><tns:seq>(\d+)</tns:seq><tns:status>(\w+)</tns:status>"
        rb"(?:<tns:expectedSeq>(\d+)</tns:expectedSeq>)?",
        reply,
    )
    return [(s.decode(), int(q), st.decode(), int(e) if e else None) for s, q, st, e in found]


def test_next_seq_accepted_old_reacknowledged_gap_refused(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path, streams=0)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    url = relay.broker.soap_url

    first = build_envelope("acme", "1000", [("s", 1, "m1", "a"), ("s", 2, "m2", "b"), ("t", 1, "n1", "c")])
    assert statuses(post_bundle(url, first)[1]) == [
        ("s", 1, "Accepted", None),
        ("s", 2, "Accepted", None),
        ("t", 1, "Accepted", None),
    ]
    again = build_envelope("acme", "1000", [("s", 2, "m2", "b"), ("s", 3, "m3", "d"), ("s", 5, "m5", "f")])
    assert statuses(post_bundle(url, again)[1]) == [
        ("s", 2, "Duplicate", None),
        ("s", 3, "Accepted", None),
        ("s", 5, "Gap", 4),
    ]
    wait_until(lambda: sum(map(len, cloud_received(relay.cloud).values())) == 4, 10, what="cloud got 4")
    assert cloud_received(relay.cloud) == {"s": [1, 2, 3], "t": [1]}


def test_many_streams_concurrent_load_arrive_in_order_without_loss(
    processes: ProcessSet, tmp_path: Path
) -> None:
    streams, per_stream = 60, 150
    relay = start_relay(
        processes,
        tmp_path,
        streams=streams,
        messages_per_stream=per_stream,
        backend_args={"lanes": 6, "per_stream_in_bundle": 7, "payload_bytes": 300},
        broker_args={"message_log_dir": tmp_path / "store"},
    )
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    start_sending(relay.backend)

    wait_until(lambda: backend_status(relay.backend)["allConfirmed"], 90, 0.2, what="all confirmed")

    assert_complete_and_ordered(cloud_received(relay.cloud), streams, per_stream, "orders-")
    status = backend_status(relay.backend)
    assert status["gaps"] == 0 and status["rewindsBelowConfirmed"] == 0
    assert get_json(relay.cloud.url + "/sim/status")["outboundDuplicates"] == 0

    # The message log of that run: closed segments, valid records, every message accepted and delivered once.
    assert heartbeat(relay.broker, active=False, epoch=1).state == "Inactive"
    segments = sorted(
        (tmp_path / "store" / "acme-1000" / "broker-0").glob("*" + message_log.CLOSED_SEGMENT_SUFFIX)
    )
    assert segments
    assert not list((tmp_path / "store").rglob("*" + message_log.OPEN_SEGMENT_SUFFIX))
    counts: dict[str, int] = {}
    for segment in segments:
        for line in segment.read_bytes().splitlines(keepends=True):
            record = message_log.decode(line)
            counts[record["event"]] = counts.get(record["event"], 0) + 1
    total = streams * per_stream
    assert counts["accepted"] == counts["delivered"] == counts["confirmed"] == total
    assert counts["forwarded"] >= total
    assert counts["activated"] == counts["deactivated"] == 1


@pytest.mark.parametrize("tls", [False, True], ids=["http", "tls"])
def test_inbound_messages_reach_the_backend_in_order_and_are_confirmed(
    processes: ProcessSet, tmp_path: Path, tls: bool, request: pytest.FixtureRequest
) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        streams=0,
        cloud_args={"inbound_streams": 12, "inbound_messages_per_stream": 80},
        pki=request.getfixturevalue("local_pki") if tls else None,
    )
    assert relay.cloud.url.startswith("https://" if tls else "http://")
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"

    wait_until(lambda: sim_json(relay.cloud, "/sim/status")["inboundAllConfirmed"], 60, 0.2, what="inbound")

    received = sim_json(relay.backend, "/sim/received")
    assert_complete_and_ordered(received, 12, 80, "invoices-")
    assert backend_status(relay.backend)["inboundDuplicates"] == 0


def test_inactive_broker_does_not_poll(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(
        processes, tmp_path, streams=0, cloud_args={"inbound_streams": 2, "inbound_messages_per_stream": 5}
    )
    time.sleep(0.5)  # a quiet interval: nothing may happen in it
    assert get_json(relay.cloud.url + "/sim/status")["polls"] == 0
    assert backend_status(relay.backend)["inboundTaken"] == 0
