"""Example-based tests of the decision core: one scenario each, read top to bottom.

The property tests (``test_properties.py``) cover the random fault space; these pin
down the rules the design spells out (settings defaults and refusals, the status
patch, fast fencing, planned moves draining first, epoch conflicts, failback).
They drive the real core through the simulated brokers of ``simulation.py``.
"""

from __future__ import annotations

import itertools

import pytest

from broker_operator.core import (
    ClusterStatus,
    ConnectionLost,
    FailbackMode,
    HeartbeatSettings,
    PointActive,
    ProcessGone,
    SendHeartbeat,
    SettingsError,
    next_epoch,
    retry_delay,
    status_of,
    step,
)
from broker_operator.core.status import BrokerStatus, LastFailover
from tests.unit.core.simulation import RTT, World

FAST = HeartbeatSettings(
    interval_seconds=0.5,
    timeout_seconds=0.2,
    failure_threshold=2,
    lease_seconds=2.0,
    standby_probe_seconds=1.0,
    failback_stable_seconds=2.0,
    lease_margin_seconds=0.25,
)


def test_settings_defaults_follow_the_design() -> None:
    settings = HeartbeatSettings.from_spec({})
    assert (settings.interval_seconds, settings.timeout_seconds, settings.failure_threshold) == (1, 1, 2)
    assert (settings.lease_seconds, settings.standby_probe_seconds) == (10, 10)
    assert settings.failback is FailbackMode.AUTOMATIC and settings.failback_stable_seconds == 30
    custom = HeartbeatSettings.from_spec(
        {
            "heartbeat": {"intervalSeconds": 2, "leaseSeconds": 9},
            "failback": "Manual",
            "failbackStableSeconds": 5,
        }
    )
    assert custom.interval_seconds == 2 and custom.lease_seconds == 9
    assert custom.failback is FailbackMode.MANUAL and custom.failback_stable_seconds == 5


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ({"heartbeat": {"leaseSeconds": 2}}, "spec.heartbeat.leaseSeconds (2)"),
        ({"heartbeat": {"intervalSeconds": "fast"}}, "spec.heartbeat.intervalSeconds ('fast')"),
        ({"heartbeat": {"failureThreshold": -1}}, "spec.heartbeat.failureThreshold (-1)"),
        ({"failback": "Sometimes"}, "spec.failback ('Sometimes')"),
        ({"heartbeat": ["not", "an", "object"]}, "spec.heartbeat must be an object"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(spec: dict[str, object], names: str) -> None:
    with pytest.raises(SettingsError, match=names.replace("(", r"\(").replace(")", r"\)")):
        HeartbeatSettings.from_spec(spec)


def test_status_patch_is_camel_case_and_round_trips() -> None:
    status = ClusterStatus(
        phase="Healthy",
        active="b1",
        epoch=7,
        brokers=(
            BrokerStatus("b0", 0, "Unavailable", "STALE_EPOCH", "epoch 3 < 7", "2026-01-01T00:00:00.000000Z"),
        ),
        last_failover=LastFailover("2026-01-01T00:00:01.000000Z", "b0", "b1", "CONTAINER_TERMINATED", 420),
        failovers=3,
        active_epoch=6,
    )
    patch = status.to_status_patch()
    # status.epoch has one writer, the compare-and-swap of the epoch allocation.
    assert "epoch" not in patch
    assert patch["brokers"][0]["unavailabilityCode"] == "STALE_EPOCH"
    assert patch["brokers"][0]["lastHeartbeatTime"] == "2026-01-01T00:00:00.000000Z"
    assert patch["lastFailover"] == {
        "time": "2026-01-01T00:00:01.000000Z",
        "from": "b0",
        "to": "b1",
        "reason": "CONTAINER_TERMINATED",
        "durationMs": 420,
    }
    assert ClusterStatus.from_status(patch) == status
    assert ClusterStatus.from_status({**patch, "epoch": 7}).epoch == 7  # as the allocation left it
    assert patch["activeEpoch"] == 6
    assert ClusterStatus.from_status({}) is None
    assert ClusterStatus.from_status({"phase": "Pending"}) is None  # only the controller wrote


def test_heartbeat_times_alone_do_not_change_the_status() -> None:
    a = BrokerStatus("b0", 0, "Active", last_heartbeat_time="2026-01-01T00:00:00.000000Z")
    b = BrokerStatus("b0", 0, "Active", last_heartbeat_time="2026-01-01T00:00:09.000000Z")
    assert ClusterStatus(brokers=(a,)) == ClusterStatus(brokers=(b,))


def test_fresh_cluster_probes_everyone_then_activates_priority_zero_with_epoch_one() -> None:
    world = World.create(["b0", "b1"], FAST)
    first = step(world.state, world.config, {}, world.now)
    # Nothing is known: b1 is fenced with active=false and an epoch is asked for
    # before b0 (the first choice, so not fenced) gets active=true.
    assert [(a.broker, a.active) for a in first.actions if isinstance(a, SendHeartbeat)] == [("b1", False)]
    assert any(type(a).__name__ == "AllocateEpoch" for a in first.actions)
    world.run(1.0)
    assert world.actives() == ["b0"] and world.stored_epoch == 1
    assert status_of(world.state, world.config).phase == "Healthy"


def test_a_restart_that_lost_the_new_actives_status_never_sends_its_epoch_to_the_old_active() -> None:
    """The three-node soak's case: the operator stopped after the epoch was allocated and sent to
    the new active but before the status naming it landed. Its successor finds the recorded
    active's ``activeEpoch`` behind ``status.epoch`` and allocates above, never reusing it."""
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    assert world.actives() == ["b0"] and world.stored_epoch == 1
    world.brokers["b0"].activation_fails = True
    world.brokers["b0"].term.fence("its backend went away (simulated)")
    for _ in range(40):  # until b1 is active (before a failback to b0 is tried)
        world.run(0.1)
        if world.actives() == ["b1"]:
            break
    assert world.actives() == ["b1"] and world.stored_epoch == 2
    # Lose every status write since the last one naming b0 with epoch 1.
    last_b0 = max(i for i, s in enumerate(world.written_statuses) if s.active == "b0")
    assert world.written_statuses[last_b0].active_epoch == 1
    world.operator_restarts(lost_status_writes=len(world.written_statuses) - 1 - last_b0)
    world.brokers["b0"].activation_fails = False
    world.restart("b0")  # a fresh process: it could be activated again
    world.run(5.0)
    # The old rule sent epoch 2 to b0 (the recorded active with the recorded epoch): one epoch,
    # two brokers, which the world's activation check refuses. Now: one active, above epoch 2.
    assert len(world.actives()) == 1 and world.stored_epoch > 2
    assert {name for _, name, epoch in world.activations if epoch == 2} == {"b1"}


def test_old_active_that_answers_inactive_is_replaced_without_waiting_for_the_lease() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    world.brokers["b0"].activation_fails = True  # alive, answers, but cannot stay active
    world.brokers["b0"].term.fence("its backend went away (simulated)")
    failed_at = world.now
    world.run(3.0)
    assert world.actives() == ["b1"]
    activation_time = next(t for t, name, _ in world.activations if name == "b1")
    # Detection takes failureThreshold intervals; fencing by active=false is one round trip.
    assert activation_time - failed_at < FAST.lease_seconds


def test_silent_active_is_replaced_only_after_lease_and_margin() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    world.brokers["b0"].partitioned = True
    world.run(10.0)
    assert world.actives() == ["b1"]
    b0_last_renewal = max(t for t, name in world.renewals if name == "b0")
    b1_activated = next(t for t, name, _ in world.activations if name == "b1")
    # Counted from when the last renewal's outcome (a timeout) was seen.
    assert b1_activated >= b0_last_renewal + FAST.timeout_seconds + FAST.fence_seconds


def test_after_a_failed_renewal_the_active_is_only_checked_so_the_fence_is_not_extended() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    world.brokers["b0"].partitioned = True
    partitioned_at = world.now
    world.run(10.0)
    assert world.actives() == ["b1"]
    after = [t for t, name in world.active_true_calls if name == "b0" and t >= partitioned_at]
    renewals_after = [t for t, name in world.renewals if name == "b0" and t >= partitioned_at]
    # failureThreshold checks: the first is a renewal (not yet known to fail), the rest are checks.
    assert len(after) == FAST.failure_threshold
    assert len(renewals_after) == 1
    b1_activated = next(t for t, name, _ in world.activations if name == "b1")
    # Fenced from the one renewal's outcome, plus at most one interval before it was sent.
    bound = partitioned_at + FAST.interval_seconds + FAST.timeout_seconds + FAST.fence_seconds
    assert b1_activated <= bound + 2 * RTT


def test_a_check_that_answers_active_resets_failures_and_renewals_resume() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    world.brokers["b0"].partitioned = True
    world.run(FAST.interval_seconds)  # one renewal times out
    assert world.state.broker("b0").failures == 1
    world.brokers["b0"].partitioned = False
    world.run(FAST.interval_seconds * 3)
    assert world.state.active == "b0" and world.state.broker("b0").failures == 0
    calls = [a for a in step(world.state, world.config, {}, world.state.next_active_heartbeat_at).actions]
    assert any(getattr(a, "renew", False) and a.broker == "b0" for a in calls)
    assert world.actives() == ["b0"]


def test_a_paused_active_that_resumes_cannot_act_on_its_queued_renewal() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    world.pause("b0")
    world.run(10.0)  # renewals and checks queue up in b0; b1 takes over after the fence
    assert world.state.active == "b1"
    world.resume("b0")  # handles the queued renewal at its old epoch: refused, it fenced itself
    assert world.actives() == ["b1"]
    assert world.brokers["b0"].term.fenced_epoch == world.brokers["b1"].term.epoch - 1


def test_planned_switchover_allocates_then_drains_then_activates() -> None:
    world = World.create(["b0", "b1"], FAST, preferred=None)
    world.run(3.0)
    config = world.config
    world.config = type(config).of(config.cluster, config.targets, config.settings, "b1")
    decision = step(world.state, world.config, {}, world.now)
    assert [type(a).__name__ for a in decision.actions] == ["AllocateEpoch"]  # b0 is still serving
    world.run(1.0)
    assert world.actives() == ["b1"]
    assert [e.reason for e in world.events][-1] == "Switchover"
    assert world.state.last_move is not None and world.state.last_move.reason == "PreferredActive"


def test_a_planned_move_points_the_service_from_the_old_active_to_the_new_one_without_a_blank() -> None:
    """A blank just before the write that matters made kube-proxy (one sync per minSyncPeriod)
    hold that write back; the drained broker refuses bundles meanwhile. A target that fails
    turns the move into a walk, and then the Service is blanked as in a failover."""
    world = World.create(["b0", "b1", "b2"], FAST, pod_mode=True)
    world.run(3.0)
    assert world.actives() == ["b0"] and world.service == ("b0", 1)
    world.draining = {"b0"}
    world.run(2.0)
    epoch = next(e for _, name, e in world.activations if name != "b0")
    new = world.actives()
    assert [(name, e) for _, name, e in world.service_writes] == [("b0", 1), (*new, epoch)]
    # Again, with the target refusing its activation: the walk goes on with the Service blanked.
    world.draining = {new[0]}
    world.brokers["b0"].activation_fails = True  # the next target: the highest priority off the node
    written = len(world.service_writes)
    world.run(3.0)
    assert world.service_writes[written][1] is None, world.service_writes[written:]
    assert len(world.actives()) == 1 and world.actives() != ["b0"]
    assert world.service[0] == world.actives()[0]


def test_a_drain_of_the_actives_node_switches_over_to_a_standby_elsewhere() -> None:
    world = World.create(["b0", "b1", "b2"], FAST, pod_mode=True)
    world.run(3.0)
    assert world.actives() == ["b0"]
    world.draining = {"b0", "b1"}  # b1's node is drained too: b2 is the only place to go
    world.run(2.0)
    assert world.actives() == ["b2"]
    assert world.state.last_move is not None and world.state.last_move.reason == "NodeDrain"
    assert [e.reason for e in world.events][-1] == "Switchover"
    assert "Failover" not in [e.reason for e in world.events]  # planned, with no overlap or gap in the lease
    # Automatic failback does not return to a broker whose node is still draining ...
    world.run(3 * FAST.failback_stable_seconds)
    assert world.actives() == ["b2"]
    # ... and does once it is uncordoned and has been ready for failbackStableSeconds.
    world.draining = set()
    world.run(3 * FAST.failback_stable_seconds)
    assert world.actives() == ["b0"]


def test_a_drain_with_no_standby_elsewhere_keeps_the_active_and_says_why_once() -> None:
    world = World.create(["b0", "b1"], FAST, pod_mode=True)
    world.run(3.0)
    world.draining = {"b0", "b1"}
    world.run(5.0)
    assert world.actives() == ["b0"]
    blocked = [e for e in world.events if e.reason == "DrainBlocked"]
    assert len(blocked) == 1 and blocked[0].warning and "b0" in blocked[0].message
    world.draining = {"b0"}  # b1's node uncordoned: the switchover can go now
    world.run(2.0)
    assert world.actives() == ["b1"]
    world.draining = {"b1"}  # a second drain, of b1's node, is reported again if blocked
    world.brokers["b0"].alive = False
    world.run(3.0)
    assert len([e for e in world.events if e.reason == "DrainBlocked"]) == 2


def test_a_failover_prefers_a_standby_whose_node_is_not_draining() -> None:
    world = World.create(["b0", "b1", "b2"], FAST, pod_mode=True)
    world.run(3.0)
    assert world.actives() == ["b0"]
    world.draining = {"b1"}  # b1 would be next by priority, but its node is being drained
    world.run(1.0)
    assert world.actives() == ["b0"]  # a drain of a standby's node moves nothing
    world.brokers["b0"].alive = False
    before = len(world.events)
    world.run(3.0)
    assert world.actives() == ["b2"]
    moves = [(e.reason, e.message) for e in world.events[before:] if e.reason in ("Failover", "Switchover")]
    assert len(moves) == 1 and moves[0][0] == "Failover" and "b2" in moves[0][1], moves  # not via b1
    # With b2 gone too, the draining b1 is still better than nobody.
    world.brokers["b2"].alive = False
    world.run(3.0)
    assert world.actives() == ["b1"]


def test_unknown_preferred_active_is_refused_with_an_event() -> None:
    world = World.create(["b0", "b1"], FAST, preferred=None)
    world.run(2.0)
    config = world.config
    world.config = type(config).of(config.cluster, config.targets, config.settings, "b9")
    world.run(2.0)
    assert world.actives() == ["b0"]
    refusal = next(e for e in world.events if e.reason == "SwitchoverRefused")
    assert "b9" in refusal.message and refusal.warning


def test_epoch_conflict_is_retried_and_reported() -> None:
    world = World.create(["b0"], FAST)
    world.refuse_next_allocations = 1
    world.run(3.0)
    assert world.actives() == ["b0"]
    assert any(e.reason == "EpochConflict" for e in world.events)
    assert world.brokers["b0"].term.epoch == world.stored_epoch  # activated with the epoch actually granted


def test_automatic_failback_waits_for_stability_and_manual_stays() -> None:
    for mode, expected in ((FailbackMode.AUTOMATIC, "b0"), (FailbackMode.MANUAL, "b1")):
        settings = HeartbeatSettings(**{**FAST.__dict__, "failback": mode})
        world = World.create(["b0", "b1"], settings, pod_mode=True)
        world.run(2.0)
        world.crash("b0")
        world.run(1.0)
        assert world.actives() == ["b1"]
        world.restart("b0")
        world.run(settings.failback_stable_seconds / 2)
        assert world.actives() == ["b1"], "failback before failbackStableSeconds"
        world.run(settings.failback_stable_seconds + 3)
        assert world.actives() == [expected], mode


def test_walk_exhausted_reports_unavailable_and_keeps_retrying() -> None:
    world = World.create(["b0", "b1"], FAST)
    for broker in world.brokers.values():
        broker.activation_fails = True
    world.run(5.0)
    assert world.actives() == []
    assert status_of(world.state, world.config).phase == "Unavailable"
    assert sum(e.reason == "NoBrokerAvailable" for e in world.events) == 1
    world.brokers["b1"].activation_fails = False
    world.run(3.0)
    assert world.actives() == ["b1"]


def test_brokers_given_after_an_empty_start_are_walked() -> None:
    world = World.create([], FAST, processes=("b0", "b1"))
    world.run(2.0)
    # Pods without addresses yet: the cluster is Pending, with no warning event.
    assert world.actives() == [] and status_of(world.state, world.config).phase == "Pending"
    assert not [e for e in world.events if e.reason == "NoBrokerAvailable"]
    world.set_targets(["b0", "b1"])
    world.run(2.0)
    assert world.actives() == ["b0"] and world.stored_epoch == 1


def test_removed_active_is_fenced_before_the_next_is_activated() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    world.brokers["b0"].partitioned = True  # still active, cannot hear active=false
    world.set_targets(["b1"])
    world.run(FAST.fence_seconds + 2.0)  # the world asserts no overlap at b1's activation
    assert world.actives() == ["b1"]
    b0_last_contact = max(t for t, name in world.active_true_calls if name == "b0")
    b1_activated = next(t for t, name, _ in world.activations if name == "b1")
    assert b1_activated >= b0_last_contact + FAST.fence_seconds
    assert [b.name for b in world.state.brokers] == ["b1"]  # forgotten once surely inactive


def test_readdressed_active_fails_over_after_the_old_address_bound() -> None:
    manual = HeartbeatSettings(**{**FAST.__dict__, "failback": FailbackMode.MANUAL})
    world = World.create(["b0", "b1"], manual)
    world.run(2.0)
    world.set_targets(["b0", "b1"], readdress=frozenset({"b0"}))  # the old b0 keeps running
    world.run(FAST.fence_seconds + 2.0)
    assert world.actives() == ["b1"]
    assert any(e.reason == "ActiveUnavailable" and "moved to" in e.message for e in world.events)


def test_a_lone_broker_that_fenced_itself_after_a_stall_is_reactivated_with_a_new_epoch() -> None:
    world = World.create(["b0"], FAST)
    world.run(2.0)
    first_epoch = world.brokers["b0"].term.epoch
    world.clock_step(5.0)  # a VM pause: b0 fences itself at first_epoch when it runs again
    assert world.actives() == []
    world.run(FAST.fence_seconds + 5 * FAST.interval_seconds)
    assert world.actives() == ["b0"]
    assert world.state.active == "b0"
    assert world.brokers["b0"].term.epoch > first_epoch  # the fenced epoch was never reused


def test_failback_to_a_broker_that_cannot_activate_is_held_off() -> None:
    eager = HeartbeatSettings(**{**FAST.__dict__, "failback_stable_seconds": 0.0})
    world = World.create(["b0", "b1"], eager)
    world.run(2.0)
    world.crash("b0")
    world.run(2.0)
    assert world.actives() == ["b1"]
    world.restart("b0")
    world.brokers["b0"].activation_fails = True  # answers probes Inactive, refuses to activate
    since = world.now
    world.run(12.0)
    attempts = [t for t, name in world.active_true_calls if name == "b0" and t >= since]
    # One try per holdoff (10 intervals here), not one per probe; b1 is restored after each.
    holdoff = 10 * eager.interval_seconds
    assert 1 <= len(attempts) <= 12.0 / holdoff + 1, attempts
    assert world.actives() == ["b1"]


def test_retry_delay_doubles_from_one_interval_up_to_30_seconds() -> None:
    config = World.create(["b0"], FAST).config
    assert [retry_delay(config, rounds) for rounds in range(9)] == [0.5, 0.5, 1, 2, 4, 8, 16, 30, 30]
    assert retry_delay(config, 10_000) == 30  # no overflow however long the outage
    slow = HeartbeatSettings(interval_seconds=45, timeout_seconds=1, lease_seconds=100)
    assert retry_delay(World.create(["b0"], slow).config, 3) == 45  # never faster than the interval


def round_starts(world: World, broker: str, since: float) -> list[float]:
    """When ``broker`` got active=true: with every activation refused, once per round."""
    return [t for t, name in world.active_true_calls if name == broker and t >= since]


def test_failed_rounds_back_off_exponentially_and_reset_once_a_broker_activates() -> None:
    world = World.create(["b0", "b1"], FAST)
    for broker in world.brokers.values():
        broker.activation_fails = True
    world.run(100.0)
    starts = round_starts(world, "b0", 0.0)
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    # Each gap is the backoff plus the round itself (two refusals, a fence, an allocation:
    # a few round trips). Before the backoff, a round began every interval, forever.
    expected = [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert len(gaps) >= len(expected)
    for gap, delay in zip(gaps, expected, strict=False):
        assert delay <= gap <= delay + 0.1, (gaps, expected)
    assert world.actives() == [] and status_of(world.state, world.config).phase == "Unavailable"

    # The backend comes back: the next round (at most 30 s away) activates b0.
    for broker in world.brokers.values():
        broker.activation_fails = False
    world.run(31.0)
    assert world.actives() == ["b0"]

    # Success reset the backoff: after a new failure the first retry is one interval later.
    for broker in world.brokers.values():
        broker.activation_fails = True
    world.brokers["b0"].term.fence("its backend went away (simulated)")  # b0 loses its activation
    failed_at = world.now
    world.run(10.0)
    starts = round_starts(world, "b1", failed_at)
    assert len(starts) >= 3 and starts[1] - starts[0] <= FAST.interval_seconds + 0.1, starts


def test_every_broker_refusing_costs_a_few_writes_a_minute_not_several_a_second() -> None:
    # Issue 13: backend and cloud unreachable, default settings: epoch 8 to 70 in 35 s, and
    # a status write with every epoch.
    world = World.create(["b0", "b1"], HeartbeatSettings())
    for broker in world.brokers.values():
        broker.activation_fails = True
    world.run(60.0)
    grants, writes = len(world.grants), world.status_writes
    world.run(300.0)
    # At the 30 s cap: one round (two allocations, one per broker) per half minute, and
    # no status write, since the status shows the same refusals every round.
    assert len(world.grants) - grants <= 2 * (300 // 30 + 1), world.grants
    assert world.status_writes == writes
    assert [e.reason for e in world.events].count("NoBrokerAvailable") == 1


def test_status_shows_each_brokers_answer_to_its_activation_not_what_came_after() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.brokers["b0"].activation_fails = True
    world.brokers["b1"].slow = True  # acts, but its answers arrive after the timeout
    world.brokers["b1"].activation_fails = True
    world.run(10.0)
    # b0 answered its activation BACKEND_UNREACHABLE and then active=false with Inactive;
    # probes to b1 keep timing out. Status shows what each activation came back with.
    world.brokers["b1"].slow = False
    world.brokers["b1"].partitioned = True  # now its probes fail to connect in time
    world.run(5.0)
    shown = {b.name: b for b in status_of(world.state, world.config).brokers}
    assert (shown["b0"].state, shown["b0"].unavailability_code) == ("Unavailable", "BACKEND_UNREACHABLE")
    assert shown["b0"].unavailability_message == "BACKEND_UNREACHABLE"
    assert (shown["b1"].state, shown["b1"].unavailability_code) == ("Unavailable", "HEARTBEAT_TIMEOUT")
    assert world.state.broker("b0").state == "Inactive"  # what it answered last, all the same
    unavailable = next(e for e in world.events if e.reason == "NoBrokerAvailable")
    assert "b0: BACKEND_UNREACHABLE" in unavailable.message
    assert "b1: HEARTBEAT_TIMEOUT" in unavailable.message
    # Once a broker is active, every broker is shown as it last answered.
    world.brokers["b1"].partitioned = False
    world.brokers["b0"].activation_fails = False
    world.run(31.0)
    assert world.actives() == ["b0"]
    shown = {b.name: b for b in status_of(world.state, world.config).brokers}
    assert (shown["b0"].state, shown["b0"].unavailability_code) == ("Active", None)
    assert (shown["b1"].state, shown["b1"].unavailability_code) == ("Inactive", None)


def test_a_recreated_cluster_jumps_above_the_epoch_its_brokers_remember_in_one_allocation() -> None:
    # Issue 13: brokers that remember epoch 94 (a deleted BrokerCluster's disks, or endpoints)
    # made a new cluster climb from 1 to 94 one compare-and-swap at a time.
    world = World.create(["b0", "b1"], FAST)
    for broker in world.brokers.values():
        broker.new_process(epoch=94)
    world.target_epoch = 94
    world.run(2.0)
    assert world.actives() == ["b0"]
    assert world.brokers["b0"].term.epoch == 95
    # The first allocation is made before anyone answered; b0 refuses it as STALE_EPOCH with
    # its stored 94, and the next allocation goes straight above it.
    assert world.grants == [(1, "engine"), (95, "engine")]
    assert any(e.reason == "StaleEpoch" and "epoch 94" in e.message for e in world.events)


def test_next_epoch_is_above_every_epoch_a_broker_reported() -> None:
    world = World.create(["b0", "b1"], FAST, stored_epoch=3)
    state = world.state.with_broker("b1", reported_epoch=94)
    assert next_epoch(state) == 95
    assert next_epoch(world.state) == 4  # nobody reported more than the cluster's epoch


def test_targets_that_refuse_the_epoch_fail_the_activation_without_a_tight_loop() -> None:
    # The broker stored our epoch but its backend has seen a higher one: the reply cannot say
    # which. It used to be re-sent at once with the same epoch, forever.
    world = World.create(["b0", "b1"], FAST)
    world.target_epoch = 50
    world.run(60.0)  # would raise "did not settle" on a livelock
    assert world.actives() == []
    shown = {b.name: b for b in status_of(world.state, world.config).brokers}
    assert shown["b0"].unavailability_code == "STALE_EPOCH"
    # One new epoch per broker per round, the rounds backing off: a handful, not one per step.
    assert len(world.grants) <= 2 * 8, world.grants


def test_the_service_follows_the_activation_first_in_its_step_and_points_at_nobody_meanwhile() -> None:
    world = World.create(["b0", "b1"], FAST, pod_mode=True)
    world.run(2.0)
    assert world.service == ("b0", 1)
    world.crash("b0")  # the pod facts say its container terminated: a failover at once
    decision = step(world.state, world.config, world.pod_facts(), world.now)
    assert isinstance(decision.actions[0], PointActive) and decision.actions[0].active is None
    world.run(2.0)
    epoch = next(e for _, name, e in world.activations if name == "b1")
    assert world.service == ("b1", epoch)
    writes = [(name, e) for _, name, e in world.service_writes]
    assert writes == [("b0", 1), (None, writes[1][1]), ("b1", epoch)]
    assert writes[1][1] <= epoch  # the blank is written under the cluster's epoch, never above
    # In the step that folds the activation's answer, not an interval after the blank.
    activated_at = next(t for t, name, _ in world.activations if name == "b1")
    written_at = world.service_writes[2][0]
    assert written_at - activated_at < FAST.interval_seconds / 2, (activated_at, written_at)


def test_a_restarted_engine_leaves_the_service_alone_until_it_has_an_active() -> None:
    world = World.create(["b0", "b1"], FAST, stored_epoch=4, last_active="b0")
    world.run(2.0)
    assert world.actives() == ["b0"]
    # Confirming the last active took a round trip; blanking the Service meanwhile would have
    # cut traffic at every operator restart.
    assert [name for _, name, _ in world.service_writes] == ["b0"]


def test_a_lost_watch_connection_counts_a_failure_and_checks_the_active_at_once() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    url = world.config.targets[0].url
    lost = ConnectionLost("b0", url, "reset by peer (simulated)")
    decision = step(world.state, world.config, {}, world.now, [lost])
    checks = [a for a in decision.actions if isinstance(a, SendHeartbeat) and a.broker == "b0"]
    # At once, not at the next interval; a check (renew=False), since a failure was counted.
    assert [(a.active, a.renew) for a in checks] == [(True, False)]
    b0 = decision.state.broker("b0")
    assert b0 is not None and b0.failures == 1 and b0.code == "CONNECTION_LOST"
    world.state = decision.state
    world.run(2.0)
    assert world.actives() == ["b0"]  # alive: the check answered Active and renewals resumed


def test_a_proof_of_death_is_void_once_the_broker_answered_after_it() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    url = world.config.targets[0].url
    b0 = world.state.broker("b0")
    assert b0 is not None and b0.last_reply_at is not None
    earlier = b0.last_reply_at - 0.001  # b0 answered a renewal after it: something listens there
    decision = step(world.state, world.config, {}, world.now, [ProcessGone("b0", url, earlier, "stale")])
    assert decision.state.active == "b0"
    fresh = step(world.state, world.config, {}, world.now, [ProcessGone("b0", url, world.now, "gone")])
    gone = fresh.state.broker("b0")
    assert gone is not None and gone.possibly_active_until is None
    assert fresh.state.active is None and fresh.state.move is not None  # failing over, at once
    assert fresh.state.move.reason == "PROCESS_GONE"
