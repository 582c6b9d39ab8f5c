"""The broker's term state machine, rule by rule, without a process: inputs in; state, replies, effects out.

The broker (``lifecycle.Broker``) and the property tests' simulated brokers both run this
machine; the integration tests in ``tests/integration/broker/`` pin the same rules on a real
process (SIGSTOP for stalls, real leases). Times here are a monotonic clock we pass in.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from broker_contracts.message_log import Event
from broker_contracts.soap import BrokerState, HeartbeatReply, UnavailabilityCode
from broker_service.settings import BrokerSettings
from broker_service.term import (
    Activate,
    Answer,
    LogLifecycle,
    SelfFenced,
    StallSeen,
    StartRelaying,
    StopAccepting,
    StopRelaying,
    StoreEpoch,
    TermMachine,
    lease_margin_seconds,
    lease_tick_seconds,
    reply_of,
)

LEASE = 5.0  # tick 0.1 s, margin 0.5 s: a stall is a gap above 0.6 s between two ticks
T0 = 100.0


def machine(epoch: int = 0) -> TermMachine:
    return TermMachine.for_lease(LEASE, epoch=epoch, now=T0)


def renew(
    term: TermMachine, epoch: int, now: float, *, journal: str | None = None, stalled: bool = False
) -> Answer:
    """A renewing heartbeat driven as the broker drives it, with every I/O succeeding.

    Unless ``stalled``, the lease watcher has ticked on time up to ``now`` (no stall).
    """
    if not stalled:
        term.watch_from(now)
    arrival = term.renewal_arrives(now)
    if arrival.reply is not None:
        return arrival
    term.drain_due()
    answer = term.renew(epoch, now, journal)
    effects: tuple[object, ...] = ()
    if isinstance(answer.awaiting, StoreEpoch):
        effects = term.epoch_stored(answer.awaiting.epoch)
        answer = term.proceed(now)
    if isinstance(answer.awaiting, Activate):
        answer = term.activated(now)
    return Answer(answer.reply, (*arrival.effects, *effects, *answer.effects))  # type: ignore[arg-type]


def message(reply: HeartbeatReply | None) -> str:
    assert reply is not None
    return reply.unavailability_message or ""


def code(reply: HeartbeatReply | None) -> tuple[str, str | None]:
    assert reply is not None
    return reply.state.value, reply.unavailability_code


def active_at(epoch: int, now: float = T0) -> TermMachine:
    term = machine()
    assert code(renew(term, epoch, now).reply) == ("Active", None)
    return term


def test_derived_tick_and_margin_are_the_broker_settings_own() -> None:
    for lease in (0.5, 1.0, 2.5, 5.0, 30.0):
        settings = SimpleNamespace(lease_seconds=lease)
        assert lease_tick_seconds(lease) == BrokerSettings.lease_tick_seconds.fget(settings)  # type: ignore[attr-defined]
        assert lease_margin_seconds(lease) == BrokerSettings.lease_margin_seconds.fget(settings)  # type: ignore[attr-defined]


def test_activation_stores_the_epoch_first_then_activates_and_starts_the_lease() -> None:
    term = machine()
    assert term.state is BrokerState.INACTIVE and term.epoch == 0
    assert term.renewal_arrives(T0) == Answer()
    answer = term.renew(3, T0, None)
    assert answer == Answer(awaiting=StoreEpoch(3))
    assert term.epoch == 0  # not before the caller stored it
    assert term.epoch_stored(3) == ()  # inactive: no term ends
    assert term.proceed(T0) == Answer(awaiting=Activate(3))
    done = term.activated(T0)
    assert done.reply == reply_of(BrokerState.ACTIVE, 3)
    assert done.effects == (LogLifecycle(Event.ACTIVATED, 3), StartRelaying(3))
    assert term.state is BrokerState.ACTIVE and term.lease_deadline == T0 + LEASE


def test_a_failed_activation_keeps_the_stored_epoch_and_stays_inactive() -> None:
    term = machine()
    assert term.renew(2, T0, None).awaiting == StoreEpoch(2)
    term.epoch_stored(2)
    assert term.proceed(T0).awaiting == Activate(2)
    failed = term.activation_failed(UnavailabilityCode.BACKEND_UNREACHABLE, "connection refused")
    assert failed.reply == reply_of(BrokerState.UNAVAILABLE, 2, "BACKEND_UNREACHABLE", "connection refused")
    assert failed.effects == () and not term.active and term.epoch == 2


def test_an_epoch_that_cannot_be_stored_changes_nothing() -> None:
    term = machine(epoch=1)
    assert term.renew(2, T0, None).awaiting == StoreEpoch(2)
    reply = term.epoch_not_stored("cannot store epoch 2 at /data/epoch: read-only file system")
    assert code(reply) == ("Unavailable", "JOURNAL_ERROR") and reply.epoch == 1
    assert term.epoch == 1 and not term.active


def test_stale_epoch_is_refused_and_changes_nothing() -> None:
    term = active_at(5)
    deadline = term.lease_deadline
    answer = renew(term, 4, T0 + 1)
    assert code(answer.reply) == ("Unavailable", "STALE_EPOCH") and answer.effects == ()
    assert "below this broker's stored epoch 5" in message(answer.reply)
    assert term.lease_deadline == deadline and term.active  # not even the lease was renewed
    assert code(term.check(4, T0 + 1, None).reply) == ("Unavailable", "STALE_EPOCH")
    assert term.active  # a stale check changes nothing either


def test_renewal_extends_the_lease_from_when_its_handler_started_never_back() -> None:
    term = active_at(1)
    answer = renew(term, 1, T0 + 2)
    assert answer == Answer(reply_of(BrokerState.ACTIVE, 1))  # no store, no activation, no effects
    assert term.lease_deadline == T0 + 2 + LEASE
    # A renewal that started earlier but got the lock later does not shorten it.
    term.drain_due()
    assert term.renew(1, T0 + 1, None).reply == reply_of(BrokerState.ACTIVE, 1)
    assert term.lease_deadline == T0 + 2 + LEASE


def test_reactivation_with_a_higher_epoch_logs_the_old_term_ending_and_the_new_one_starting() -> None:
    term = active_at(3)
    answer = term.renew(4, T0 + 1, None)
    assert answer.awaiting == StoreEpoch(4)
    assert term.epoch_stored(4) == (LogLifecycle(Event.DEACTIVATED, 3), LogLifecycle(Event.ACTIVATED, 4))
    assert term.proceed(T0 + 1) == Answer(reply_of(BrokerState.ACTIVE, 4))  # no second activation
    assert term.active and term.lease_deadline == T0 + 1 + LEASE


def test_lease_expiry_fences_at_the_first_tick_after_the_deadline_then_drains_once() -> None:
    term = active_at(2)
    term.watch_from(T0 + LEASE - 0.05)
    assert term.tick(T0 + LEASE) == ()  # at the deadline itself the lease still holds
    effects = term.tick(T0 + LEASE + 0.05)
    reason = "lease expired: no active=true heartbeat for 5s"
    assert effects == (SelfFenced(2, reason), StopAccepting(reason))
    assert not term.active and term.fenced_epoch == 2 and term.draining == reason
    assert term.drain_due() == (
        StopRelaying(2, reason),
        LogLifecycle(Event.DEACTIVATED, 2, close_segment=True),
    )
    assert term.drain_due() == ()


def test_a_renewal_the_watcher_has_not_caught_up_with_fences_before_the_lock() -> None:
    term = active_at(2)
    late = T0 + LEASE + 0.05
    term.watch_from(late)  # the watcher ticked, but not since the deadline passed (as after a tick)
    term.lease_deadline = T0 + LEASE
    arrival = term.renewal_arrives(late)
    assert arrival.reply is None and isinstance(arrival.effects[0], SelfFenced)  # go on, fenced
    term.drain_due()
    reply = term.renew(2, late, None).reply
    assert code(reply) == ("Unavailable", "LEASE_EXPIRED")
    assert reply is not None and "activate it with an epoch above 2" in (reply.unavailability_message or "")


def test_a_fenced_term_is_never_revived_only_a_higher_epoch_activates_again() -> None:
    term = active_at(2)
    term.fence("the cloud answered 409: it has seen epoch 3")
    for epoch in (2,):
        assert code(renew(term, epoch, T0 + 1).reply) == ("Unavailable", "LEASE_EXPIRED")
        assert code(term.check(epoch, T0 + 1, None).reply) == ("Unavailable", "LEASE_EXPIRED")
    assert code(renew(term, 3, T0 + 1).reply) == ("Active", None)
    assert term.fenced_epoch is None  # lifted


def test_active_false_neither_creates_nor_lifts_the_fence_restriction() -> None:
    term = active_at(2)
    term.drain_due()
    release = term.release(2, "op-1")
    reason = "heartbeat active=false from operator 'op-1'"
    assert release == Answer(
        effects=(StopAccepting(reason), StopRelaying(2, reason), LogLifecycle(Event.DEACTIVATED, 2, True))
    )
    assert term.standby_reply(None) == reply_of(BrokerState.INACTIVE, 2)
    assert code(renew(term, 2, T0 + 1).reply) == ("Active", None)  # a drain is not a fence

    term.fence("journal failed: disk full")
    term.drain_due()
    assert term.release(2, "op-1") == Answer()
    assert code(renew(term, 2, T0 + 2).reply) == ("Unavailable", "LEASE_EXPIRED")


def test_active_false_stores_a_higher_epoch_and_a_broken_journal_is_no_standby() -> None:
    term = machine(epoch=1)
    release = term.release(4, "op-1")
    assert release == Answer(awaiting=StoreEpoch(4))
    term.epoch_stored(4)
    assert term.standby_reply(None) == reply_of(BrokerState.INACTIVE, 4)
    assert term.release(3, "op-1").awaiting is None  # never lowered
    assert code(term.standby_reply("bad frame at offset 12")) == ("Unavailable", "JOURNAL_ERROR")


def test_a_stall_fences_an_active_broker_and_refuses_what_waited_it_out() -> None:
    term = active_at(1)
    term.watch_from(T0 + 1)
    resumed = T0 + 1 + 0.61  # a gap above tick + margin (0.6 s)
    effects = term.tick(resumed)
    assert isinstance(effects[0], StallSeen) and effects[0].limit == pytest.approx(0.6)
    assert isinstance(effects[1], SelfFenced) and not term.active and term.fenced_epoch == 1
    # A renewal read from the socket buffer right after the stall (within a tick) is refused.
    answer = renew(term, 1, resumed + 0.05, stalled=True)
    assert code(answer.reply) == ("Unavailable", "EVENT_LOOP_STALLED")
    assert answer.reply is not None and "nothing changed" in (answer.reply.unavailability_message or "")
    # Later, a check at the fenced epoch names the fence and its reason.
    term.watch_from(resumed + 1)
    reply = term.check(1, resumed + 1, None).reply
    assert code(reply) == ("Unavailable", "LEASE_EXPIRED")
    assert reply is not None and "stalled" in (reply.unavailability_message or "")


def test_a_request_handled_before_the_watcher_after_a_stall_fences_and_is_refused() -> None:
    term = active_at(1)
    term.watch_from(T0 + 1)
    resumed = T0 + 2  # the watcher has not ticked since T0 + 1
    check = term.check(1, resumed, None)
    assert code(check.reply) == ("Unavailable", "EVENT_LOOP_STALLED")
    assert "deactivated itself at epoch 1" in message(check.reply)
    assert not term.active and isinstance(check.effects[0], SelfFenced)


def test_an_activation_that_waited_out_a_stall_changes_nothing() -> None:
    term = machine()
    term.watch_from(T0)
    answer = renew(term, 5, T0 + 1.5, stalled=True)  # queued while SIGSTOPped
    assert code(answer.reply) == ("Unavailable", "EVENT_LOOP_STALLED")
    assert answer.effects == () and term.epoch == 0 and not term.active  # not even the epoch stored


def test_a_gap_of_exactly_tick_plus_margin_is_no_stall() -> None:
    term = active_at(1)
    term.watch_from(T0 + 1)
    assert term.tick(T0 + 1 + 0.6) == () and term.active


def test_a_check_never_activates_stores_or_renews() -> None:
    term = machine(epoch=1)
    assert term.check(2, T0, None) == Answer(reply_of(BrokerState.INACTIVE, 1))
    assert term.epoch == 1 and not term.active
    term = active_at(1)
    term.watch_from(T0 + 1)
    assert term.check(1, T0 + 1, None) == Answer(reply_of(BrokerState.ACTIVE, 1))
    assert term.lease_deadline == T0 + LEASE
    term.watch_from(T0 + LEASE + 0.1)
    late = term.check(1, T0 + LEASE + 0.1, None)  # its lease ran out: the check starts the fence
    assert code(late.reply) == ("Unavailable", "LEASE_EXPIRED") and isinstance(late.effects[0], SelfFenced)


def test_a_broken_journal_is_named_before_a_fenced_term() -> None:
    term = active_at(1)
    term.fence("journal failed: disk full")
    answer = renew(term, 1, T0 + 1, journal="journal failed: disk full" + "x" * 600)
    assert code(answer.reply) == ("Unavailable", "JOURNAL_ERROR")
    assert answer.reply is not None and len(answer.reply.unavailability_message or "") == 500
    assert code(term.check(1, T0 + 1, "journal not open").reply) == ("Unavailable", "JOURNAL_ERROR")


def test_shutting_down_refuses_activation_and_deactivates() -> None:
    term = active_at(1)
    term.begin_shutdown()
    assert code(renew(term, 1, T0 + 1).reply) == ("Unavailable", "SHUTTING_DOWN")
    assert code(term.check(1, T0 + 1, None).reply) == ("Unavailable", "SHUTTING_DOWN")
    effects = term.drain_due() + term.deactivate("the broker is shutting down (SIGTERM)")
    assert [type(e) for e in effects] == [StopAccepting, StopRelaying, LogLifecycle]
    assert not term.active and term.fenced_epoch is None  # a shutdown is not a fence


def test_bundles_are_admitted_only_while_active_in_lease_and_not_stalled() -> None:
    term = machine()
    assert not term.admits_bundle(T0) and term.refuse_bundle(T0) == ()
    term = active_at(1)
    term.watch_from(T0 + 1)
    assert term.admits_bundle(T0 + 1.5)
    assert not term.admits_bundle(T0 + 1.7)  # the watcher is 0.7 s late: a stall
    effects = term.refuse_bundle(T0 + 1.7)
    assert isinstance(effects[0], SelfFenced) and "event loop stalled for 0.70s" in effects[0].reason
    term = active_at(1)
    term.watch_from(T0 + LEASE + 0.1)
    assert not term.admits_bundle(T0 + LEASE + 0.1)
    effects = term.refuse_bundle(T0 + LEASE + 0.1)
    assert isinstance(effects[0], SelfFenced) and effects[0].reason.startswith("lease expired")


def test_relays_act_while_active_or_draining_a_planned_deactivation_never_after_a_self_fence() -> None:
    assert not machine().may_relay(T0)  # never activated: no lease
    term = active_at(1)
    term.watch_from(T0 + 1)
    assert term.may_relay(T0 + 1.5)
    assert not term.may_relay(T0 + 1.7)  # the loop stalled (a SIGSTOP): nothing goes to a target

    term = active_at(1)
    term.release(1, "op-1")  # the operator's active=false: it activates no one before the drain answers
    term.watch_from(T0 + 1)
    assert term.may_relay(T0 + 1) and not term.admits_bundle(T0 + 1)
    assert not term.may_relay(T0 + LEASE + 0.1)  # nor past the lease, drain or not

    term = active_at(1)
    term.watch_from(T0 + 1)
    term.fence("the cloud saw epoch 2")
    assert not term.may_relay(T0 + 1)  # in lease, but the operator may have activated another
    release = term.release(3, "op-1")  # a later active=false storing a higher epoch changes nothing
    assert release.awaiting == StoreEpoch(3)
    term.epoch_stored(3)
    assert not term.may_relay(T0 + 1)
    assert code(renew(term, 4, T0 + 2).reply) == ("Active", None)
    assert term.may_relay(T0 + 2)  # a new term relays again
