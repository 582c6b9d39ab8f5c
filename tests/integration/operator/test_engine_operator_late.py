"""An engine whose own event loop is held up does not fail a healthy active over (issue 40).

Real broker processes answer at once; the operator's loop is held, once each renewal of the active
has been answered, for longer than the heartbeat timeout, as a takeover that starts hundreds of
engines at once holds it. The renewals time out although the brokers answered them, and the engine
tells its own delay from the broker's (``loop_lag``): no failover, no new epoch, and the timeouts
counted as ``late``, not ``failed``. The holds are bounds of the test, not figures.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from broker_operator.core.model import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatReply
from tests.integration.operator import conftest
from tests.integration.operator.conftest import SETTINGS, BrokerTrio, eventually
from tests.integration.operator.test_engine_loop import recorded_healthy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HOLD = 1.6 * SETTINGS.timeout_seconds  # past the timeout, well inside the 2 s lease
HELD_FOR = 4.0  # several heartbeat intervals, far past failureThreshold of them


class HeldUpClient(HeartbeatClient):
    """The real client; while ``held``, the loop is blocked after each renewal of the active was
    answered, past the timeout, so that the engine's timeout fires late, before it sees the reply."""

    held = False

    async def heartbeat(
        self, target: BrokerTarget, active: bool, *args: Any, **kwargs: Any
    ) -> HeartbeatReply:
        reply = await super().heartbeat(target, active, *args, **kwargs)  # the broker renewed
        if HeldUpClient.held and active:
            time.sleep(HOLD)  # noqa: ASYNC251 - the point: the operator's own loop held up
            await asyncio.sleep(0.001)  # the overdue timeout (an earlier deadline) fires first
        return reply


def heartbeats_counted(outcome: str) -> float:
    sample = REGISTRY.get_sample_value(
        "broker_failover_heartbeats_total",
        {"brokercluster_namespace": "", "brokercluster": "acme-1000", "outcome": outcome},
    )
    return sample or 0.0


async def test_a_held_up_operator_fails_no_healthy_active_over(
    cluster: BrokerTrio, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conftest, "HeartbeatClient", HeldUpClient)
    loop, shell = await cluster.start_loop()
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: recorded_healthy(shell, "b0"), 10, "Healthy with b0 recorded")
    late_before, failed_before = heartbeats_counted("late"), heartbeats_counted("failed")
    events_before = len(shell.reasons())
    HeldUpClient.held = True
    try:
        await asyncio.sleep(HELD_FOR)
    finally:
        HeldUpClient.held = False
    await asyncio.sleep(3 * SETTINGS.interval_seconds)
    assert heartbeats_counted("late") >= SETTINGS.failure_threshold + late_before, "the holds proved nothing"
    assert heartbeats_counted("failed") == failed_before  # none counted against the broker
    assert (loop.status.active, loop.status.epoch) == ("b0", 1)
    assert await asyncio.to_thread(cluster.actives) == ["b0"]
    since = shell.reasons()[events_before:]
    assert not {"Failover", "ActiveUnavailable", "Activated"} & set(since), since
