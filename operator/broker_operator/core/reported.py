"""The status the engine reports: the phase, each broker as shown, the last change of active.

``status_of`` renders what the engine knows (``EngineState``) as the ``ClusterStatus`` the shell
records; ``phase_of`` and ``shown_answer`` are its parts, which the rules in ``decisions.py`` also
use (an exhausted walk's event names each broker's answer as status shows it). Apart from the rules
so that each reads in one sitting; no rule lives here.

Pure code: no I/O, no clock reads.
"""

from __future__ import annotations

from broker_contracts.soap import UNAVAILABILITY_CODE_MAX_LEN, BrokerState
from broker_operator.core.knowledge import BrokerKnowledge, ClusterConfig, EngineState, MoveKind
from broker_operator.core.pause import phase_while_paused
from broker_operator.core.status import BrokerStatus, ClusterStatus, LastFailover, Phase, format_time


def phase_of(state: EngineState, config: ClusterConfig) -> Phase:
    phase = _running_phase(state)
    return phase_while_paused(state, phase) if config.paused else phase


def _running_phase(state: EngineState) -> Phase:
    move = state.move
    if move is not None and state.active is None:
        if move.rounds > 1:
            return Phase.UNAVAILABLE
        return Phase.PENDING if move.kind is MoveKind.STARTUP else Phase.FAILING_OVER
    if state.active is None:
        return Phase.UNAVAILABLE
    standbys = [b for b in state.brokers if b.in_spec and b.name != state.active]
    return Phase.HEALTHY if all(b.ready for b in standbys) else Phase.DEGRADED


def shown_answer(broker: BrokerKnowledge) -> tuple[str, str | None, str | None]:
    """(state, code, message) as status shows a broker: its failed activation's answer, if any.

    A refused activation is followed by a fence (``active=false``, answered ``Inactive``)
    and standby probes, and while no broker is active those later answers would hide why:
    the broker stays shown ``Unavailable`` with the code it gave its activation until a
    broker is active again (``observe.complete_move`` clears it) or its process changes.
    A dead container is shown as such whatever it answered before.
    """
    if broker.activation_code is not None and not broker.dead:
        return BrokerState.UNAVAILABLE.value, broker.activation_code, broker.activation_message
    return broker.state, broker.code, broker.message


def status_of(state: EngineState, config: ClusterConfig) -> ClusterStatus:
    """The status fields the engine owns, as they should read now."""
    last = state.last_move
    return ClusterStatus(
        phase=phase_of(state, config).value,
        active=state.active,
        epoch=state.epoch,
        active_epoch=state.active_epoch if state.active is not None else None,
        brokers=tuple(
            BrokerStatus(
                name=b.name,
                priority=b.priority,
                state=shown,
                unavailability_code=code[:UNAVAILABILITY_CODE_MAX_LEN] if code else None,
                unavailability_message=message,
                last_heartbeat_time=format_time(b.last_reply_at + state.wall_offset)
                if b.last_reply_at is not None
                else None,
            )
            for b in state.brokers
            if b.in_spec
            for shown, code, message in (shown_answer(b),)
        ),
        last_failover=LastFailover(
            time=format_time(last.completed_wall),
            from_=last.from_,
            to=last.to,
            reason=last.reason,
            duration_ms=last.duration_ms,
        )
        if last is not None
        else None,
        failovers=state.failovers,
    )
