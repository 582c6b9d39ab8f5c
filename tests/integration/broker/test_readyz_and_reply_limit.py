"""What a broker tells an anonymous caller, and how much of a target's reply it reads.

``/readyz`` is open to anyone who reaches the pod's main port: it says ready or not ready with a
stable code, never the journal's error (a path, an errno, a record's bytes); the details go to the
broker's log. The broker's calls to the backend and the cloud read at most
``--relay-reply-limit-bytes`` of a reply: a target that sends more (here 64 MiB without a
Content-Length, from a real loopback server) is a clear, retried error, and the broker stops
reading it rather than holding it all in memory first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.helpers import DEFAULT_TOKEN, get_text, heartbeat, wait_until
from tests.integration.broker.target_standin import Mode, TargetStandIn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MARKER = "journal-detail-marker"


def test_readyz_answers_a_stable_code_and_logs_the_detail(processes: ProcessSet, tmp_path: Path) -> None:
    data = tmp_path / f"data-{MARKER}"
    data.mkdir()
    (data / "journal").write_text("not a directory\n")  # the journal cannot be opened
    broker = processes.start_broker(tmp_path, data_dir=data)
    status, body = get_text(broker.url + "/readyz")
    assert (status, body) == (503, "not ready: JOURNAL_ERROR\n")
    assert MARKER in broker.log_text()  # the detail is for the operator of the pod, in its log


def test_readyz_answers_ready_when_the_journal_is_open(processes: ProcessSet, tmp_path: Path) -> None:
    broker = processes.start_broker(tmp_path)
    assert get_text(broker.url + "/readyz") == (200, "ready\n")


@pytest.fixture
def targets() -> Iterator[tuple[TargetStandIn, TargetStandIn]]:
    backend, cloud = TargetStandIn(), TargetStandIn()
    try:
        yield backend, cloud
    finally:
        backend.close()
        cloud.close()


def test_a_reply_above_the_limit_is_refused_and_not_read_to_its_end(
    processes: ProcessSet, tmp_path: Path, targets: tuple[TargetStandIn, TargetStandIn]
) -> None:
    backend, cloud = targets
    broker = processes.start_broker(
        tmp_path,
        backend_url=backend.url(path="/erp"),
        cloud_url=cloud.url(path="/cloud"),
        extra_args=["--relay-reply-limit-bytes", str(1024 * 1024), "--retry-max-seconds", "0.2"],
    )
    # Activating: the cloud's health probe answers 64 MiB.
    cloud.mode = Mode.HUGE
    reply = heartbeat(broker, active=True, epoch=1)
    assert (reply.state, reply.unavailabilityCode) == ("Unavailable", "CLOUD_UNREACHABLE"), reply
    assert "1048576 bytes" in reply.unavailabilityMessage and "--relay-reply-limit-bytes" in (
        reply.unavailabilityMessage
    ), reply.unavailabilityMessage
    assert cloud.huge_sent < cloud.huge_bytes  # the broker hung up; it did not read to the end

    # Active: a poll answered with 64 MiB is a failed poll, retried, and the broker stays up.
    cloud.mode = Mode.OK
    assert heartbeat(broker, active=True, epoch=2).state == "Active"
    cloud.mode = Mode.HUGE
    wait_until(
        lambda: (
            "inbound relay failed" in broker.log_text() and "--relay-reply-limit-bytes" in broker.log_text()
        ),
        30,
        what="the oversized poll reply refused in the log",
    )
    cloud.mode = Mode.OK
    assert broker.alive
    assert heartbeat(broker, active=True, epoch=2, token=DEFAULT_TOKEN).state == "Active"
