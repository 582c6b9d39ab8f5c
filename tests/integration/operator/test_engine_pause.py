"""A paused cluster's real ClusterLoop against real broker processes (issue 42).

The brokers' own ``broker_active`` gauges say who is active: while paused the active keeps its
lease (it is renewed, it never fences itself), a kill -9 of it fails nothing over (no other broker
is activated, the status says why), and the resume fails it over at once.
"""

from __future__ import annotations

import asyncio
import signal

import pytest
from prometheus_client import REGISTRY

from tests.integration.operator.conftest import LEASE, SETTINGS, BrokerTrio, eventually
from tests.integration.operator.test_engine_loop import ACME, sample_single_active

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def paused_gauge() -> float | None:
    return REGISTRY.get_sample_value("broker_failover_reconciliation_paused", ACME)


async def test_paused_the_active_keeps_its_lease_and_a_kill_9_waits_for_the_resume(
    cluster: BrokerTrio,
) -> None:
    loop, shell = await cluster.start_loop(pods=True)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: loop.status.phase == "Healthy", 10, "phase Healthy")
    assert paused_gauge() == 0.0
    loop.update(cluster.targets(), SETTINGS, None, paused=True)
    assert paused_gauge() == 1.0

    # Three leases with no fault: b0 is renewed throughout, never fences itself, no new epoch.
    loop_time = asyncio.get_running_loop().time
    end = loop_time() + 3 * LEASE
    while loop_time() < end:
        assert await asyncio.to_thread(cluster.actives) == ["b0"]
        await asyncio.sleep(0.2)
    assert loop.status.active == "b0" and loop.status.epoch == 1

    cluster.brokers["b0"].kill(signal.SIGKILL)
    loop.wake()
    await eventually(lambda: "FailoverPaused" in shell.reasons(), 10, "FailoverPaused event")
    # Past the lease and its margin: a running engine would have activated b1 long since.
    await sample_single_active(cluster, 3 * LEASE)
    assert await asyncio.to_thread(cluster.actives) == []
    status = loop.status
    assert (status.active, status.epoch, status.phase) == ("b0", 1, "Unavailable")
    assert "ActiveUnavailable" not in shell.reasons() and "Failover" not in shell.reasons()
    assert shell.statuses[-1].phase == "Unavailable"  # recorded, not only known

    loop.update(cluster.targets(), SETTINGS, None, paused=False)
    assert paused_gauge() == 0.0
    await eventually(lambda: cluster.actives() == ["b1"], 10, "b1 active once resumed")
    assert loop.status.active == "b1" and loop.status.epoch == 2
    await eventually(lambda: "Failover" in shell.reasons(), 10, "Failover event")
    reasons = shell.reasons()
    assert reasons.index("FailoverPaused") < reasons.index("ActiveUnavailable") < reasons.index("Failover")
