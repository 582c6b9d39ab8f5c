"""Stateful property tests: the decision core against simulated brokers under random faults.

Hypothesis drives :class:`tests.unit.core.simulation.World` through crashes (some proven
at once or late by the operator's watch connection), broken watch connections, restarts,
partitions, pauses (SIGSTOP), slow replies, journal failures, activation failures, epoch
conflicts, preferredActive changes and clock steps, and checks on
every broker action that

- no two brokers are ever active at the same instant (also during planned moves),
- every activation uses an epoch granted to this engine (never one another operator
  was granted), and no epoch is given to two brokers,
- the cluster's stored epoch (``status.epoch``) never goes down and no epoch is
  granted twice, while another operator allocates epochs too: the compare-and-swap
  is its only writer, the status patches the shell writes on every change included,
- ``active=true`` goes only to the current active or the move's candidate (never
  to a standby that should stay inactive),
- the ``-active`` Service is pointed only at a broker activated with the epoch the write
  carries, and never back under a lower epoch (the shell's fence),
- all of this also while the spec's broker set changes under the engine (brokers
  added, removed, re-addressed, or none at all, as for a cluster whose pods have
  no IPs yet): removed or re-addressed processes count as actives until they are
  fenced or self-fenced,

and, once the faults stop, that the cluster converges: under ``Automatic`` to the
preferred broker or else the highest-priority one, under ``Manual`` to some
broker that then stays put, with the Service pointing at it. The simulated brokers
stand in for broker processes (the integration tests run real ones), but their
heartbeat rules are the broker's own
term state machine (``broker_service.term``); the core itself is the real code.
"""

from __future__ import annotations

import itertools
import os

from hypothesis import HealthCheck, settings
from hypothesis import Phase as Phase_
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker_operator.core import FailbackMode, HeartbeatSettings, MoveKind, Phase, status_of
from broker_service.term import lease_margin_seconds
from tests.unit.core.simulation import NAMES_POOL, World

NAMES = NAMES_POOL[:4]


@st.composite
def heartbeat_settings(draw: st.DrawFn) -> HeartbeatSettings:
    interval = draw(st.sampled_from([0.2, 1.0]))
    threshold = draw(st.integers(1, 3))
    # The lease must exceed interval x threshold (HeartbeatSettings refuses less).
    lease = interval * threshold + draw(st.sampled_from([0.5, 3.0]))
    return HeartbeatSettings(
        interval_seconds=interval,
        timeout_seconds=draw(st.sampled_from([0.1, 0.2])),
        failure_threshold=threshold,
        lease_seconds=lease,
        # Below the lease it is taken as the lease (HeartbeatSettings.granted_handover_seconds).
        handover_lease_seconds=draw(st.sampled_from([0.1, lease + 2.0])),
        standby_probe_seconds=draw(st.sampled_from([0.0, 1.0, 10.0])),
        failback=draw(st.sampled_from(list(FailbackMode))),
        failback_stable_seconds=draw(st.sampled_from([0.0, 3.0])),
        # The margin the operator and the broker both derive from the lease (spec and --lease-seconds).
        lease_margin_seconds=lease_margin_seconds(lease),
    )


SETTINGS = heartbeat_settings()


class FailoverMachine(RuleBasedStateMachine):
    world: World

    @initialize(
        count=st.integers(0, 4),
        heartbeat=SETTINGS,
        pod_mode=st.booleans(),
        stored_epoch=st.integers(0, 3),
        restart_with_active=st.booleans(),
        remembered_epoch=st.sampled_from([0, 0, 7, 94]),
        # As the operator runs it (engine.cluster_phase), or without a phase.
        phase=st.none() | st.floats(0.0, 1.0, exclude_max=True),
    )
    def start(
        self,
        *,
        count: int,
        heartbeat: HeartbeatSettings,
        pod_mode: bool,
        stored_epoch: int,
        restart_with_active: bool,
        remembered_epoch: int,
        phase: float | None,
    ) -> None:
        names = NAMES[:count]
        last_active = names[-1] if names and restart_with_active and stored_epoch > 0 else None
        self.world = World.create(
            names,
            heartbeat,
            pod_mode=pod_mode,
            stored_epoch=stored_epoch,
            last_active=last_active,
            processes=tuple(NAMES),
            phase=phase,
        )
        if last_active:
            # A previous operator left this broker active with the stored epoch.
            self.world.left_active(last_active, stored_epoch)
        elif remembered_epoch > stored_epoch:
            # A re-created BrokerCluster whose brokers remember an earlier life's epoch: the
            # engine must get above it (in one allocation: test_decisions checks the count).
            # The targets' memory of it is left out: a broker added later with a fresh disk
            # would meet it and climb one epoch per backed-off round, too slow to converge here
            # (test_targets_that_refuse_the_epoch_fail_the_activation_without_a_tight_loop).
            for broker in self.world.brokers.values():
                broker.new_process(epoch=remembered_epoch)
        self.world.run(0.5)

    def _name(self, data: st.DataObject) -> str:
        # Faults hit processes the spec names or used to name; the retired ones are out of reach.
        return data.draw(st.sampled_from(sorted(self.world.brokers)))

    @rule(seconds=st.floats(0.05, 3.0))
    def time_passes(self, seconds: float) -> None:
        self.world.run(seconds)

    @rule(seconds=st.floats(5.0, 40.0))
    def clock_steps(self, seconds: float) -> None:
        # Everyone's time jumps (a paused VM, a long GC): no step runs in between.
        self.world.clock_step(seconds)
        self.world.run(0.1)

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        self.world.crash(self._name(data))
        self.world.run(0.01)

    @rule(data=st.data(), delay=st.sampled_from([0.0, 0.05, 1.5, 6.0]))
    def crash_seen_by_the_watch(self, data: st.DataObject, delay: float) -> None:
        # The proof of death from the watch (ProcessGone), heard at once or late, after a restart.
        self.world.crash(self._name(data), noticed_after=delay)
        self.world.run(0.01)

    @rule(data=st.data(), delay=st.sampled_from([0.0, 0.5]))
    def watch_connection_breaks(self, data: st.DataObject, delay: float) -> None:
        self.world.connection_lost(self._name(data), after=delay)

    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        self.world.restart(self._name(data))

    # Not while a broker the spec no longer names may still be active (a scale-down's pod still
    # terminating): a new engine knows only the spec's brokers and would not wait for it. A known
    # gap, narrow (the operator restarting within one lease of a scale-down), not yet closed.
    @precondition(lambda self: self.world.only_spec_brokers_may_be_active())
    @rule(lost_status_writes=st.integers(0, 2))
    def operator_restarts(self, lost_status_writes: int) -> None:
        # The operator's own process restarts: its successor starts from the object as stored,
        # and the old one's last status writes may never have landed. One epoch, one broker:
        # the successor must not send an epoch that may be another broker's.
        self.world.operator_restarts(lost_status_writes)

    # The same gap as operator_restarts; the gap: the pod's replacement, within or past the lease.
    @precondition(lambda self: self.world.only_spec_brokers_may_be_active())
    @rule(gap=st.sampled_from([0.0, 1.5, 8.0]), lost_status_writes=st.integers(0, 2), cut_off=st.booleans())
    def operator_hands_over(self, gap: float, lost_status_writes: int, cut_off: bool) -> None:
        # A graceful exit (an upgrade): the active's handover renewal, then nobody renews for
        # `gap`, then the successor starts with the start fence and no memory of the handover.
        # `cut_off`: the active is partitioned right after it took the handover, so the successor
        # must fail it over, and must wait out the handover lease it never heard of to do it.
        active = self.world.state.active
        self.world.operator_hands_over(gap, lost_status_writes)
        if cut_off and active is not None:
            self.world.brokers[active].partitioned = True

    @rule(data=st.data(), on=st.booleans())
    def partition(self, data: st.DataObject, on: bool) -> None:
        self.world.brokers[self._name(data)].partitioned = on

    @rule(data=st.data(), on=st.booleans(), watcher_first=st.booleans())
    def pause(self, data: st.DataObject, on: bool, watcher_first: bool) -> None:
        # SIGSTOP / SIGCONT of one process; what it queued meanwhile is handled on resume,
        # before or after the lease watcher's first tick (the event loop may run either first).
        name = self._name(data)
        self.world.pause(name) if on else self.world.resume(name, watcher_first=watcher_first)

    @rule(data=st.data(), on=st.booleans())
    def slow_replies(self, data: st.DataObject, on: bool) -> None:
        self.world.brokers[self._name(data)].slow = on

    @rule(on=st.booleans())
    def operator_runs_late(self, on: bool) -> None:
        # The operator's own loop is behind: its timeouts are not counted against the brokers.
        self.world.operator_late = on

    @rule(data=st.data())
    def journal_fails(self, data: st.DataObject) -> None:
        # A journal write fails: the broker fences itself and is no standby until restarted.
        self.world.journal_fails(self._name(data))

    @rule(data=st.data(), on=st.booleans())
    def activation_fails(self, data: st.DataObject, on: bool) -> None:
        self.world.brokers[self._name(data)].activation_fails = on

    @rule(times=st.integers(1, 2))
    def epoch_conflict(self, times: int) -> None:
        self.world.refuse_next_allocations = times

    @rule()
    def other_operator_allocates(self) -> None:
        # A second operator (a replica that stalled and resumed, an upgrade) allocates between
        # our steps; this engine learns of it only when its own next allocation conflicts.
        self.world.other_operator_allocates()

    @rule(data=st.data())
    def change_preferred(self, data: st.DataObject) -> None:
        preferred = data.draw(st.none() | st.sampled_from(sorted(self.world.brokers)))
        config = self.world.config
        self.world.config = type(config).of(
            config.cluster, config.targets, config.settings, preferred, paused=config.paused
        )

    @rule(on=st.booleans())
    def pause_reconciliation(self, on: bool) -> None:
        # The annotation set or removed (core/pause.py): while set, the world refuses any epoch
        # allocation, any active=true but the active's or the resumed holder's, and any new term.
        self.world.set_paused(on)

    @rule(
        names=st.lists(st.sampled_from(NAMES_POOL), unique=True, max_size=4),
        readdress=st.frozensets(st.sampled_from(NAMES_POOL)),
    )
    def change_targets(self, names: list[str], readdress: frozenset[str]) -> None:
        # Pods getting or losing IPs, scale up/down, endpoints edited; `readdress`
        # moves some of the brokers that stay to a new address (a new process).
        self.world.set_targets(names, readdress)

    @invariant()
    def at_most_one_active(self) -> None:
        assert len(self.world.actives()) <= 1, self.world.actives()

    @precondition(lambda self: hasattr(self, "world"))
    @invariant()
    def epoch_never_goes_down(self) -> None:
        history = self.world.stored_epochs
        lowered = [(a, b) for a, b in itertools.pairwise(history) if b < a]
        assert not lowered, f"status.epoch went down: {lowered} (every value: {history})"

    @precondition(lambda self: hasattr(self, "world"))
    @invariant()
    def no_epoch_granted_twice(self) -> None:
        epochs = [epoch for epoch, _ in self.world.grants]
        twice = sorted({e for e in epochs if epochs.count(e) > 1})
        assert not twice, f"epochs {twice} granted twice: {self.world.grants}"

    @precondition(lambda self: hasattr(self, "world"))
    @invariant()
    def status_names_real_brokers(self) -> None:
        status = status_of(self.world.state, self.world.config)
        assert status.active is None or status.active in self.world.brokers
        assert status.epoch >= max((e for _, _, e in self.world.activations), default=0)

    def teardown(self) -> None:
        if not hasattr(self, "world"):
            return
        world = self.world
        world.operator_late = False
        world.set_paused(False)  # resumed: the engine must converge as after any fault
        for broker in world.brokers.values():
            broker.partitioned = broker.slow = broker.activation_fails = False
            world.resume(broker.name)
            if not broker.alive or broker.journal_error:
                world.restart(broker.name)
        heartbeat = world.config.settings
        settle = (
            heartbeat.start_fence_seconds
            + 3 * heartbeat.fence_seconds
            + heartbeat.failback_stable_seconds
            + 3 * heartbeat.standby_probe_seconds
        )
        # A walk may be backing off after a long run of refused activations (up to 30 s).
        move = world.state.move
        backoff_left = max(0.0, move.retry_at - world.now) if move is not None else 0.0
        world.run(settle + backoff_left + 5)
        actives = world.actives()
        if not world.config.targets:
            assert actives == [], f"brokers {actives} active with none in the spec"
            # Pending while no broker was ever in the spec (pods without IPs), else Unavailable.
            move = world.state.move
            never = move is not None and move.kind is MoveKind.STARTUP and move.rounds == 1
            expected_phase = Phase.PENDING if never else Phase.UNAVAILABLE
            assert status_of(world.state, world.config).phase == expected_phase.value
            return
        assert len(actives) == 1, f"no single active after faults stopped: {actives}"
        assert world.state.active == actives[0], (world.state.active, actives)
        status = status_of(world.state, world.config)
        assert status.active == actives[0]
        assert world.service == (actives[0], world.state.active_epoch), (
            f"the -active Service points at {world.service}, the active is {actives[0]}"
        )
        # Failback needs evidence that the better broker is healthy: with standby
        # probes off (standbyProbeSeconds 0) the engine stays where it is.
        if heartbeat.failback is FailbackMode.AUTOMATIC and heartbeat.standby_probe_seconds > 0:
            preferred = world.config.preferred_active
            in_spec = preferred is not None and world.config.target(preferred) is not None
            expected = preferred if in_spec else world.config.targets[0].name
            assert actives[0] == expected, f"Automatic should converge to {expected}, is on {actives[0]}"
        # Quiet period: nothing moves any more, and no standby gets active=true.
        calls_before = len(world.active_true_calls)
        world.run(2 * settle + 10)
        assert world.actives() == actives, f"active moved from {actives} to {world.actives()} while quiet"
        quiet_calls = {name for _, name in world.active_true_calls[calls_before:]}
        assert quiet_calls <= set(actives), (
            f"active=true to standbys {quiet_calls - set(actives)} while quiet"
        )
        if heartbeat.standby_probe_seconds > 0 or len(world.brokers) == 1:
            assert status_of(world.state, world.config).phase == Phase.HEALTHY.value


TestFailover = FailoverMachine.TestCase
TestFailover.settings = settings(
    max_examples=int(os.environ.get("CORE_EXAMPLES", "120")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
    phases=[Phase_.explicit, Phase_.reuse, Phase_.generate]
    + ([Phase_.shrink] if os.environ.get("CORE_SHRINK", "1") == "1" else []),
)
