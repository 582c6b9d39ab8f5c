"""The handover renewal in the term machine: a renewal carrying ``leaseSeconds`` (issue 40).

A stopping operator sends its active one renewal with a longer lease so that the broker stays
Active until a successor renews it. Only a renewal of an Active broker at its current epoch is
extended, never beyond ``--max-lease-seconds``; an activation always starts a normal lease; the
broker fences itself once the extended lease runs out with nothing after it.
"""

from __future__ import annotations

import pytest

from broker_contracts.message_log import Event
from broker_contracts.soap import BrokerState
from broker_service.term import (
    Activate,
    Answer,
    HandoverRenewed,
    LogLifecycle,
    SelfFenced,
    StopAccepting,
    StoreEpoch,
    TermMachine,
    reply_of,
)

LEASE = 5.0  # tick 0.1 s, margin 0.5 s
MAX_LEASE = 30.0
T0 = 100.0


def machine(epoch: int = 0) -> TermMachine:
    return TermMachine.for_lease(LEASE, max_lease_seconds=MAX_LEASE, epoch=epoch, now=T0)


def renew(term: TermMachine, epoch: int, now: float, lease: float | None = None) -> Answer:
    """A renewing heartbeat asking ``lease`` (None: none asked), driven as the broker drives it."""
    term.watch_from(now)
    arrival = term.renewal_arrives(now)
    if arrival.reply is not None:
        return arrival
    term.drain_due()
    answer = term.renew(epoch, now, None, lease_seconds=lease)
    effects: tuple[object, ...] = ()
    if isinstance(answer.awaiting, StoreEpoch):
        effects = term.epoch_stored(answer.awaiting.epoch)
        answer = term.proceed(now)
    if isinstance(answer.awaiting, Activate):
        answer = term.activated(now)
    return Answer(answer.reply, (*arrival.effects, *effects, *answer.effects))  # type: ignore[arg-type]


def active_at(epoch: int, now: float = T0) -> TermMachine:
    term = machine()
    assert renew(term, epoch, now).reply == reply_of(BrokerState.ACTIVE, epoch)
    return term


def test_a_handover_renewal_of_the_active_at_its_epoch_extends_the_lease_and_says_so() -> None:
    term = active_at(3)
    answer = renew(term, 3, T0 + 1, lease=20.0)
    assert answer == Answer(reply_of(BrokerState.ACTIVE, 3), (HandoverRenewed(3, 20.0),))
    assert term.lease_deadline == T0 + 1 + 20.0


@pytest.mark.parametrize("asked", [MAX_LEASE + 0.5, 1e300])
def test_a_handover_lease_is_capped_at_the_broker_maximum(asked: float) -> None:
    term = active_at(3)
    answer = renew(term, 3, T0 + 1, lease=asked)
    assert answer.effects == (HandoverRenewed(3, MAX_LEASE),)
    assert term.lease_deadline == T0 + 1 + MAX_LEASE


def test_without_a_maximum_the_cap_is_the_normal_lease() -> None:
    term = TermMachine.for_lease(LEASE, epoch=0, now=T0)
    assert term.max_lease_seconds == LEASE
    renew(term, 1, T0)
    renew(term, 1, T0 + 1, lease=MAX_LEASE)
    assert term.lease_deadline == T0 + 1 + LEASE


def test_an_activation_gets_the_normal_lease_whatever_it_asks() -> None:
    term = machine(epoch=1)
    answer = renew(term, 2, T0, lease=MAX_LEASE)
    assert answer.reply == reply_of(BrokerState.ACTIVE, 2)
    assert not any(isinstance(effect, HandoverRenewed) for effect in answer.effects)
    assert term.lease_deadline == T0 + LEASE
    # Handed over, then released by the operator's active=false, then activated again at the same
    # epoch: a new term, with a normal lease; the handover's extension ended with the old term.
    renew(term, 2, T0 + 1, lease=MAX_LEASE)
    term.release(2, "op-1")
    renew(term, 2, T0 + 2, lease=MAX_LEASE)
    assert term.active and term.lease_deadline == T0 + 2 + LEASE


def test_a_new_epoch_for_an_active_broker_gets_the_normal_lease_and_ends_the_old_handover() -> None:
    term = active_at(3)
    renew(term, 3, T0 + 1, lease=MAX_LEASE)
    answer = renew(term, 4, T0 + 2, lease=MAX_LEASE)
    assert answer.effects == (LogLifecycle(Event.DEACTIVATED, 3), LogLifecycle(Event.ACTIVATED, 4))
    # The lease the predecessor's handover granted belonged to epoch 3's term, not to this one.
    assert term.epoch == 4 and term.lease_deadline == T0 + 2 + LEASE


def test_a_later_normal_renewal_does_not_shorten_a_handover_lease() -> None:
    term = active_at(3)
    renew(term, 3, T0 + 1, lease=20.0)
    assert renew(term, 3, T0 + 2).effects == ()
    assert term.lease_deadline == T0 + 1 + 20.0
    # A renewal past the handover's end extends it as usual.
    renew(term, 3, T0 + 18)
    assert term.lease_deadline == T0 + 18 + LEASE
    renew(term, 3, T0 + 19, lease=1.0)  # a shorter handover lease never shortens one either
    assert term.lease_deadline == T0 + 18 + LEASE


def test_a_stale_or_refused_handover_renewal_extends_nothing() -> None:
    term = active_at(3)
    answer = renew(term, 2, T0 + 1, lease=MAX_LEASE)
    assert answer.reply is not None and answer.reply.unavailability_code == "STALE_EPOCH"
    assert term.lease_deadline == T0 + LEASE
    term.begin_shutdown()
    assert renew(term, 3, T0 + 1, lease=MAX_LEASE).effects == ()
    assert term.lease_deadline == T0 + LEASE


def test_the_broker_fences_itself_at_the_extended_deadline_not_before() -> None:
    term = active_at(3)
    renew(term, 3, T0 + 1, lease=20.0)
    # The watcher ticks on time through the normal lease's end and up to the extended one.
    now = T0 + 1
    while now < T0 + 1 + 20.0:
        now = min(now + 0.1, T0 + 1 + 20.0)
        assert term.tick(now) == (), now
    assert term.active and term.admits_bundle(now)
    effects = term.tick(now + 0.05)
    reason = "lease expired: no active=true heartbeat for 20s (the lease a handover renewal granted)"
    assert effects == (SelfFenced(3, reason), StopAccepting(reason))
    assert not term.active and term.fenced_epoch == 3


def test_a_handover_lease_below_the_normal_one_grants_that_shorter_lease() -> None:
    term = active_at(3)
    renew(term, 3, T0 + 4.5, lease=1.0)
    assert term.lease_deadline == T0 + 4.5 + 1.0  # not the normal lease's T0 + 9.5
    renew(term, 3, T0 + 5, lease=0.1)  # shortens nothing already granted
    assert term.lease_deadline == T0 + 4.5 + 1.0
