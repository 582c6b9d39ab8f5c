"""A paused cluster (issue 42): heartbeats and renewals go on, no term begins or ends, resume acts.

The world is the property tests' (``simulation.World``): the real decision core against brokers
running the broker's own term machine. While ``ClusterConfig.paused`` is set the world itself
refuses any epoch allocation, any ``active=true`` but the active's (or a restarted engine's
recorded active's) and any new term, so every test here also checks that. Each test names what a
person who paused a cluster would see.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker_operator.core import AllocateEpoch, MoveKind, status_of, step
from broker_operator.core.pause import (
    PAUSE_ANNOTATION,
    pause_annotation_problem,
    pause_requested,
)
from tests.unit.core.simulation import World
from tests.unit.core.test_handover import SETTINGS

LONG = 5 * SETTINGS.lease_seconds  # far past failureThreshold intervals and the fence


def steady(*, pod_mode: bool = False, settings: object = SETTINGS) -> World:
    world = World.create(["b0", "b1"], settings, pod_mode=pod_mode)  # type: ignore[arg-type]
    world.run(3.0)
    assert world.actives() == ["b0"] and world.state.active == "b0"
    return world


def reasons(world: World, since: int = 0) -> list[str]:
    return [event.reason for event in world.events[since:]]


def run_watching(world: World, seconds: float, *, every: float = 0.1) -> list[list[str]]:
    """Run the engine for ``seconds``, sampling which brokers would act as the active."""
    seen = []
    for _ in range(int(seconds / every)):
        world.run(every)
        seen.append(world.actives())
    return seen


@pytest.mark.parametrize(
    ("value", "paused", "problem"),
    [
        (None, False, False),
        ("true", True, False),
        ("True", True, False),
        (" TRUE ", True, False),
        ("false", False, False),
        ("yes", False, True),
        ("", False, True),
    ],
)
def test_only_true_pauses_and_anything_but_true_or_false_is_named(
    value: str | None, paused: bool, problem: bool
) -> None:
    annotations = {} if value is None else {PAUSE_ANNOTATION: value}
    assert pause_requested(annotations) is paused
    message = pause_annotation_problem(annotations)
    assert (message is not None) is problem
    if message is not None:
        assert PAUSE_ANNOTATION in message and "not paused" in message


def test_a_paused_cluster_keeps_renewing_its_active_so_nothing_fences_itself() -> None:
    world = steady()
    grants, activations = list(world.grants), list(world.activations)
    world.set_paused(True)
    renewals_before = len([r for r in world.renewals if r[1] == "b0"])
    assert all(actives == ["b0"] for actives in run_watching(world, LONG))
    # Renewed every interval, as before the pause: the lease never ran out.
    renewals = len([r for r in world.renewals if r[1] == "b0"]) - renewals_before
    assert renewals >= LONG / SETTINGS.interval_seconds - 2
    assert (world.grants, world.activations) == (grants, activations)
    status = status_of(world.state, world.config)
    assert (status.phase, status.active, status.active_epoch) == ("Healthy", "b0", 1)
    assert world.state.broker("b1").ready  # type: ignore[union-attr]  # the standby is still probed


def test_a_dead_active_is_reported_not_failed_over_and_fails_over_once_resumed() -> None:
    world = steady(pod_mode=True)
    grants, activations = list(world.grants), list(world.activations)
    world.set_paused(True)
    mark = len(world.events)
    world.crash("b0")
    assert all(actives == [] for actives in run_watching(world, LONG))
    # Nothing moved: no epoch, no activation, the dead broker still the active, said once, loudly.
    assert (world.grants, world.activations) == (grants, activations)
    assert world.state.active == "b0" and world.state.move is None
    assert reasons(world, mark) == ["FailoverPaused"]
    paused_event = world.events[mark]
    assert paused_event.warning and "NOT failing over" in paused_event.message
    assert "CONTAINER_TERMINATED" not in paused_event.message or "b0" in paused_event.message
    status = status_of(world.state, world.config)
    assert (status.phase, status.active) == ("Unavailable", "b0")
    assert world.service == ("b0", 1)  # the -active Service was left where it was
    # Resumed: the held failover is the next step's first decision.
    mark = len(world.events)
    world.set_paused(False)
    world.run(2.0)
    assert world.actives() == ["b1"] and world.state.active == "b1"
    assert world.state.active_epoch == 2
    assert reasons(world, mark)[:2] == ["ActiveUnavailable", "Failover"]
    assert world.state.held_failover is None


def test_a_held_active_restarted_by_the_kubelet_is_only_checked_never_reactivated() -> None:
    """A renewal at its epoch would start the restarted broker's term again; a pause starts none."""
    world = steady(pod_mode=True)
    world.set_paused(True)
    mark = len(world.events)
    world.crash("b0")
    world.run(1.0)
    world.restart("b0")  # the kubelet's restart: Inactive, epoch 1 on disk
    assert all(actives == [] for actives in run_watching(world, LONG))
    b0 = world.state.broker("b0")
    assert b0 is not None and not b0.dead and b0.failures > 0
    assert [(n, e) for _, n, e in world.activations] == [("b0", 1)]
    assert reasons(world, mark) == ["FailoverPaused"]  # once, not once per change of cause
    world.set_paused(False)
    world.run(1.0)
    assert world.actives() == ["b1"]
    assert [(n, e) for _, n, e in world.activations] == [("b0", 1), ("b1", 2)]


def test_a_partition_that_heals_within_the_lease_is_told_and_recovered_without_a_new_epoch() -> None:
    settings = replace(SETTINGS, lease_seconds=4.0)
    world = steady(settings=settings)
    world.set_paused(True)
    mark = len(world.events)
    world.brokers["b0"].partitioned = True
    world.run(1.4)  # failureThreshold (2) failed renewals: a running engine would fail over now
    assert reasons(world, mark) == ["FailoverPaused"]
    assert status_of(world.state, world.config).phase == "Unavailable"
    world.brokers["b0"].partitioned = False
    world.run(1.0)
    assert reasons(world, mark) == ["FailoverPaused", "ActiveRecovered"]
    assert world.actives() == ["b0"] and world.state.active_epoch == 1 and not world.grants[1:]
    assert all(actives == ["b0"] for actives in run_watching(world, 2 * settings.lease_seconds))
    assert status_of(world.state, world.config).phase == "Healthy"


def test_no_switchover_failback_or_drain_move_while_paused_and_each_happens_on_resume() -> None:
    world = steady(pod_mode=True)
    world.set_paused(True)
    world.config = replace(world.config, preferred_active="b1")
    world.draining = {"b0"}
    assert all(actives == ["b0"] for actives in run_watching(world, LONG))
    assert world.state.move is None and len(world.grants) == 1
    world.set_paused(False)
    world.run(2.0)
    assert world.actives() == ["b1"] and world.state.last_move is not None
    assert world.state.last_move.to == "b1"
    # Automatic failback waits too: b0 is a ready standby of higher priority.
    world.draining = set()
    world.config = replace(world.config, preferred_active=None)
    world.set_paused(True)
    world.run(2 * SETTINGS.standby_probe_seconds)
    assert world.state.broker("b0").ready  # type: ignore[union-attr]
    assert all(actives == ["b1"] for actives in run_watching(world, 3 * SETTINGS.failback_stable_seconds))
    world.set_paused(False)
    world.run(SETTINGS.failback_stable_seconds + 2.0)
    assert world.actives() == ["b0"]


def test_an_operator_restarted_while_paused_renews_the_recorded_active_at_its_epoch() -> None:
    world = steady()
    world.set_paused(True)
    world.operator_restarts()
    assert world.config.paused
    assert all(actives == ["b0"] for actives in run_watching(world, LONG))
    assert world.state.active == "b0" and world.state.active_epoch == 1 and len(world.grants) == 1


def test_an_operator_restarted_while_paused_with_the_active_dead_activates_nobody() -> None:
    world = steady(pod_mode=True)
    world.set_paused(True)
    world.crash("b0")
    world.operator_restarts()
    mark = len(world.events)
    assert all(actives == [] for actives in run_watching(world, LONG))
    assert len(world.grants) == 1
    assert reasons(world, mark) == ["FailoverPaused"]
    # Written, not left as the previous engine recorded it: a pause holds the first round for good.
    assert world.recorded_status is not None
    assert (world.recorded_status.phase, world.recorded_status.active) == ("Unavailable", None)
    world.set_paused(False)
    world.run(3.0)
    assert world.actives() == ["b1"] and world.state.active_epoch == 2


def test_a_failover_under_way_when_paused_waits_and_goes_on_once_resumed() -> None:
    world = steady()  # endpoints mode: a crash is known only from failed renewals and the lease
    world.crash("b0")
    world.run(1.2)  # failed twice: the failover started, its gate waits for b0's lease
    assert world.state.move is not None and world.state.move.kind is MoveKind.FAILOVER
    world.set_paused(True)
    mark, grants = len(world.events), list(world.grants)
    assert all(actives == [] for actives in run_watching(world, LONG))
    assert world.grants == grants and world.state.active is None
    assert reasons(world, mark) == ["FailoverPaused"]
    assert status_of(world.state, world.config).phase == "Unavailable"
    world.set_paused(False)
    world.run(2.0)
    assert world.actives() == ["b1"]


def test_no_step_while_paused_allocates_an_epoch_even_for_a_new_cluster() -> None:
    world = World.create(["b0", "b1"], SETTINGS)
    world.set_paused(True)
    decision = step(world.state, world.config, {}, world.now)
    assert not any(isinstance(action, AllocateEpoch) for action in decision.actions)
    world.run(LONG)
    assert world.actives() == [] and not world.grants and not reasons(world)
    assert status_of(world.state, world.config).phase == "Pending"  # no active to lose: not held
    world.set_paused(False)
    world.run(2.0)
    assert world.actives() == ["b0"]
