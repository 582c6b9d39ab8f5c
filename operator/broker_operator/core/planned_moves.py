"""When the engine moves the active on purpose, with the active still serving: a drain of its node,
``spec.preferredActive``, Automatic failback. Each starts a planned ``Move`` (switchover or failback)
that ``decisions._progress_move`` carries out like any other, through the same gate: epoch first,
then the old active drained, then the new one activated, so there is never a window with two.

Pure, like the rest of the core: state and config in, state out (with the move, or an event).
"""

from __future__ import annotations

from broker_operator.core.frozen import replace
from broker_operator.core.knowledge import (
    BrokerKnowledge,
    ClusterConfig,
    EngineState,
    Move,
    MoveKind,
    preference_order,
)
from broker_operator.core.model import FailbackMode


def failback_holdoff(config: ClusterConfig) -> float:
    """How long Automatic failback leaves a broker alone after it failed an activation."""
    settings = config.settings
    return max(settings.failback_stable_seconds, 10 * settings.interval_seconds)


def failback_target(state: EngineState, config: ClusterConfig, now: float) -> str | None:
    """Under ``Automatic``: the broker to return to, once it has been ready for failbackStableSeconds."""
    settings = config.settings
    if settings.failback is not FailbackMode.AUTOMATIC or state.active is None:
        return None
    active = state.broker(state.active)
    if active is None:
        return None

    holdoff = failback_holdoff(config)

    def stable(broker: BrokerKnowledge | None) -> bool:
        return (
            broker is not None
            and broker.in_spec
            and broker.ready
            and not broker.draining
            and broker.ready_since is not None
            and now - broker.ready_since >= settings.failback_stable_seconds
            and (broker.activation_failed_at is None or now - broker.activation_failed_at >= holdoff)
        )

    preferred = config.preferred_active
    if preferred is not None and config.target(preferred) is not None:
        if preferred == state.active:
            return None
        if stable(state.broker(preferred)):
            return preferred
    for broker in state.brokers:
        if broker.in_spec and broker.priority < active.priority and stable(broker):
            return broker.name
    return None


def _drain_target(state: EngineState, config: ClusterConfig) -> str | None:
    """The broker to move the active to off a draining node: a ready standby elsewhere, in the
    order a move tries them (preferredActive first, then by priority)."""
    for name in preference_order(config, None):
        broker = state.broker(name)
        if (
            broker is not None
            and name != state.active
            and broker.in_spec
            and broker.ready
            and not broker.draining
        ):
            return name
    return None


def _consider_drain(state: EngineState, config: ClusterConfig, now: float) -> EngineState | None:
    """A switchover off the active's draining node (the state with that move), the state with a
    DrainBlocked event if no broker can take over, or None when the active's node is not draining."""
    active = state.broker(state.active or "")
    if active is None or not active.draining:
        return None
    goal = _drain_target(state, config)
    if goal is None:
        if state.drain_blocked_reported:
            return state
        return replace(state, drain_blocked_reported=True).with_event(
            "DrainBlocked",
            f"{active.name} is active on a node being drained and no ready standby on another node can"
            " take over; its eviction waits until one is ready (spec.drainWithoutStandby: Wait), or"
            " is let through with nobody active until it restarts (Evict)",
            True,
        )
    move = Move(
        MoveKind.SWITCHOVER,
        from_=active.name,
        reason="NodeDrain",
        started_at=now,
        order=preference_order(config, goal),
        first=goal,
    )
    return replace(state, move=move, drain_blocked_reported=False)


def consider_planned_move(state: EngineState, config: ClusterConfig, now: float) -> EngineState:
    if state.move is not None or state.active is None:
        return state
    drained = _consider_drain(state, config, now)
    if drained is not None:
        return drained
    return _consider_preferred_or_failback(replace(state, drain_blocked_reported=False), config, now)


def _consider_preferred_or_failback(state: EngineState, config: ClusterConfig, now: float) -> EngineState:
    preferred = config.preferred_active
    if preferred != state.honoured_preferred:
        if preferred is None or preferred == state.active:
            return replace(state, honoured_preferred=preferred)
        if config.target(preferred) is None:
            state = replace(state, honoured_preferred=preferred)
            names = ", ".join(t.name for t in config.targets)
            return state.with_event(
                "SwitchoverRefused",
                f"spec.preferredActive ({preferred}) is not one of this cluster's brokers ({names});"
                " set it to one of them",
                True,
            )
        target = state.broker(preferred)
        if target is None or not target.ready or target.draining:
            return state  # wait: it is probed every interval until it is a ready standby
        kind, reason, goal = MoveKind.SWITCHOVER, "PreferredActive", preferred
        state = replace(state, honoured_preferred=preferred)
    else:
        found = failback_target(state, config, now)
        if found is None:
            return state
        kind, reason, goal = MoveKind.FAILBACK, "HigherPriorityReady", found
    move = Move(
        kind,
        from_=state.active,
        reason=reason,
        started_at=now,
        order=preference_order(config, goal),
        first=goal,
    )
    return replace(state, move=move)
