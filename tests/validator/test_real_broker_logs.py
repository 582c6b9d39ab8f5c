"""Logs written by real brokers validate clean, and the verdict agrees with the targets' records.

Three real ``broker-service`` processes share one message-log store, with the backend and cloud
simulators on loopback, traffic both ways, a ``kill -9`` of the active mid-traffic (so deliveries
the killed broker could not log are proven by the next active's ``deduplicated`` records), then a
planned switchover. The simulators' own records of what the targets took are the ground truth.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker_contracts.message_log import CLOSED_SEGMENT_SUFFIX, decode
from broker_simulators.local_processes import ProcessSet, RunningProcess, free_port, loopback_host
from broker_validator.job import validate_store
from broker_validator.report_schema import Anomaly
from tests.integration.broker.helpers import (
    Renewals,
    assert_complete_and_ordered,
    backend_status,
    cloud_received,
    get_json,
    heartbeat,
    start_sending,
    wait_until,
)

pytestmark = pytest.mark.integration

STREAMS, PER_STREAM = 12, 300
INBOUND_STREAMS, INBOUND_PER_STREAM = 4, 150


def start_relay_with_brokers(
    processes: ProcessSet,
    tmp_path: Path,
    count: int,
    *,
    lease_seconds: float | None = None,
    **cloud_args: Any,
) -> tuple[RunningProcess, RunningProcess, list[RunningProcess]]:
    """The cloud and backend simulators and ``count`` brokers of cluster acme-1000 sharing the
    message-log store ``tmp_path / "store"``; the backend knows every broker."""
    addresses = [(host, free_port(host)) for host in (loopback_host() for _ in range(count))]
    cloud = processes.start_cloud_simulator(tmp_path, **cloud_args)
    backend = processes.start_backend_simulator(
        tmp_path,
        broker_urls=[f"http://{host}:{port}" for host, port in addresses],
        streams=STREAMS,
        messages_per_stream=PER_STREAM,
        extra_args=["--request-timeout-seconds", "1"],
    )
    common: dict[str, Any] = {
        "backend_url": backend.url,
        "cloud_url": cloud.url,
        "cluster": "acme-1000",
        "message_log_dir": tmp_path / "store",
    }
    if lease_seconds is not None:
        common["lease_seconds"] = lease_seconds
    brokers = [
        processes.start_broker(tmp_path, name=f"broker-{i}", host=host, port=port, **common)
        for i, (host, port) in enumerate(addresses)
    ]
    return cloud, backend, brokers


def outbound_taken(cloud_url: str) -> int:
    return int(get_json(cloud_url + "/sim/status")["outboundTaken"])


def test_kill_9_and_switchover_logs_validate_clean_and_match_the_targets(
    spark: SparkSession, processes: ProcessSet, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    cloud_args = {"inbound_streams": INBOUND_STREAMS, "inbound_messages_per_stream": INBOUND_PER_STREAM}
    cloud, backend, (a, b, c) = start_relay_with_brokers(processes, tmp_path, 3, **cloud_args)
    assert heartbeat(a, active=True, epoch=1).state == "Active"
    start_sending(backend)
    total = STREAMS * PER_STREAM
    wait_until(lambda: outbound_taken(cloud.url) > total // 4, 60, 0.02, what="traffic flowing")

    a.kill(signal.SIGKILL)  # mid-bundle: some deliveries reach the cloud and never reach a's log
    assert heartbeat(b, active=True, epoch=2).state == "Active"
    wait_until(lambda: outbound_taken(cloud.url) > total // 2, 60, 0.02, what="traffic through b")
    assert heartbeat(b, active=False, epoch=2).state == "Inactive"  # a planned switchover
    assert heartbeat(c, active=True, epoch=3).state == "Active"
    wait_until(lambda: backend_status(backend)["allConfirmed"], 90, 0.2, what="all outbound confirmed")
    wait_until(
        lambda: (
            sum(map(len, get_json(backend.url + "/sim/received").values()))
            == INBOUND_STREAMS * INBOUND_PER_STREAM
        ),
        90,
        0.2,
        what="all inbound delivered",
    )
    received = cloud_received(cloud)
    assert_complete_and_ordered(received, STREAMS, PER_STREAM, "orders-")
    inbound = get_json(backend.url + "/sim/received")

    # Brokers close their segments when they stop; the killed one closes its leftover at restart.
    assert heartbeat(c, active=False, epoch=3).state == "Inactive"
    a.restart()
    for broker in (a, b, c):
        broker.stop()

    report = validate_store(spark, store, tmp_path / "report", full=True, settle_seconds=60)

    cluster = report["clusters"]["acme-1000"]
    assert report["result"] == "Passed", cluster["examples"]
    assert report["violations"] == 0
    assert cluster["anomalies"][Anomaly.CRASHED_TERM] == 1  # a's term 1, cut off by kill -9
    assert cluster["anomalies"][Anomaly.MALFORMED] == 0
    assert [(f["fromBroker"], f["toBroker"]) for f in cluster["failovers"]] == [
        ("broker-0", "broker-1"),
        ("broker-1", "broker-2"),
    ]
    # The verdict agrees with the ground truth, stream by stream.
    assert cluster["messages"] == {"outbound": total, "inbound": INBOUND_STREAMS * INBOUND_PER_STREAM}
    by_stream = {(s["direction"], s["stream"]): s for s in cluster["streams"]}
    for name, seqs in received.items():
        summary = by_stream[("outbound", name)]
        assert (summary["delivered"], summary["lastSeq"]) == (len(seqs), max(seqs))
    for name, seqs in inbound.items():
        summary = by_stream[("inbound", name)]
        assert (summary["delivered"], summary["lastSeq"]) == (len(seqs), max(seqs))
    assert cluster["latencyMs"]["outbound"]["count"] > 0


def test_a_paused_active_reading_its_last_answer_late_is_no_split_brain(
    spark: SparkSession, processes: ProcessSet, tmp_path: Path
) -> None:
    """The active is stopped (SIGSTOP, as a long GC pause or a frozen VM would) with a bundle at the
    cloud; the cloud answers into its socket; the operator waits out the lease and activates
    another. Resumed, the old active reads the answer after its term and must do nothing more:
    it dates that answer's records by its last term check (before the call), so no record of it
    but ``deactivated`` comes after the new term's ``activated``, and the validator finds no
    split brain (it did: the answer was logged when read, and a soak reported a split brain)."""
    store = tmp_path / "store"
    cloud, backend, (a, b) = start_relay_with_brokers(processes, tmp_path, 2, lease_seconds=1.0)
    assert heartbeat(a, active=True, epoch=1).state == "Active"
    renewals_of_a = Renewals(a, 1).start()  # stopped below, when the operator loses a
    start_sending(backend)
    wait_until(lambda: outbound_taken(cloud.url) > STREAMS * PER_STREAM // 4, 60, 0.02, what="traffic")

    cloud.kill(signal.SIGSTOP)
    try:
        time.sleep(0.3)  # a's forwarder sends its next bundle into the stopped cloud's socket (setup)
        renewals_of_a.stop()  # the operator loses a...
        a.kill(signal.SIGSTOP)  # ...which is paused with that bundle in flight
    finally:
        cloud.kill(signal.SIGCONT)  # the cloud takes the bundle and answers into a's socket
    time.sleep(1.5)  # the operator waits out a's 1 s lease (setup, not an assertion)
    assert heartbeat(b, active=True, epoch=2).state == "Active"
    a.kill(signal.SIGCONT)

    with Renewals(b, 2):
        wait_until(lambda: backend_status(backend)["allConfirmed"], 90, 0.2, what="all confirmed via b")
    assert_complete_and_ordered(cloud_received(cloud), STREAMS, PER_STREAM, "orders-")
    assert heartbeat(b, active=False, epoch=2).state == "Inactive"
    for broker in (a, b):
        broker.stop()

    records = [
        decode(line)
        for path in sorted(store.rglob("*" + CLOSED_SEGMENT_SUFFIX))
        for line in path.read_bytes().splitlines()
    ]
    (b_activated,) = [r["ts"] for r in records if r["event"] == "activated" and r["broker"] == "broker-1"]
    late = [r for r in records if r["broker"] == "broker-0" and r["ts"] > b_activated]
    assert {r["event"] for r in late} <= {"deactivated"}, late[:5]
    # The scenario happened: a read the cloud's answer after its term had lapsed.
    assert "read the cloud's answer after this broker's term had lapsed" in a.log_text()

    report = validate_store(spark, store, tmp_path / "report", full=True, settle_seconds=60)
    cluster = report["clusters"]["acme-1000"]
    assert report["result"] == "Passed", cluster["examples"]
    assert cluster["anomalies"][Anomaly.SPLIT_BRAIN] == 0
    assert cluster["messages"]["outbound"] == STREAMS * PER_STREAM
