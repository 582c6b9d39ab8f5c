"""The real ClusterLoop against real brokers while its broker set changes through ``update()``.

The controller starts an engine as soon as it may (see ``controller/daemon.py``)
and hands it brokers as pods get IPs, so the engine must take brokers it was not
started with, and let go of removed ones without ever leaving two active: a
removed active is deactivated (answers ``active=false`` with ``Inactive``)
before another broker gets ``active=true``. The brokers' own ``broker_active``
gauges are the witness; waits are bounded polls, nothing here is timed.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.operator.conftest import SETTINGS, BrokerTrio, eventually
from tests.integration.operator.test_engine_loop import sample_single_active

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_engine_started_without_brokers_activates_those_given_later(cluster: BrokerTrio) -> None:
    loop, shell = await cluster.start_loop(targets=[])
    await asyncio.sleep(5 * SETTINGS.interval_seconds)  # several walks over no brokers
    # Pods without IPs yet: Pending, not Unavailable, and no warning event.
    assert loop.status.phase == "Pending"
    assert "NoBrokerAvailable" not in shell.reasons()
    assert await asyncio.to_thread(cluster.actives) == [] and loop.status.epoch == 0
    loop.update(cluster.targets(), SETTINGS, None)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active once the brokers are given")
    await eventually(lambda: loop.status.phase == "Healthy", 10, "phase Healthy")
    assert loop.status.active == "b0" and loop.status.epoch == 1
    assert [b.name for b in loop.status.brokers] == ["b0", "b1", "b2"]
    await eventually(lambda: "Activated" in shell.reasons(), 10, "Activated event")


async def test_brokers_added_one_by_one_end_on_the_highest_priority(cluster: BrokerTrio) -> None:
    # Pods get their IPs in any order: b2 first, then b0 and b1 (Automatic failback to b0).
    b0, b1, b2 = cluster.targets()
    loop, _shell = await cluster.start_loop(targets=[b2])
    await eventually(lambda: cluster.actives() == ["b2"], 20, "b2 active while it is the only broker")
    sampler = asyncio.create_task(sample_single_active(cluster, 6.0))
    loop.update([b0, b1, b2], SETTINGS, None)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "failback to b0 once it is known")
    await sampler
    assert loop.status.active == "b0"


async def test_removed_active_is_deactivated_before_another_is_activated(cluster: BrokerTrio) -> None:
    loop, shell = await cluster.start_loop()
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: loop.status.phase == "Healthy", 10, "standbys ready")
    sampler = asyncio.create_task(sample_single_active(cluster, 4.0))
    _b0, b1, b2 = cluster.targets()
    loop.update([b1, b2], SETTINGS, None)
    await eventually(lambda: cluster.actives() == ["b1"], 15, "b1 active after b0 left the spec")
    await sampler
    assert loop.status.active == "b1"
    assert [b.name for b in loop.status.brokers] == ["b1", "b2"]  # b0 is forgotten once fenced
    await eventually(lambda: "Failover" in shell.reasons(), 10, "Failover event")
    unavailable = next(message for reason, message in shell.events if reason == "ActiveUnavailable")
    assert "b0 was removed from the spec" in unavailable
