"""Folding one observation (a heartbeat answer or failure, an epoch grant) into the knowledge.

This is the "learn" half of a step; :mod:`.decisions` is the "act" half. The rules
follow ARCHITECTURE.md, "The heartbeat contract":

- an ``active=true`` call that may have reached a broker makes it possibly active
  for one fence period from the moment we saw the outcome, except a check
  (``renewLease=false``), which cannot renew a lease;
- only a non-``Active`` answer to ``active=false`` (or a confirmed dead container)
  proves a broker not active;
- a renewal of the active that is not answered ``Active`` counts one failure, unless the
  failure was the operator's (its event loop ran late) or TLS's (a certificate that did not
  verify, or the operator's refused): neither says anything about the broker, and a TLS failure
  would follow a failover to the next broker, which shares the PKI;
- a candidate that answers ``Active`` completes the move under way; one that does not
  is tried no more in this round, except for two refusals a new epoch cures at once:
  ``STALE_EPOCH`` with the broker's higher stored epoch (the next allocation jumps
  above it) and ``LEASE_EXPIRED`` at the epoch it fenced itself at.

Pure code: no I/O, no clock reads.
"""

from __future__ import annotations

from broker_contracts.soap import BrokerState
from broker_operator.core.actions import (
    ActivePointed,
    ConnectionLost,
    EpochGranted,
    EpochRefused,
    HeartbeatAnswered,
    HeartbeatFailed,
    Observation,
    ProcessGone,
)
from broker_operator.core.frozen import replace
from broker_operator.core.knowledge import (
    LEASE_EXPIRED,
    STALE,
    ClusterConfig,
    EngineState,
    LastMove,
    MoveKind,
    failure_code,
    later_bound,
)

_EVENT_OF_KIND = {
    MoveKind.FAILOVER: ("Failover", True),
    MoveKind.SWITCHOVER: ("Switchover", False),
    MoveKind.FAILBACK: ("Failback", False),
    MoveKind.STARTUP: ("Activated", False),
}


def observe(  # noqa: PLR0911 - one return per kind of observation
    state: EngineState, config: ClusterConfig, observation: Observation, now: float
) -> EngineState:
    match observation:
        case HeartbeatAnswered():
            return _answered(state, config, observation, now)
        case HeartbeatFailed():
            return _failed(state, config, observation, now)
        case EpochGranted(epoch=epoch):
            # A grant below what we know changes nothing (max); above, nobody holds it yet.
            if epoch <= state.epoch:
                return state
            return replace(state, epoch=epoch, epoch_holder=None, epoch_ended=False)
        case EpochRefused(current=current, reason=reason):
            state = replace(state, epoch_retry_at=now + config.settings.interval_seconds)
            if current is not None and current > state.epoch:
                # Someone else was granted `current` and may be sending it to a broker: it is
                # theirs, never ours to send. The next allocation goes above it.
                state = replace(state, epoch=current, epoch_holder=None, epoch_ended=True)
            return state.with_event(
                "EpochConflict",
                f"allocating epoch {state.epoch + 1} failed: {reason}; retrying in"
                f" {config.settings.interval_seconds:g}s",
                True,
            )
        case ActivePointed(active=active):
            # Written: the next change of target is written at once (the retry delay is for failures).
            return replace(state, pointed=active, pointed_known=True, point_retry_at=0.0)
        case ConnectionLost():
            return _connection_lost(state, observation, now)
        case ProcessGone():
            return _process_gone(state, observation)


def _connection_lost(state: EngineState, lost: ConnectionLost, now: float) -> EngineState:
    """A failed heartbeat of the broker, and a check (or probe, or fence) of it at once."""
    broker = state.broker(lost.broker)
    if broker is None or broker.url != lost.url:
        return state  # about an address the broker has left: its own watch covers the new one
    if lost.broker == state.active:
        state = replace(state, next_active_heartbeat_at=now)
        return state.with_broker(
            broker.name, failures=broker.failures + 1, code="CONNECTION_LOST", message=lost.reason
        )
    return state.with_broker(broker.name, next_probe_at=now, next_fence_at=now)


def _process_gone(state: EngineState, gone: ProcessGone) -> EngineState:
    """Known not active, unless a live process may have been reached at that address since."""
    broker = state.broker(gone.broker)
    if broker is None or broker.url != gone.url:
        return state
    if broker.last_contact_at is not None and broker.last_contact_at >= gone.at:
        # An answer, or a call that may have reached a live process, since the refusal: a new
        # process may listen there now, and a stale active=true may have activated it.
        return state
    return state.with_broker(
        broker.name,
        possibly_active_until=None,
        unanswered_activation=False,
        gone_at=gone.at,
        state=BrokerState.UNAVAILABLE.value,
        code="PROCESS_GONE",
        message=gone.reason,
        ready_since=None,
    )


def _answered(state: EngineState, config: ClusterConfig, seen: HeartbeatAnswered, now: float) -> EngineState:
    broker = state.broker(seen.broker)
    if broker is None:
        return state
    reply = seen.reply
    if reply.epoch > max(state.epoch, broker.reported_epoch):
        state = state.with_event(
            "StaleEpoch",
            f"broker {broker.name} reports epoch {reply.epoch}, above the cluster's epoch {state.epoch};"
            " the recorded epoch is behind (lost status, a re-created cluster or a second operator?);"
            " allocating an epoch above it",
            True,
        )
    is_active = reply.state == BrokerState.ACTIVE.value
    changes: dict[str, object] = {
        "state": BrokerState(reply.state).value,
        "code": None if is_active else reply.unavailability_code,
        "message": None if is_active else reply.unavailability_message,
        "reported_epoch": max(broker.reported_epoch, reply.epoch),
        "last_reply_at": now,
        "last_contact_at": now,
        "gone_at": None,
        "tls_problem": None,
    }
    fence_until = now + config.settings.fence_seconds
    move = state.move
    if not seen.active:
        if not is_active:
            changes.update(possibly_active_until=None, unanswered_activation=False)
        ready = reply.state == BrokerState.INACTIVE.value
        changes["ready_since"] = (broker.ready_since or now) if ready else None
        return state.with_broker(broker.name, **changes)

    if seen.renew:
        changes.update(
            possibly_active_until=later_bound(broker.possibly_active_until, fence_until),
            ready_since=None,
            unanswered_activation=False,
        )
    else:
        changes.update(ready_since=None)
    if seen.broker == state.active:
        changes["failures"] = 0 if is_active else broker.failures + 1
        return state.with_broker(broker.name, **changes)
    state = state.with_broker(broker.name, **changes)
    if move is None or move.candidate != seen.broker:
        return state
    if is_active:
        return complete_move(state, config, seen.broker, seen.epoch, now)
    return _candidate_refused(state, seen, now)


def _candidate_refused(state: EngineState, seen: HeartbeatAnswered, now: float) -> EngineState:
    move = state.move
    assert move is not None
    reply = seen.reply
    state = state.with_broker(
        seen.broker,
        activation_code=reply.unavailability_code or reply.state,
        activation_message=reply.unavailability_message,
    )
    # The epoch a broker fenced itself at (LEASE_EXPIRED ends it) is retried at once with
    # a new one, and so is a stale epoch the broker itself refused: it reported the epoch
    # it stored, and the next allocation jumps above that (decisions.next_epoch).
    if reply.unavailability_code == LEASE_EXPIRED and seen.epoch == state.epoch:
        return replace(state, move=replace(move, candidate=None), epoch_ended=True)
    if reply.unavailability_code == STALE and reply.epoch > seen.epoch:
        return replace(state, move=replace(move, candidate=None))
    if reply.unavailability_code == STALE:
        # The broker stored our epoch and its backend or cloud refused it: they have seen a
        # higher one, which the reply does not carry. Retrying at once re-sent the same epoch
        # in a tight loop; climbing one epoch per try would race whoever holds the higher
        # one. So it is a failed activation like any other (the round backs off), and the
        # next try gets a new epoch.
        state = replace(state, epoch_ended=True)
    state = state.with_broker(seen.broker, activation_failed_at=now)
    return replace(state, move=replace(move, candidate=None, tried=move.tried | {seen.broker}))


def _failed(state: EngineState, config: ClusterConfig, seen: HeartbeatFailed, now: float) -> EngineState:
    broker = state.broker(seen.broker)
    if broker is None:
        return state
    move = state.move
    # A timeout while the operator's own loop ran late says nothing about the broker: counted
    # against the active, a takeover's burst failed healthy actives over; against a move's
    # candidate, a successor walked past the recorded active it was renewing and activated the
    # standby under a new epoch (issue 40). The candidate is asked again instead. What the call
    # may have done at the broker (renewed its lease) still counts below, for the fence.
    # A TLS failure of the active or the candidate is not counted either (ARCHITECTURE.md: a
    # certificate error is never a proof of death): both brokers share the PKI, so failing over
    # would only move the failure and then flap. It stays visible as the broker's tls_problem.
    candidate = move is not None and move.candidate == seen.broker
    not_counted = (seen.operator_late or seen.tls_error) and (seen.broker == state.active or candidate)
    code = failure_code(seen.reason, seen.reached, tls_error=seen.tls_error)
    changes: dict[str, object] = (
        {}
        if not_counted
        else {
            "state": BrokerState.UNAVAILABLE.value,
            "code": code,
            "message": seen.reason,
            "ready_since": None,
        }
    )
    if seen.tls_error:
        changes["tls_problem"] = seen.reason
    if (seen.reached and not seen.peer_closed) or seen.tls_error:
        changes["last_contact_at"] = now  # a TLS failure: a live TLS listener took part in it
    if seen.active and seen.reached and seen.renew:
        changes.update(
            possibly_active_until=later_bound(
                broker.possibly_active_until, now + config.settings.fence_seconds
            ),
            unanswered_activation=True,
        )
    resumed = candidate and state.resumes_holder(seen.broker)
    if seen.active and (seen.broker == state.active or resumed) and not not_counted:
        changes["failures"] = broker.failures + 1
    state = state.with_broker(broker.name, **changes)
    if move is None or not (seen.active and candidate):
        return state
    if seen.tls_error and not_counted:
        # Asked again, after an interval: a TLS failure comes back within a round trip, and
        # asking at once would loop. Not passed over for the next broker either, which a
        # failback would undo when the certificates are fixed (a flap).
        retry_at = now + config.settings.interval_seconds
        return replace(state, move=replace(move, candidate=None, retry_at=retry_at))
    if not_counted or (resumed and broker.failures + 1 < config.settings.failure_threshold):
        # Asked again, as the active it was: one failure is not a failover (knowledge.resumes_holder).
        return replace(state, move=replace(move, candidate=None))
    state = state.with_broker(
        seen.broker,
        activation_failed_at=now,
        activation_code=code,
        activation_message=seen.reason,
    )
    return replace(state, move=replace(move, candidate=None, tried=move.tried | {seen.broker}))


def complete_move(
    state: EngineState, config: ClusterConfig, winner: str, epoch: int, now: float
) -> EngineState:
    """A candidate answered ``Active``: it is the active now; record why and how long it took."""
    move = state.move
    assert move is not None  # only called for the move's candidate
    settings = config.settings
    state = replace(
        state,
        active=winner,
        active_epoch=epoch,
        next_active_heartbeat_at=config.next_on_phase(now, settings.interval_seconds),
        move=None,
        # A broker is active again: status goes back to showing each broker's latest answer.
        brokers=tuple(replace(b, activation_code=None, activation_message=None) for b in state.brokers),
    )
    state = state.with_broker(winner, failures=0)
    if settings.standby_probe_seconds > 0:
        # Learn at once whether the others are ready standbys, for Healthy/Degraded.
        state = replace(
            state,
            brokers=tuple(b if b.name == winner else replace(b, next_probe_at=now) for b in state.brokers),
        )
    if move.kind is MoveKind.STARTUP and move.from_ == winner:
        return state  # the operator restarted and the same broker carries on: nothing to report
    reason, warning = _EVENT_OF_KIND[move.kind]
    duration_ms = round((now - move.started_at) * 1000)
    if move.kind is MoveKind.STARTUP and move.from_ is None:
        return state.with_event(reason, f"broker {winner} is active with epoch {epoch}", warning)
    cause = f"{move.from_} {move.reason}" if move.kind is MoveKind.FAILOVER else move.reason
    state = replace(
        state,
        failovers=state.failovers + 1,
        last_move=LastMove(
            completed_wall=now + state.wall_offset,
            from_=move.from_,
            to=winner,
            reason=move.reason,
            duration_ms=duration_ms,
        ),
    )
    return state.with_event(
        reason,
        f"broker {winner} is active with epoch {epoch}, replacing {move.from_ or 'no active'}"
        f" ({cause}); took {duration_ms} ms",
        warning,
    )
