"""A paused cluster (issue 42): what the decision core still does, and what it holds back.

A person pauses one BrokerCluster's reconciliation for maintenance with the annotation
``broker.failover.dev/pause-reconciliation: "true"`` (Strimzi's ``strimzi.io/pause-reconciliation``);
removing it, or setting it to ``"false"``, resumes. The controller and the local runner read it
(:func:`pause_requested`) and hand it to the core as ``ClusterConfig.paused``.

The rule, in one sentence: while paused, no term begins and no term ends by the operator's hand.

What goes on, because stopping it would make the pause itself an outage:

- the active is renewed at its epoch every interval (checked instead, after a failure, as always),
  so its lease never runs out because of the pause and traffic keeps flowing;
- standbys are probed and any broker that may be active but is not the active is fenced
  (``active=false``): that changes nothing at a healthy standby and is what keeps invariant 1 if
  one is not; status goes on reporting what they answer;
- after an operator restart, the recorded active is renewed at its recorded epoch
  (``EngineState.resumes_holder``): the term the status names goes on, it is not a new one;
- the ``-active`` Service is written again when it must be, at the same active.

What is held until the pause ends:

- failovers: an active that fails (its container dead, its pod gone, ``failureThreshold`` failed
  heartbeats, out of the spec) stays the active. A Warning event ``FailoverPaused`` says so once
  per failure, ``ActiveRecovered`` if it answers ``Active`` again, and the phase is
  ``Unavailable``: pausing trades availability for control;
- planned moves (``preferredActive``, Automatic failback, a node drain's switchover): none is
  started, and one already under way waits before its epoch and before it drains the active;
- every epoch allocation, and every activation but the resumed holder's.

On resume the next step evaluates everything as if nothing had been held: a failover held is
started then (``ActiveUnavailable``, then ``Failover``), a pending switchover or failback goes on.

Why a module of its own: ``decisions.py`` holds the rules of a running cluster; these are the
exceptions to them, read together in one place (``tests/unit/core/test_pause.py``, and the
property tests' pause rule, which checks that no term begins while paused).

Pure, like the rest of the core. What the controller holds while paused (children, rollouts,
certificates) is ``controller/pause.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from broker_contracts.soap import BrokerState
from broker_operator.core.frozen import replace
from broker_operator.core.knowledge import ClusterConfig, EngineState, Move, MoveKind
from broker_operator.core.status import Phase

PAUSE_ANNOTATION: Final = "broker.failover.dev/pause-reconciliation"
_PAUSED, _RESUMED = "true", "false"


def pause_requested(annotations: Mapping[str, object] | None) -> bool:
    """Whether a BrokerCluster's annotations ask for a pause: ``"true"``, any case, nothing else.

    Only that one value pauses, as Strimzi's annotation: a typo must not silently stop failovers
    (:func:`pause_annotation_problem` says what was wrong instead)."""
    return _value(annotations) == _PAUSED


def pause_annotation_problem(annotations: Mapping[str, object] | None) -> str | None:
    """What is wrong with the pause annotation's value, if it is neither ``"true"`` nor ``"false"``."""
    value = _value(annotations)
    if value in (None, _PAUSED, _RESUMED):
        return None
    raw = (annotations or {}).get(PAUSE_ANNOTATION)
    return (
        f'annotation {PAUSE_ANNOTATION}={raw!r} is neither "true" nor "false": reconciliation is not'
        f' paused; set it to "true" to pause, remove it (or "false") to resume'
    )


def _value(annotations: Mapping[str, object] | None) -> str | None:
    raw = (annotations or {}).get(PAUSE_ANNOTATION)
    return None if raw is None else str(raw).strip().lower()


def may_activate(state: EngineState, config: ClusterConfig, candidate: str) -> bool:
    """Whether a move may allocate an epoch for, drain the active for, or activate ``candidate``.

    While paused only the resumed holder may be sent ``active=true`` (at the epoch it holds,
    never a new one): an operator restarted during a pause must renew the active it finds, or
    the pause would end its term."""
    return not config.paused or state.resumes_holder(candidate)


def hold_failover(state: EngineState, cause: tuple[str, str] | None) -> EngineState:
    """Instead of a failover while paused: the active stays, and a person is told, once.

    ``cause`` is ``decisions.failover_cause``: (reason, what happened) when a running engine would
    fail the active over now, None otherwise. A held active is only *checked* from then on
    (``renewLease=false``; ``decisions._renew_active`` renews only while ``failures`` is 0): a
    container the kubelet restarts between two heartbeats comes back Inactive with the epoch, and
    a renewal there would start its term again, a new term the pause forbids; a check starts
    nothing. It is renewed again once it answers ``Active`` (a partition that healed within the
    lease).
    """
    active = state.active
    broker = state.broker(active) if active is not None else None
    if broker is None:
        return state  # no active to hold: a move waits instead (hold_move)
    if cause is not None:
        reason, detail = cause
        if broker.failures == 0:
            state = state.with_broker(broker.name, failures=1)
        if state.held_failover is not None:
            return replace(state, held_failover=reason) if state.held_failover != reason else state
        return _held(
            state,
            reason,
            f"active broker {active} {detail}; NOT failing over: reconciliation is paused",
        )
    if state.held_failover is not None and broker.failures == 0 and broker.state == BrokerState.ACTIVE.value:
        state = replace(state, held_failover=None)
        return state.with_event(
            "ActiveRecovered",
            f"active broker {active} answers Active again at epoch {state.active_epoch}; the failover"
            " held while paused is no longer needed",
            False,
        )
    return state


def hold_move(state: EngineState, move: Move) -> EngineState:
    """A move whose next step the pause forbids (``may_activate``) waits where it is; said once
    when it leaves no broker active. A planned move that has not drained the active yet leaves it
    active, renewed as before: nothing to say. A new cluster's first activation waits too, shown
    ``Pending``: there was no active to lose."""
    if state.held_failover is not None or state.active is not None:
        return state
    if move.kind is MoveKind.STARTUP:
        if move.from_ is None:
            return state
        what = f"{move.from_}, the active this operator found recorded, did not take its renewal"
    elif move.kind is MoveKind.FAILOVER:
        what = f"the failover from {move.from_} ({move.reason}) had not activated another broker yet"
    else:
        what = f"the {move.kind.value.lower()} had drained {move.from_} and not activated another broker yet"
    return _held(
        state, move.reason, f"no broker is active: {what}; none is activated while reconciliation is paused"
    )


def _held(state: EngineState, reason: str, what: str) -> EngineState:
    state = replace(state, held_failover=reason)
    return state.with_event(
        "FailoverPaused",
        f"{what} (annotation {PAUSE_ANNOTATION}). The cluster may serve no traffic until the"
        " annotation is removed, which fails it over at once",
        True,
    )


def phase_while_paused(state: EngineState, phase: Phase) -> Phase:
    """The phase a paused cluster shows: ``Unavailable`` while a failover is held, or a move that
    lost its active waits (nothing is failing over while paused); otherwise what it would be."""
    if state.held_failover is not None or phase is Phase.FAILING_OVER:
        return Phase.UNAVAILABLE
    return phase
