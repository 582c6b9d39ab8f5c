"""The handover renewal and the start fence (issue 40): an operator restart moves nothing.

The world is the property tests' (``simulation.World``): the real decision core against brokers
running the broker's own term machine, with their I/O and clock simulated. Each test names what
a user would see: the active and its epoch kept across an upgrade slower than the lease, and no
two actives when a broker is cut off during one.
"""

from __future__ import annotations

from dataclasses import replace

from broker_operator.core import HeartbeatSettings, MoveKind
from broker_operator.core.handover import handover_renewal
from tests.unit.core.simulation import World

SETTINGS = HeartbeatSettings(
    interval_seconds=0.5,
    timeout_seconds=0.2,
    failure_threshold=2,
    lease_seconds=2.0,
    handover_lease_seconds=10.0,
    standby_probe_seconds=1.0,
    failback_stable_seconds=2.0,
    lease_margin_seconds=0.25,
)
# The pod's replacement: longer than the lease, well inside the handover lease.
UPGRADE_GAP = 3 * SETTINGS.lease_seconds


def steady_world() -> World:
    world = World.create(["b0", "b1"], SETTINGS)
    world.run(3.0)
    assert world.actives() == ["b0"]
    return world


def test_the_handover_renews_only_a_steady_active_with_the_handover_lease() -> None:
    world = steady_world()
    renewal = handover_renewal(world.state, world.config, world.now)
    assert renewal is not None
    assert (renewal.broker, renewal.active, renewal.epoch, renewal.renew) == ("b0", True, 1, True)
    assert renewal.lease_seconds == SETTINGS.handover_lease_seconds
    # A failing active is not handed over: the successor would have to wait its handover out.
    failing = world.state.with_broker("b0", failures=1)
    assert handover_renewal(failing, world.config, world.now) is None
    # Nor while a move is under way, nor an active whose lease has run out as the engine counts.
    moving = replace(world.state, move=world.state.move or _any_move(world))
    assert handover_renewal(moving, world.config, world.now) is None
    assert handover_renewal(world.state, world.config, world.now + 60) is None


def _any_move(world: World) -> object:
    from broker_operator.core.knowledge import Move

    return Move(MoveKind.SWITCHOVER, from_="b0", reason="test", started_at=world.now, order=("b1",))


def test_the_handover_lease_is_at_least_the_lease() -> None:
    short = replace(SETTINGS, handover_lease_seconds=0.5)
    assert short.granted_handover_seconds == SETTINGS.lease_seconds
    assert short.start_fence_seconds > short.fence_seconds


def test_an_upgrade_slower_than_the_lease_keeps_the_active_and_its_epoch() -> None:
    world = steady_world()
    world.operator_hands_over(UPGRADE_GAP)
    world.run(5.0)
    assert world.actives() == ["b0"]
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1)], "activated again"
    assert world.state.active == "b0" and world.state.active_epoch == 1
    assert world.handovers and world.handovers[-1][1] == "b0"


def test_without_the_handover_the_same_gap_fences_the_active_and_takes_a_new_epoch() -> None:
    # What every upgrade did before issue 40: the reason for the handover.
    world = steady_world()
    world.now += UPGRADE_GAP
    world.operator_restarts()
    world.run(5.0)
    assert world.actives() == ["b0"]
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1), ("b0", 2)]


def test_a_broker_cut_off_during_an_upgrade_is_waited_out_for_the_start_fence() -> None:
    # The handover may have reached it (a timeout says nothing): the successor, which never heard
    # of the handover, must not activate b1 while b0 may still hold the handover lease.
    world = steady_world()
    world.brokers["b0"].partitioned = True
    started = world.now + 0.5
    world.operator_hands_over(0.5)
    world.run(SETTINGS.start_fence_seconds + 3.0)
    assert world.actives() == ["b1"]  # the world also checks no overlap at every activation
    b1_at = next(t for t, name, _ in world.activations if name == "b1")
    assert b1_at >= started + SETTINGS.start_fence_seconds


def test_a_standby_cut_off_during_an_upgrade_does_not_hold_the_active_back() -> None:
    # The successor renews the recorded holder of the newest epoch first. Waiting for b1's
    # active=false answer, which never came, it let b0's handover lease run out, and b0 came
    # back under a new epoch after the start fence.
    world = steady_world()
    world.brokers["b1"].partitioned = True
    world.operator_hands_over(UPGRADE_GAP)
    world.run(SETTINGS.start_fence_seconds + 3.0)
    assert world.actives() == ["b0"]
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1)], "activated again"
    assert world.state.active == "b0" and world.state.active_epoch == 1


def test_one_slow_answer_from_the_recorded_active_after_an_upgrade_moves_nothing() -> None:
    # A takeover's burst at 500 clusters: the recorded active's first answer came after the
    # timeout. Walking on at once needs a new epoch and moved 11 of 500 actives; a running engine
    # fails its active over only after failureThreshold failures, and so does a successor.
    world = steady_world()
    world.operator_hands_over(UPGRADE_GAP)
    world.brokers["b0"].slow = True
    world.run(SETTINGS.timeout_seconds / 2)
    world.brokers["b0"].slow = False
    world.run(5.0)
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1)], "activated again"
    assert world.actives() == ["b0"] and world.state.active == "b0"


def test_a_recorded_active_that_keeps_timing_out_after_an_upgrade_is_failed_over() -> None:
    world = steady_world()
    world.brokers["b0"].slow = True
    world.operator_hands_over(UPGRADE_GAP)
    world.run(SETTINGS.start_fence_seconds + 5.0)
    assert world.actives() == ["b1"] and world.state.active == "b1"


def test_an_active_cut_off_after_it_took_the_handover_is_not_overlapped() -> None:
    # It holds the handover lease; the successor never heard of it. Activating b1 after the plain
    # lease's fence would give two actives (the world asserts none at every activation).
    world = steady_world()
    world.operator_hands_over(0.5)
    world.brokers["b0"].partitioned = True
    world.run(SETTINGS.start_fence_seconds + 3.0)
    assert world.actives() == ["b1"]


def test_a_cluster_never_activated_starts_with_the_leases_fence() -> None:
    # Epoch 0: no operator ever activated a broker of it, so none was handed over.
    world = World.create(["b0", "b1"], SETTINGS)
    world.brokers["b0"].partitioned = True
    world.run(SETTINGS.fence_seconds + 2.0)
    assert world.actives() == ["b1"]


def test_an_active_out_of_the_spec_at_a_restart_takes_its_epoch_with_it() -> None:
    # Found by the property test (600 examples): b0 scaled away, its "b0 is active" status the last
    # one written, the operator restarted: b1 was activated with b0's epoch 1.
    world = World.create(["b0"], SETTINGS)
    world.run(0.5)
    world.set_targets([])
    world.clock_step(5.0)
    world.run(0.1)
    world.operator_restarts(lost_status_writes=1)
    world.set_targets(["b1"])
    world.run(SETTINGS.start_fence_seconds + 2.0)
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1), ("b1", 2)]
