"""The heartbeat and failover rules as one pure function: ``step``.

``step(state, config, pod_facts, now, observations)`` folds in what the last
actions produced, then decides what to do now: renew the active, probe standbys,
fence brokers that may still be active, allocate an epoch, activate the next
candidate, point the ``-active`` Service, record events. It returns the new knowledge, the
actions, and when it next needs to run. The loop in ``engine.py`` is the only
caller in production; the property tests drive it against simulated brokers.

The safety rule every path goes through is the *gate* in :func:`_progress_move`:
a candidate gets ``active=true`` only when every other broker is known not
active (see :mod:`.knowledge` for what "known" means) and the epoch it gets was
granted to this cluster and never sent to another broker. Planned moves
(switchover, failback) allocate the epoch first, then drain the active with
``active=false``, so the window with no active is two round trips, and there is
never a window with two.

Cost when nothing can be activated (every broker refuses, say its backend is
unreachable): each round of the walk costs a compare-and-swap per broker tried, so
rounds that failed back off exponentially (:func:`retry_delay`), and an epoch a broker
reported as stored is reached in one allocation (:func:`next_epoch`), not one per step.

What it does not do: talk to anything, read a clock, sleep, or decide
``Conflict`` (the controller does). Everything is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker_operator.core.actions import (
    Action,
    AllocateEpoch,
    Observation,
    PointActive,
    RecordEvent,
    SendHeartbeat,
)
from broker_operator.core.frozen import replace
from broker_operator.core.knowledge import (
    BrokerKnowledge,
    ClusterConfig,
    EngineState,
    Move,
    MoveKind,
    apply_pod_facts,
    later_bound,
    preference_order,
    reconcile_targets,
)
from broker_operator.core.model import FailbackMode, PodFacts
from broker_operator.core.observe import observe
from broker_operator.core.pause import hold_failover, hold_move, may_activate
from broker_operator.core.planned_moves import consider_planned_move
from broker_operator.core.reported import shown_answer


@dataclass(frozen=True)
class Decision:
    state: EngineState
    actions: tuple[Action, ...]
    wake_at: float  # run the next step no later than this (engine clock)


def step(
    state: EngineState,
    config: ClusterConfig,
    pod_facts: Mapping[str, PodFacts],
    now: float,
    observations: Iterable[Observation] = (),
) -> Decision:
    state = reconcile_targets(state, config, now)
    state = apply_pod_facts(state, pod_facts)
    for observation in observations:
        state = observe(state, config, observation, now)
    cause = failover_cause(state, config, now)
    if config.paused:  # no failover and no planned move: core/pause.py
        state = hold_failover(state, cause)
    else:
        state = replace(state, held_failover=None) if state.held_failover is not None else state
        state = _fail_over(state, config, now, cause) if cause is not None else state
        state = consider_planned_move(state, config, now)
    plan = _Plan(state, now)
    _progress_move(plan, config)
    _renew_active(plan, config)
    _fence_and_probe(plan, config)
    _point_service(plan, config)
    for reason, message, warning in plan.state.events_due:
        plan.actions.append(RecordEvent(reason, message, warning))
    plan.state = replace(plan.state, events_due=())
    return Decision(plan.state, tuple(plan.actions), _wake_at(plan.state, config, now))


class _Plan:
    """The step being built: knowledge so far, actions so far, brokers already contacted."""

    def __init__(self, state: EngineState, now: float) -> None:
        self.state = state
        self.now = now
        self.actions: list[Action] = []
        self.contacted: set[str] = set()
        self.candidate: str | None = None  # the broker the move is about to (or would) activate
        self.activating = False  # this step sends the candidate active=true

    def heartbeat(
        self,
        broker: BrokerKnowledge,
        active: bool,
        epoch: int,
        *,
        renew: bool = True,
        activation: bool = False,
    ) -> None:
        # One request per broker per step: the loop runs a step's actions concurrently.
        assert broker.name not in self.contacted, broker.name
        self.contacted.add(broker.name)
        self.actions.append(SendHeartbeat(broker.name, broker.url, active, epoch, renew, activation))


def choose_next_active(state: EngineState, move: Move) -> str | None:
    """The next broker to try in ``move``: its designated first choice, then ready standbys, then the rest.

    Ready standbys (last seen ``Inactive``) go before unknown or unavailable ones
    because a candidate that does not answer must be fenced for a whole lease
    before the walk may go on. Within each, brokers on a draining node go last: the
    drain would evict one soon after, a second move; a ready one on a draining node
    still goes before one that may not answer.
    """
    eligible = [
        name
        for name in move.order
        if name not in move.tried
        and (broker := state.broker(name)) is not None
        and broker.in_spec
        and not broker.dead
    ]
    if not eligible:
        return None
    if move.first is not None and eligible[0] == move.first:
        return eligible[0]

    def preference(name: str) -> tuple[bool, bool]:
        broker = state.broker(name)
        assert broker is not None  # eligible names only
        return (not broker.ready, broker.draining)

    return min(eligible, key=preference)  # the first in move.order among the best


def next_epoch(state: EngineState) -> int:
    """The epoch to allocate: one above both the cluster's epoch and every epoch a broker reported.

    A broker's reported epoch is the highest it stored, from an activation or a probe, of
    this engine or of one we never knew (a deleted and re-created BrokerCluster whose
    brokers kept their disks, an endpoint another operator ran). Going above all of them
    at once keeps epochs unshared without asking which broker had which, and costs one
    compare-and-swap instead of one per epoch in between (issue 13: 94 writes in 3 s).
    """
    reported = max((b.reported_epoch for b in state.brokers), default=-1)
    return max(state.epoch, reported) + 1


# Exhausted walks back off from one interval, doubling, up to this (or one interval, if longer).
RETRY_BACKOFF_CAP_SECONDS = 30.0


def retry_delay(config: ClusterConfig, failed_rounds: int) -> float:
    """How long an exhausted walk waits before the next round, after ``failed_rounds`` failed ones.

    Every round whose activations all failed costs a compare-and-swap per broker tried
    (and events); without a backoff, a cluster whose backend is down wrote twice a second
    for as long as the outage lasted (issue 13). Doubling from one interval keeps a blip as
    cheap to recover from as before (the first retry comes after one interval), and the
    cap bounds how long a cluster stays Unavailable after the cause is fixed: at most 30 s
    more, the default failbackStableSeconds, while the writes drop to about one per broker
    per 30 s. A round in which nobody could be tried (every pod dead, no address yet) made
    no write and retries every interval: a pod coming back is activated at once.
    """
    interval = config.settings.interval_seconds
    if failed_rounds <= 0:
        return interval
    return min(interval * 2 ** min(failed_rounds - 1, 32), retry_delay_cap(config))


def retry_delay_cap(config: ClusterConfig) -> float:
    """The longest wait between two rounds of activations: 30 s, or one interval if that is longer."""
    return max(RETRY_BACKOFF_CAP_SECONDS, config.settings.interval_seconds)


def epoch_usable(state: EngineState, candidate: str) -> bool:
    """May ``state.epoch`` be sent to ``candidate`` with ``active=true``?

    Only if it was never sent with ``active=true`` to another broker (``epoch_holder``)
    and the candidate has not stored a higher one. Reported epochs of other brokers
    do not count: brokers also store the epoch of an ``active=false`` probe (so that
    a stale operator cannot activate them), which binds nothing.
    """
    if state.epoch_ended or state.epoch_holder not in (None, candidate) or state.epoch <= 0:
        return False
    broker = state.broker(candidate)
    return broker is None or broker.reported_epoch <= state.epoch


def failover_cause(state: EngineState, config: ClusterConfig, now: float) -> tuple[str, str] | None:
    """(reason, what happened) when the active must be failed over now: it is gone from the spec,
    dead, or failed too often; None otherwise (or with no active)."""
    if state.active is None:
        return None
    broker = state.broker(state.active)
    threshold = config.settings.failure_threshold
    if broker is None or not broker.in_spec:
        reason, detail = "RemovedFromSpec", "was removed from the spec"
    elif broker.dead:
        reason, detail = broker.code or "CONTAINER_TERMINATED", broker.message or "its container is dead"
    elif broker.gone_at is not None:
        reason, detail = "PROCESS_GONE", broker.message or "its process is gone"
    elif broker.earlier_address_possibly_active(now):
        # Renewing at the new address could activate a second process while the
        # one at the old address is still active: fail over through the gate.
        reason, detail = "AddressChanged", f"moved to {broker.url} in the spec"
    elif broker.failures >= threshold:
        reason = broker.code or "HEARTBEAT_FAILED"
        detail = f"failed {broker.failures} heartbeats in a row (last: {broker.message or broker.state})"
    else:
        return None
    return reason, detail


def _fail_over(state: EngineState, config: ClusterConfig, now: float, cause: tuple[str, str]) -> EngineState:
    """Start a failover away from the active, for ``cause`` (:func:`failover_cause`)."""
    reason, detail = cause
    old = state.active
    assert old is not None  # a cause is found only for an active
    broker = state.broker(old)
    if broker is not None:
        state = state.with_broker(old, failures=0, ready_since=None, state="Unavailable", code=reason[:30])
    move = Move(
        MoveKind.FAILOVER,
        from_=old,
        reason=reason,
        started_at=now,
        order=preference_order(config, None),
        tried=frozenset({old}),
    )
    state = replace(state, active=None, move=move, epoch_ended=state.epoch_ended or state.epoch_holder == old)
    return state.with_event("ActiveUnavailable", f"active broker {old} {detail}; failing over", True)


def _progress_move(plan: _Plan, config: ClusterConfig) -> None:
    state, now = plan.state, plan.now
    move = state.move
    if move is None:
        return
    if move.candidate is not None:
        # The loop always reports an activation's outcome before the next step; if
        # it did not, count the candidate as tried and possibly active (safe side).
        unreported = state.broker(move.candidate)
        state = state.with_broker(
            move.candidate,
            possibly_active_until=later_bound(
                unreported.possibly_active_until if unreported else None, now + config.settings.fence_seconds
            ),
            unanswered_activation=True,
        )
        move = replace(move, candidate=None, tried=move.tried | {move.candidate})
        state = replace(state, move=move)
    if move.retry_at > now:
        plan.state = state
        return
    candidate = choose_next_active(state, move)
    if candidate is None:
        plan.state = _walk_exhausted(state, config, move, now)
        return
    if not may_activate(state, config, candidate):
        plan.state = hold_move(state, move)  # paused: the move waits (core/pause.py)
        return
    plan.candidate = candidate
    if not epoch_usable(state, candidate):
        if now >= state.epoch_retry_at and not config.paused:
            plan.actions.append(AllocateEpoch(state.epoch, next_epoch(state)))
        plan.state = state
        return
    if state.active is not None:
        # A planned move with its epoch in hand: drain the active now. From here on
        # it is fenced like any other broker that may still be active.
        state = state.with_broker(state.active, next_fence_at=now)
        state = replace(state, active=None)
    target = state.broker(candidate)
    assert target is not None
    if target.earlier_address_possibly_active(now) or (
        not state.resumes_holder(candidate)
        and any(b.name != candidate and b.possibly_active(now) for b in state.brokers)
    ):
        plan.state = state  # _fence_and_probe sends the active=false calls
        return
    plan.state = replace(
        state, epoch_holder=candidate, move=replace(move, candidate=candidate, attempted=True)
    )
    plan.heartbeat(target, active=True, epoch=state.epoch, activation=True)
    plan.activating = True


def _walk_exhausted(state: EngineState, config: ClusterConfig, move: Move, now: float) -> EngineState:
    if state.active is not None:
        # A planned move found nobody to move to (its target died meanwhile): stay.
        return replace(state, move=None)
    interval = config.settings.interval_seconds
    if move.kind is MoveKind.STARTUP and not any(b.in_spec for b in state.brokers):
        # A new cluster whose pods have no addresses yet: still Pending, nothing to warn about.
        return replace(state, move=replace(move, tried=frozenset(), retry_at=now + interval))
    why = "; ".join(_answer_line(b) for b in state.brokers if b.in_spec)
    failed_rounds = move.failed_rounds + 1 if move.attempted else move.failed_rounds
    delay = retry_delay(config, failed_rounds)
    state = replace(
        state,
        # Every broker is a candidate again, including the one that failed first.
        move=replace(
            move,
            tried=frozenset(),
            rounds=move.rounds + 1,
            retry_at=now + delay,
            failed_rounds=failed_rounds,
            attempted=False,
        ),
    )
    if move.rounds == 1:
        state = state.with_event(
            "NoBrokerAvailable",
            f"no broker could be activated ({why or 'no brokers in the spec'}); retrying in {delay:g}s,"
            f" then backing off to one round every {retry_delay_cap(config):g}s while activations"
            " keep failing",
            True,
        )
    return state


def _answer_line(broker: BrokerKnowledge) -> str:
    shown, code, message = shown_answer(broker)
    return f"{broker.name}: {code or shown}" + (f" ({message})" if message else "")


def _renew_active(plan: _Plan, config: ClusterConfig) -> None:
    state, now = plan.state, plan.now
    if state.active is None or now < state.next_active_heartbeat_at:
        return
    broker = state.broker(state.active)
    if broker is None or broker.name in plan.contacted:
        return
    interval = config.settings.interval_seconds
    due = state.next_active_heartbeat_at + interval
    plan.state = replace(state, next_active_heartbeat_at=due if due > now else now + interval)
    # Once a renewal has failed, the active is only checked (renewLease=false) until it
    # answers again: every renewal that may arrive extends the fence by a whole lease,
    # so renewing a broker that stopped answering would only delay its failover. One
    # skipped renewal is harmless, as the lease outlasts failureThreshold intervals.
    plan.heartbeat(broker, active=True, epoch=state.active_epoch, renew=broker.failures == 0)


def _fence_and_probe(plan: _Plan, config: ClusterConfig) -> None:
    """active=false to every broker that may be active but should not be; standby probes when due."""
    settings, now = config.settings, plan.now
    state = plan.state
    if plan.activating:
        # The loop folds a step's outcomes in when its slowest call ends, so an
        # active=false to a frozen broker would hold the activation's answer (and
        # the Service's move) back by a whole timeout. The gate has just established
        # that nobody else may be active: these calls can wait for the next step,
        # which runs as soon as the activation is answered.
        return
    pending_switchover = (
        config.preferred_active
        if config.preferred_active != state.honoured_preferred and state.move is None
        else None
    )
    brokers: list[BrokerKnowledge] = []
    for known in state.brokers:
        broker = known
        skip = known.name in (state.active, plan.candidate) or known.name in plan.contacted or known.dead
        if not skip and known.needs_fencing(now) and now >= known.next_fence_at:
            broker = replace(known, next_fence_at=now + settings.interval_seconds)
            plan.heartbeat(broker, active=False, epoch=state.epoch)
        elif not skip and known.in_spec and now >= known.next_probe_at:
            if known.name == pending_switchover:
                broker = replace(known, next_probe_at=now + settings.interval_seconds)
                plan.heartbeat(broker, active=False, epoch=state.epoch)
            elif settings.standby_probe_seconds > 0:
                due = config.next_on_phase(now, settings.standby_probe_seconds, known.name)
                broker = replace(known, next_probe_at=due)
                plan.heartbeat(broker, active=False, epoch=state.epoch)
        brokers.append(broker)
    # Brokers gone from the spec are forgotten once they are known not active; never the active
    # (out of the spec while a pause holds its failover).
    kept = (b for b in brokers if b.in_spec or b.name == state.active or b.needs_fencing(now))
    plan.state = replace(state, brokers=tuple(kept))


def _point_service(plan: _Plan, config: ClusterConfig) -> None:
    """Point the ``-active`` Service at the active, or at nobody while a move is under way.

    Its endpoints are the engine's to write (the Service has no selector), so traffic follows
    the activation in one write rather than after the EndpointSlice controller; blanked while
    no broker is active, so no new connection reaches a broker whose term is over (a dead or
    cut-off one would swallow it; without endpoints kube-proxy refuses it at once).

    Not blanked in the first round after a (re)start: the Service most likely points at the
    broker about to be confirmed, and blanking it would cut traffic at every operator restart.
    Nor while a planned move tries its target first: the drained broker is alive and refuses
    every bundle (``BROKER_INACTIVE``) for the few tens of milliseconds until the target
    answers, and a blank just before the write that matters made kube-proxy, which syncs at
    most once per ``minSyncPeriod``, hold that write back (a drain's traffic gap, issue 22).
    Once the target failed (the move walks on), the Service is blanked as in a failover.
    """
    state, now = plan.state, plan.now
    move = state.move
    if state.active is not None:
        target: str | None = state.active
    elif move is not None and not (
        (move.kind is MoveKind.STARTUP and move.rounds == 1)
        or (move.kind.planned and move.rounds == 1 and not move.tried)
    ):
        target = None
    else:
        return
    if (state.pointed_known and state.pointed == target) or now < state.point_retry_at:
        return
    plan.state = replace(state, point_retry_at=now + config.settings.interval_seconds)
    if target is None:
        plan.actions.insert(0, PointActive(None, state.epoch))
        return
    broker = state.broker(target)
    assert broker is not None, target
    # First in the step: the loop starts actions in order, and traffic waits on this one.
    plan.actions.insert(0, PointActive(target, state.active_epoch, broker.url))


def _wake_at(state: EngineState, config: ClusterConfig, now: float) -> float:
    settings = config.settings
    times = [now + settings.interval_seconds]  # re-evaluate at least once an interval
    if state.active is not None:
        times.append(state.next_active_heartbeat_at)
    if state.move is not None and state.move.retry_at > now:
        times.append(state.move.retry_at)
    if state.epoch_retry_at > now:
        times.append(state.epoch_retry_at)
    for broker in state.brokers:
        for bound in (broker.possibly_active_until, broker.earlier_address_active_until):
            if bound is not None and bound > now:
                times.append(bound)
        if broker.needs_fencing(now):
            times.append(broker.next_fence_at)
        elif settings.standby_probe_seconds > 0:
            times.append(broker.next_probe_at)
        if broker.ready_since is not None and settings.failback is FailbackMode.AUTOMATIC:
            times.append(broker.ready_since + settings.failback_stable_seconds)
    future = [t for t in times if t > now]
    return min(future) if future else now + settings.interval_seconds
