"""The real ClusterLoop against real broker processes in endpoints mode.

Each test starts the simulators and three brokers (see ``conftest.py``), runs the
loop with the real SOAP client, breaks something the way production breaks it
(kill -9, SIGSTOP, a broker holding a higher epoch, a spec change), and checks
the brokers' own ``broker_active`` gauges as well as the engine's status and
events. Waits are bounded polls; no test asserts how fast anything was (that is
``bench/bench_failover.py``'s job).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal

import pytest
from prometheus_client import REGISTRY

from broker_contracts.soap import BrokerState
from broker_operator.core.model import FailbackMode
from broker_operator.engine import BrokerTarget, HeartbeatClient
from broker_simulators.local_processes import DEFAULT_TOKEN
from tests.integration.operator.conftest import LEASE, SETTINGS, BrokerTrio, ProcessShell, eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def sample_single_active(cluster: BrokerTrio, seconds: float) -> None:
    """Sample the brokers' gauges for ``seconds``; fail if two ever report Active together."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        actives = await asyncio.to_thread(cluster.actives)
        assert len(actives) <= 1, f"two brokers active at once: {actives}"
        await asyncio.sleep(0.05)


async def test_activates_highest_priority_and_reports_healthy(cluster: BrokerTrio) -> None:
    loop, shell = await cluster.start_loop()
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: loop.status.phase == "Healthy", 10, "phase Healthy")
    status = loop.status
    assert status.active == "b0" and status.epoch == 1
    assert [b.state for b in status.brokers] == ["Active", "Inactive", "Inactive"]
    await eventually(lambda: "Activated" in shell.reasons(), 10, "Activated event")
    # Status is written on change only: a quiet second adds no writes.
    writes = len(shell.statuses)
    await asyncio.sleep(1.5)
    assert len(shell.statuses) == writes


def recorded_healthy(shell: ProcessShell, active: str) -> bool:
    """Whether the last status the shell took (not the engine's in-memory one) is Healthy with ``active``."""
    return (
        bool(shell.statuses) and shell.statuses[-1].phase == "Healthy" and shell.statuses[-1].active == active
    )


# The loops of these tests run outside Kubernetes: no namespace (ClusterLoop's default).
ACME = {"brokercluster_namespace": "", "brokercluster": "acme-1000"}


def failovers_counted() -> float:
    sample = REGISTRY.get_sample_value("broker_failover_failovers_total", {**ACME, "kind": "Failover"})
    return sample or 0.0


async def test_kill9_with_pod_facts_fails_over_at_once(cluster: BrokerTrio) -> None:
    counted_before = failovers_counted()
    loop, shell = await cluster.start_loop(pods=True)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    cluster.brokers["b0"].kill(signal.SIGKILL)
    loop.wake()
    await eventually(lambda: cluster.actives() == ["b1"], 10, "b1 active after kill -9 of b0")
    assert loop.status.active == "b1"
    assert loop.status.epoch == 2
    assert loop.status.last_failover is not None
    assert loop.status.last_failover.from_ == "b0" and loop.status.last_failover.to == "b1"
    assert loop.status.last_failover.reason == "CONTAINER_TERMINATED"
    assert {"ActiveUnavailable", "Failover"} <= set(shell.reasons())
    assert loop.status.phase == "Degraded"  # b0 is gone
    assert failovers_counted() == counted_before + 1
    assert REGISTRY.get_sample_value("broker_failover_epoch", ACME) == 2
    assert REGISTRY.get_sample_value("broker_failover_phase", {**ACME, "phase": "Degraded"}) == 1


async def test_a_held_status_write_does_not_hold_the_failover(cluster: BrokerTrio) -> None:
    """Status is written beside the failover's steps, not between them: with every status write
    held back from the kill -9 of b0 on, b1 still becomes active, and once released the writes
    catch up with the newest status rather than one per step (issue 23)."""
    loop, shell = await cluster.start_loop(pods=True)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(
        lambda: bool(shell.statuses) and shell.statuses[-1].phase == "Healthy", 10, "Healthy recorded"
    )
    shell.status_gate = asyncio.Event()  # every status write waits for it from here on
    cluster.brokers["b0"].kill(signal.SIGKILL)
    loop.wake()
    await eventually(lambda: cluster.actives() == ["b1"], 10, "b1 active while status writes are held")
    # One write began (the failover's first status) and waits; the later ones wait behind it.
    assert [status.active for status in shell.held] == [None], shell.held
    assert shell.statuses[-1].active == "b0", "a status write went through while held"
    shell.status_gate.set()
    await eventually(lambda: shell.statuses[-1].active == "b1", 10, "b1 recorded once released")
    # What was handed over meanwhile folded into the newest status: one write, not one per step.
    assert [status.active for status in shell.held[:2]] == [None, "b1"], shell.held


async def test_kill9_without_pod_facts_waits_for_the_lease(cluster: BrokerTrio) -> None:
    loop, shell = await cluster.start_loop(pods=False)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    cluster.brokers["b0"].kill(signal.SIGKILL)
    await eventually(lambda: "ActiveUnavailable" in shell.reasons(), 10, "failure detected")
    await eventually(lambda: cluster.actives() == ["b1"], 10 + LEASE, "b1 active after the lease")
    assert loop.status.active == "b1"


async def test_sigstop_partition_fails_over_after_lease_and_fences_the_old_active(
    cluster: BrokerTrio,
) -> None:
    manual = dataclasses.replace(SETTINGS, failback=FailbackMode.MANUAL)
    loop, _shell = await cluster.start_loop(settings=manual)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    b0 = cluster.brokers["b0"]
    b0.kill(signal.SIGSTOP)
    try:
        await eventually(lambda: loop.status.active == "b1", 10 + 2 * LEASE, "b1 active while b0 is stopped")
        assert await asyncio.to_thread(cluster.actives) == ["b1"]  # b0 cannot answer: None, not True
    finally:
        b0.kill(signal.SIGCONT)
    # The resumed b0 has missed its lease: it must not be active next to b1, and
    # the engine keeps fencing it (active=false) until it answers Inactive.
    await sample_single_active(cluster, 3.0)
    await eventually(
        lambda: next(b for b in loop.status.brokers if b.name == "b0").state == "Inactive",
        10,
        "b0 seen Inactive after SIGCONT",
    )
    assert await asyncio.to_thread(cluster.actives) == ["b1"]  # Manual: no failback to the resumed b0


async def test_stale_epoch_on_a_broker_raises_the_cluster_epoch(cluster: BrokerTrio) -> None:
    # A previous life of this cluster activated b0 with epoch 5 and lost its record.
    client = HeartbeatClient(DEFAULT_TOKEN, "old-operator", 2.0)
    target = BrokerTarget("b0", cluster.brokers["b0"].soap_url, 0)
    try:
        assert (await client.heartbeat(target, True, 5)).state == BrokerState.ACTIVE
        assert (await client.heartbeat(target, False, 5)).state == BrokerState.INACTIVE
    finally:
        await client.close()
    loop, shell = await cluster.start_loop()
    await eventually(lambda: loop.status.active is not None, 30, "an active broker")
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    assert loop.status.epoch >= 5, loop.status.epoch  # never below what a broker already stored
    await eventually(lambda: "StaleEpoch" in shell.reasons(), 10, "StaleEpoch event")


async def test_failback_after_restart_never_overlaps(cluster: BrokerTrio) -> None:
    loop, shell = await cluster.start_loop(pods=True)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    cluster.brokers["b0"].kill(signal.SIGKILL)
    loop.wake()
    await eventually(lambda: cluster.actives() == ["b1"], 10, "failover to b1")
    await asyncio.to_thread(cluster.brokers["b0"].restart)
    loop.wake()
    sampler = asyncio.create_task(sample_single_active(cluster, 8.0))
    await eventually(lambda: cluster.actives() == ["b0"], 15, "failback to b0")
    await sampler
    await eventually(lambda: "Failback" in shell.reasons(), 10, "Failback event")
    assert loop.status.failovers == 2


async def test_switchover_to_preferred_active_drains_first(cluster: BrokerTrio) -> None:
    loop, shell = await cluster.start_loop()
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: loop.status.phase == "Healthy", 10, "standbys ready")
    sampler = asyncio.create_task(sample_single_active(cluster, 4.0))
    loop.update(cluster.targets(), SETTINGS, preferred_active="b2")
    await eventually(lambda: cluster.actives() == ["b2"], 10, "switchover to b2")
    await sampler
    await eventually(lambda: "Switchover" in shell.reasons(), 10, "Switchover event")
    assert loop.status.active == "b2" and loop.status.last_failover is not None
    assert loop.status.last_failover.reason == "PreferredActive"
    # preferredActive keeps b2 even though b0 has the higher priority (Automatic failback).
    await asyncio.sleep(SETTINGS.failback_stable_seconds + 2)
    assert await asyncio.to_thread(cluster.actives) == ["b2"]


@pytest.mark.parametrize("grace", [5.0, 0.0])
async def test_a_cancelled_engine_still_lands_the_status_it_handed_over(
    cluster: BrokerTrio, grace: float
) -> None:
    """kopf cancels the engine when it stops the daemon (a drain evicting this replica, in the middle
    of the switchover the drain caused). The steps stop at once, but with a grace the status already
    handed over still lands: cancelled with the engine, the switchover was lost from the status and
    the replica that took over resumed from the old one."""
    loop, shell = await cluster.start_loop(status_grace_seconds=grace)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: recorded_healthy(shell, "b0"), 10, "Healthy with b0 recorded")
    shell.status_gate = asyncio.Event()  # every status write waits for it from here on
    loop.update(cluster.targets(), SETTINGS, preferred_active="b2")
    await eventually(lambda: cluster.actives() == ["b2"], 10, "b2 activated while status writes are held")
    await eventually(
        lambda: loop.status.last_failover is not None, 10, "the switchover in the engine's status"
    )
    engine = cluster.loops[-1]
    engine.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await engine
    assert shell.statuses[-1].active == "b0", "a status write went through while held"
    shell.status_gate.set()
    if grace:
        await eventually(
            lambda: shell.statuses[-1].active == "b2", 5, "the switchover recorded after the cancel"
        )
        last = shell.statuses[-1].last_failover
        assert last is not None and (last.from_, last.to, last.reason) == ("b0", "b2", "PreferredActive"), (
            last
        )
    else:  # without a grace the write is cancelled with the engine, as before
        await asyncio.sleep(1.0)
        assert shell.statuses[-1].active == "b0", shell.statuses[-1]


@pytest.mark.parametrize("grace", [5.0, 0.0])
async def test_a_cancelled_engine_still_posts_the_events_of_the_step_it_was_cancelled_in(
    cluster: BrokerTrio, grace: float
) -> None:
    """The step that completes a switchover records ``Switchover`` and points the Service at the new
    active; cancelled while pointing (kopf stopping the daemon of an evicted replica), it still posts
    the event within the grace. In CI the status showed the drain's switchover and no event did."""
    loop, shell = await cluster.start_loop(status_grace_seconds=grace)
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: recorded_healthy(shell, "b0"), 10, "Healthy with b0 recorded")
    shell.point_gate = asyncio.Event()  # every call pointing the Service waits for it from here on
    loop.update(cluster.targets(), SETTINGS, preferred_active="b2")
    await eventually(lambda: shell.points[-1:] == ["b2"], 10, "the step pointing the Service at b2")
    assert "Switchover" not in shell.reasons(), "the step's event came before its calls returned"
    engine = cluster.loops[-1]
    engine.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await engine
    if grace:
        await eventually(lambda: "Switchover" in shell.reasons(), 5, "the Switchover event after the cancel")
        assert loop.status.last_failover is not None and loop.status.last_failover.to == "b2"
    else:  # without a grace the events are cancelled with the engine, like the status
        await asyncio.sleep(1.0)
        assert "Switchover" not in shell.reasons(), shell.reasons()


async def test_a_restarted_engine_keeps_the_recorded_last_failover(cluster: BrokerTrio) -> None:
    """The switchover's record outlives the engine that made it: a restarted one (another replica
    taking over) resumes the same active and writes no status without it. It wrote
    ``lastFailover: null`` once, and a drain's ``NodeDrain`` switchover vanished from the status."""
    loop, shell = await cluster.start_loop()
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    await eventually(lambda: loop.status.phase == "Healthy", 10, "standbys ready")
    loop.update(cluster.targets(), SETTINGS, preferred_active="b2")
    await eventually(lambda: recorded_healthy(shell, "b2"), 10, "the switchover to b2 recorded")
    recorded = shell.statuses[-1].last_failover
    assert recorded is not None and (recorded.from_, recorded.to) == ("b0", "b2"), recorded
    await cluster.stop_loops()
    cluster.loops.clear()
    cluster.clients.clear()
    loop2, shell2 = await cluster.start_loop(preferred="b2")  # the same state file
    await eventually(lambda: loop2.status.phase == "Healthy", 10, "Healthy after restart")
    await asyncio.sleep(2 * SETTINGS.interval_seconds)
    assert await asyncio.to_thread(cluster.actives) == ["b2"]
    assert loop2.status.last_failover == recorded
    assert all(status.last_failover == recorded for status in shell2.statuses), shell2.statuses


async def test_restarted_engine_resumes_the_same_active_without_an_event(cluster: BrokerTrio) -> None:
    _loop, shell = await cluster.start_loop()
    await eventually(lambda: cluster.actives() == ["b0"], 20, "b0 active")
    # Wait for the *recorded* status: the engine's in-memory one is ahead of the file by one
    # step, and an engine stopped in between rightly resumes without knowing b0 is active.
    await eventually(lambda: recorded_healthy(shell, "b0"), 10, "Healthy with b0 recorded")
    await cluster.stop_loops()
    cluster.loops.clear()
    cluster.clients.clear()
    loop2, shell2 = await cluster.start_loop()  # same state file: knows b0 and epoch 1
    await eventually(lambda: loop2.status.phase == "Healthy", 10, "Healthy after restart")
    assert loop2.status.active == "b0" and loop2.status.epoch == 1
    assert await asyncio.to_thread(cluster.actives) == ["b0"]
    assert not {"Activated", "Failover"} & set(shell2.reasons())
    # The recorded status is left as it was while b0 is asked again: never Pending with no
    # active in between (a write per cluster at every operator restart, and one back).
    assert all(status.active == "b0" for status in shell2.statuses), shell2.statuses
