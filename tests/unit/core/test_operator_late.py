"""Timeouts the operator caused itself (issue 40): an engine whose own event loop runs late is not
evidence against the broker.

A takeover starts every cluster's engine at once; with 200 clusters on two cores their heartbeats
timed out while the replies waited in the sockets, and 16 healthy actives were failed over (426 of
500). The engine now asks ``loop_lag`` whose delay a timeout was (``HeartbeatFailed.operator_late``).
The world is the property tests' (``simulation.World``): the real decision core against brokers
running the broker's own term machine.
"""

from __future__ import annotations

from tests.unit.core.test_handover import SETTINGS, steady_world

LATE_FOR = 5 * SETTINGS.lease_seconds  # far past failureThreshold times the interval


def test_a_late_operator_fails_no_healthy_active_over() -> None:
    world = steady_world()
    world.operator_late = True
    world.run(LATE_FOR)
    # Every call reached the broker and renewed its lease; none was counted as its failure.
    assert world.actives() == ["b0"]
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1)]
    assert world.state.active == "b0" and world.state.broker("b0").failures == 0
    world.operator_late = False
    world.run(3.0)
    assert world.actives() == ["b0"] and world.state.active_epoch == 1


def test_the_same_timeouts_from_a_slow_broker_fail_it_over() -> None:
    # The contrast, and why the flag matters: the engine cannot tell these apart without it.
    world = steady_world()
    world.brokers["b0"].slow = True
    world.run(LATE_FOR)
    assert world.actives() == ["b1"]
    assert world.state.active == "b1" and world.state.active_epoch == 2


def test_a_late_operator_still_fails_a_crashed_active_over() -> None:
    # Refusals and the kubelet's report are proofs, not timeouts: lateness does not hide them.
    world = steady_world()
    world.operator_late = True
    world.crash("b0")
    world.run(2.0)
    # The failover is under way while the operator is late (its activation call may time out
    # too, and is retried as any unanswered activation is)...
    assert world.state.move is not None or world.state.active != "b0"
    world.operator_late = False
    world.run(LATE_FOR)
    assert world.actives() == ["b1"]  # ... and completes once it is on time again


def test_a_successor_late_at_start_keeps_the_recorded_active() -> None:
    # A takeover at 200 clusters: the new process's first call to the recorded active timed out
    # while its loop ran late; the start move walked on, fenced it and activated the standby under
    # a new epoch ("Activated: broker b ... replacing a (OperatorStarted)"). Late, it must retry
    # the recorded active instead, as a late operator keeps a steady active.
    world = steady_world()
    world.operator_hands_over(gap=1.0)
    world.operator_late = True
    world.run(LATE_FOR)
    assert world.actives() == ["b0"]
    world.operator_late = False
    world.run(3.0)
    assert world.actives() == ["b0"] and world.state.active == "b0"
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1)]
    assert world.state.active_epoch == 1 and world.state.failovers == 0
