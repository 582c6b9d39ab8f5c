"""The handover renewal against real broker processes (issue 40): an engine stopped for an operator
upgrade renews its active once with the handover lease, so that a successor which starts later
than the lease finds the same active at the same epoch, with no event.

The gap between the two engines is a sleep longer than the brokers' lease: the bound the handover
must cover, not a performance claim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from tests.integration.operator.conftest import HANDOVER_CAP, LEASE, SETTINGS, BrokerTrio, eventually
from tests.integration.operator.test_engine_loop import recorded_healthy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HANDOVER = dataclasses.replace(SETTINGS, handover_lease_seconds=HANDOVER_CAP)
GAP = 2 * LEASE  # the pod's replacement: longer than the lease, inside the handover lease


async def stop_engine(cluster: BrokerTrio) -> None:
    """The engine's task cancelled as kopf cancels a daemon's; its client left open for the handover."""
    task = cluster.loops.pop()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_an_engine_stopped_for_an_upgrade_hands_its_active_over(cluster: BrokerTrio) -> None:
    loop, shell = await cluster.start_loop(settings=HANDOVER)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: recorded_healthy(shell, "b0"), 10, "Healthy with b0 recorded")
    await stop_engine(cluster)
    assert await loop.hand_over(time.monotonic() + 1.0), "b0 did not take the handover"
    await asyncio.sleep(GAP)
    assert await asyncio.to_thread(cluster.actives) == ["b0"], "b0 fenced itself despite the handover"
    successor, shell2 = await cluster.start_loop(settings=HANDOVER)  # same state file
    await eventually(lambda: successor.status.phase == "Healthy", 10, "Healthy after the upgrade")
    assert (successor.status.active, successor.status.epoch) == ("b0", 1)
    assert not {"Activated", "Failover", "ActiveUnavailable"} & set(shell2.reasons())


async def test_without_the_handover_the_same_gap_fences_the_active(cluster: BrokerTrio) -> None:
    # The behaviour the handover replaces: the test above would fail without it.
    _loop, shell = await cluster.start_loop(settings=HANDOVER)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: recorded_healthy(shell, "b0"), 10, "Healthy with b0 recorded")
    await stop_engine(cluster)
    await asyncio.sleep(GAP)
    assert await asyncio.to_thread(cluster.actives) == [], "b0 outlived its lease without a renewal"


async def test_a_handover_past_its_deadline_is_not_sent(cluster: BrokerTrio) -> None:
    # A process that saw the exit too long ago sends nothing: its successor may be running.
    loop, shell = await cluster.start_loop(settings=HANDOVER)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: recorded_healthy(shell, "b0"), 10, "Healthy with b0 recorded")
    await stop_engine(cluster)
    assert not await loop.hand_over(time.monotonic() - 0.1)
    await asyncio.sleep(GAP)
    assert await asyncio.to_thread(cluster.actives) == []
