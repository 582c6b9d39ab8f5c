"""The handover renewal on a real broker process (issue 40): one Heartbeat carrying ``leaseSeconds``.

A stopping operator sends its active one renewal with a longer lease, then nothing: the broker
must stay Active past its normal lease, and fence itself once the granted lease (capped at
``--max-lease-seconds``) runs out. An activation and a check carrying the element get nothing
from it. Short leases (0.6 s, at most 3 s); the asserts are on states and on the broker's own
reasons, never on how long anything took.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker_simulators.local_processes import DEFAULT_TOKEN, ProcessSet
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import metric, soap_service, wait_until

pytestmark = pytest.mark.integration

LEASE, MAX_LEASE = 0.6, 3.0
HUGE = 1e9  # far above the maximum: capped, not refused
HANDOVER_FENCE = "lease expired: no active=true heartbeat for 3s (the lease a handover renewal granted)"
NORMAL_FENCE = "lease expired: no active=true heartbeat for 0.6s"


def test_one_handover_renewal_keeps_the_active_past_its_lease_until_the_capped_one_runs_out(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(
        processes,
        tmp_path,
        broker_args={"lease_seconds": LEASE, "max_lease_seconds": MAX_LEASE},
    )
    broker = relay.broker
    service = soap_service(broker)  # built before the clock matters: it fetches the WSDL

    def beat(epoch: int, **extra: object) -> tuple[str, str | None]:
        reply = service.Heartbeat(active=True, epoch=epoch, operatorId="test-operator", **extra)
        return reply.state, reply.unavailabilityCode

    def fenced(reason: str) -> bool:
        return f"fencing itself at epoch {epoch}: {reason}" in broker.log_text()

    # An activation asking a long lease, and a check asking one, get the normal lease.
    epoch = 1
    assert beat(epoch, leaseSeconds=HUGE) == ("Active", None)
    assert beat(epoch, renewLease=False, leaseSeconds=HUGE) == ("Active", None)
    wait_until(lambda: fenced(NORMAL_FENCE), 10, what="the normal lease running out")
    assert "by a handover renewal" not in broker.log_text()

    # A renewal of the Active term at its epoch is the handover: then nothing more is sent.
    epoch = 2
    assert beat(epoch) == ("Active", None)
    sent = time.monotonic()
    assert beat(epoch, leaseSeconds=HUGE) == ("Active", None)
    # Past the normal lease and its margin, well inside the granted 3 s, with no Heartbeat since
    # (/metrics is no heartbeat): still Active, on the handover's lease alone.
    time.sleep(max(0.0, sent + 2 * LEASE - time.monotonic()))
    assert metric(broker, "broker_active") == 1
    assert "fencing itself at epoch 2" not in broker.log_text()

    wait_until(lambda: fenced(HANDOVER_FENCE), 15, what="the handover's lease running out")
    assert metric(broker, "broker_active") == 0
    assert beat(epoch) == ("Unavailable", "LEASE_EXPIRED")  # a fenced term is never revived
    log = broker.log_text()
    assert log.count("lease extended to 3 s by a handover renewal at epoch 2") == 1
    assert DEFAULT_TOKEN not in log
