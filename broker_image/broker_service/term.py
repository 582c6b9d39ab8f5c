"""The broker's term rules, a pure state machine: heartbeat, clock and stall in; state, answer, effects out.

A *term* is the time a broker is Active under one stored epoch. This module holds every rule
of the heartbeat contract (ARCHITECTURE.md, "Broker rules", and the additions docs/broker.md
describes) and nothing else:

* ``active=true, epoch=e`` (a renewal): below the stored epoch is ``Unavailable/STALE_EPOCH``
  and changes nothing. Otherwise ``e`` is stored durably first, then an inactive broker
  activates; every accepted renewal extends the lease to *(when its handler started) +
  leaseSeconds*, never later than the operator's own count. A *handover renewal* (WSDL
  ``leaseSeconds``, from a stopping operator) of the Active term at its epoch extends it to
  *started + min(leaseSeconds, --max-lease-seconds)* instead; an activation or a new epoch
  gets the normal lease whatever it asks, and a new term drops an earlier one's extension.
* ``active=true, renewLease=false`` (a check): ``Active`` only while Active, in lease and not
  stalled; it stores, activates and renews nothing.
* ``active=false``: stop accepting and relaying, drain, answer ``Inactive`` (a higher epoch is
  stored too, best effort).
* Self-fencing: lease run out, event loop stalled longer than the lease margin, a target that
  saw a higher epoch, a failed journal write. A fenced term is never revived: only an epoch
  above the fenced one activates the broker again (``LEASE_EXPIRED``).

Why a module of its own: the broker (:mod:`broker_service.lifecycle`) runs it, and the property
tests' simulated brokers (``tests/unit/core/simulation.py``) run the very same object, so the
failover properties are checked against these rules rather than a model of them.

How it is driven. :class:`TermMachine` keeps the term's state and has one method per input;
each is synchronous, reads the clock only as the ``now`` it is given, and returns what the
caller must do as *effects* (:data:`Effect`), in order. Where the outcome of I/O decides what
comes next (storing the epoch, activating), an :class:`Answer` names the effect it is
*awaiting*, and the caller reports the outcome through the matching inputs
(:meth:`TermMachine.epoch_stored` then :meth:`TermMachine.proceed`, or
:meth:`TermMachine.epoch_not_stored`, after :class:`StoreEpoch`; :meth:`TermMachine.activated`
or :meth:`TermMachine.activation_failed` after :class:`Activate`). A renewing heartbeat runs::

    renewal_arrives(now)            # before the heartbeat lock: stall refusal, lease fence
    drain_due()                     # under the lock: the drain of an earlier self-fence
    renew(epoch, now, journal)      # refusal, or awaiting StoreEpoch / Activate, or Active
    epoch_stored(epoch); proceed(now)
    activated(now) | activation_failed(code, message)

``active=false`` runs ``drain_due()``, ``release(...)`` (awaiting a best-effort
:class:`StoreEpoch`), ``standby_reply(...)``; a check runs ``check(...)`` alone, without the
lock; the lease watcher runs ``tick(now)``; ``SendMessages`` asks :meth:`TermMachine.admits_bundle`.

What it deliberately does not do: I/O of any kind (files, sockets, asyncio, logging, metrics),
reading a clock, or holding the heartbeat lock: concurrency is the caller's, and the rules
are written so that any interleaving of whole inputs is one the broker can meet.
"""

from __future__ import annotations

import math

from broker_contracts.message_log import Event
from broker_contracts.soap import BrokerState, HeartbeatReply, UnavailabilityCode
from broker_service.term_effects import (
    Activate,
    Answer,
    Effect,
    HandoverRenewed,
    LogLifecycle,
    SelfFenced,
    StallSeen,
    StartRelaying,
    StopAccepting,
    StopRelaying,
    StoreEpoch,
    reply_of,
)

__all__ = [
    "Activate",
    "Answer",
    "Effect",
    "HandoverRenewed",
    "LogLifecycle",
    "SelfFenced",
    "StallSeen",
    "StartRelaying",
    "StopAccepting",
    "StopRelaying",
    "StoreEpoch",
    "TermMachine",
    "lease_margin_seconds",
    "lease_tick_seconds",
    "reply_of",
]


def lease_tick_seconds(lease_seconds: float) -> float:
    """How often the lease watcher runs: ``min(0.1, lease_seconds / 10)`` (as ``BrokerSettings``)."""
    return min(0.1, lease_seconds / 10)


def lease_margin_seconds(lease_seconds: float) -> float:
    """The operator's slack on top of the lease, ``max(0.25, 0.1 * lease)`` (as ``BrokerSettings``)."""
    return max(0.25, 0.1 * lease_seconds)


class TermMachine:
    """The term state of one broker process and the rules that change it (see the module docstring).

    Starts Inactive with the stored ``epoch`` (a restarted broker knows its epoch from disk and
    nothing else: the fence restriction lives in memory only).
    """

    def __init__(
        self,
        *,
        lease_seconds: float,
        tick_seconds: float,
        margin_seconds: float,
        epoch: int,
        now: float,
        max_lease_seconds: float | None = None,
    ) -> None:
        self.lease_seconds = lease_seconds
        # The longest lease a handover renewal may grant (--max-lease-seconds); at least the lease.
        self.max_lease_seconds = lease_seconds if max_lease_seconds is None else max_lease_seconds
        assert self.max_lease_seconds >= lease_seconds, (max_lease_seconds, lease_seconds)
        self.tick_seconds = tick_seconds
        self.margin_seconds = margin_seconds
        # A gap between two watcher ticks beyond this means the event loop did not run.
        self.stalled_after = tick_seconds + margin_seconds
        self.epoch = epoch
        self.active = False
        self.lease_deadline = 0.0
        # The deadline the normal leases alone give (a handover's extension left out), never after
        # lease_deadline; and the lease that set lease_deadline last (for the fence's reason).
        self.plain_deadline = 0.0
        self.granted_seconds = lease_seconds
        self.last_tick = now
        # The last stall the watcher found: when, and how long.
        self.stall_seen_at = -math.inf
        self.stall_seconds = 0.0
        # The stored epoch at which this broker last fenced itself, and why: only a higher
        # epoch activates it again. None once a higher epoch has activated it.
        self.fenced_epoch: int | None = None
        self.fence_reason = ""
        # A deactivation whose first half (stop being Active) is done and whose drain is not.
        self.draining: str | None = None
        self.shutting_down = False

    @classmethod
    def for_lease(
        cls, lease_seconds: float, *, max_lease_seconds: float | None = None, epoch: int = 0, now: float = 0.0
    ) -> TermMachine:
        """With the tick and margin the broker derives from ``--lease-seconds`` (never from the maximum)."""
        return cls(
            lease_seconds=lease_seconds,
            tick_seconds=lease_tick_seconds(lease_seconds),
            margin_seconds=lease_margin_seconds(lease_seconds),
            epoch=epoch,
            now=now,
            max_lease_seconds=max_lease_seconds,
        )

    @property
    def state(self) -> BrokerState:
        return BrokerState.ACTIVE if self.active else BrokerState.INACTIVE

    # ---- the clock: lease watcher and stalls -------------------------------------------------

    def watch_from(self, now: float) -> None:
        """The watcher (re)starts counting at ``now``: whatever took the time before was no stall."""
        self.last_tick = now

    def tick(self, now: float) -> tuple[Effect, ...]:
        """The lease watcher's tick: a gap past the limit is a stall; a lease run out fences."""
        gap = now - self.last_tick
        self.last_tick = now
        if gap > self.stalled_after:
            self.stall_seen_at, self.stall_seconds = now, gap
            return (StallSeen(gap, self.stalled_after), *self._self_fence(self._stall_reason(gap)))
        if self.active and now > self.lease_deadline:
            return self._self_fence(self._lease_expired_reason())
        return ()

    def stalled_for(self, now: float) -> float:
        """How long the event loop was stalled, if a call handled ``now`` may have waited it out; else 0.

        Either the watcher has not ticked since the loop resumed (the handler got scheduled
        first), or it found a stall less than one tick ago: what queued up in the socket
        buffers during a stall is read in the loop's first iterations after it.
        """
        gap = now - self.last_tick
        if gap > self.stalled_after:
            return gap
        if now - self.stall_seen_at <= self.tick_seconds:
            return self.stall_seconds
        return 0.0

    # ---- SendMessages --------------------------------------------------------------------------

    def admits_bundle(self, now: float) -> bool:
        """Whether a bundle handled ``now`` may be accepted: Active, in lease, loop not stalled.

        The lease and the stall are checked here, not only by the watcher: a broker resumed after
        a pause must not accept a bundle on a lease that ran out meanwhile, nor one that sat in
        the socket buffer through the pause. It is also what "acts as Active" means.
        """
        return self.active and now <= self.lease_deadline and now - self.last_tick <= self.stalled_after

    def may_relay(self, now: float) -> bool:
        """Whether the relays may act on a target ``now`` (send, confirm, poll, acknowledge).

        Active, or draining a deactivation the operator asked for (it activates no one before
        the drain's answer), and in lease and not stalled. Never after a self-fence: the operator
        may have activated another broker by then. Asked right before each call to a target, so
        a broker resumed after a pause acts on nothing: a record it writes carries the time of
        this check, the last instant it knew it still held the term.
        """
        # fenced_epoch, not the epoch: a later active=false may store a higher one meanwhile.
        relaying = self.active or self.fenced_epoch is None
        return relaying and now <= self.lease_deadline and now - self.last_tick <= self.stalled_after

    def refuse_bundle(self, now: float) -> tuple[Effect, ...]:
        """A bundle was not admitted: an Active broker whose lease ran out or loop stalled fences itself."""
        if not self.active:
            return ()
        if now > self.lease_deadline:
            return self._self_fence(self._lease_expired_reason())
        return self._self_fence(self._stall_reason(now - self.last_tick))

    # ---- fencing and deactivation ---------------------------------------------------------------

    def fence(self, reason: str) -> tuple[Effect, ...]:
        """A target saw a higher epoch, or the journal failed: stop being Active at once."""
        return self._self_fence(reason)

    def _self_fence(self, reason: str) -> tuple[Effect, ...]:
        if not self.active:
            return ()
        self.fenced_epoch = self.epoch
        self.fence_reason = reason
        return (SelfFenced(self.epoch, reason), *self._stop_accepting(reason))

    def _stop_accepting(self, reason: str) -> tuple[Effect, ...]:
        """The first half of a deactivation, synchronous: no longer Active from this instant."""
        self.active = False
        self.draining = reason
        return (StopAccepting(reason),)

    def drain_due(self) -> tuple[Effect, ...]:
        """The second half, under the lock (first thing in it): drain, then log ``deactivated``."""
        reason = self.draining
        if reason is None:
            return ()
        self.draining = None
        return (
            StopRelaying(self.epoch, reason),
            LogLifecycle(Event.DEACTIVATED, self.epoch, close_segment=True),
        )

    def deactivate(self, reason: str) -> tuple[Effect, ...]:
        """Under the lock: stop accepting and drain now (``active=false``, SIGTERM). Not a fence."""
        if not self.active:
            return ()
        return self._stop_accepting(reason) + self.drain_due()

    def begin_shutdown(self) -> None:
        """SIGTERM: from now on every ``active=true`` answers ``SHUTTING_DOWN``."""
        self.shutting_down = True

    # ---- heartbeats ----------------------------------------------------------------------------

    def release(self, epoch: int, operator_id: str) -> Answer:
        """``active=false`` (under the lock): deactivate, then store a higher epoch (best effort).

        It fences older operators, but it neither creates the ``LEASE_EXPIRED`` restriction nor
        lifts one. A failed store is not an answer here: the caller goes on to
        :meth:`standby_reply` with the epoch it has.
        """
        effects = self.deactivate(f"heartbeat active=false from operator {operator_id!r}")
        return Answer(effects=effects, awaiting=StoreEpoch(epoch) if epoch > self.epoch else None)

    def standby_reply(self, journal_error: str | None) -> HeartbeatReply:
        """``Inactive``, or ``JOURNAL_ERROR`` when the journal failed: not a usable standby."""
        if journal_error:
            return self._unavailable(UnavailabilityCode.JOURNAL_ERROR, journal_error[:500])
        return reply_of(BrokerState.INACTIVE, self.epoch)

    def check(self, epoch: int, now: float, journal_problem: str | None) -> Answer:
        """``renewLease=false``: is this broker Active? Changes nothing but a due fence; no lock."""
        if self.shutting_down:
            return Answer(self._unavailable(UnavailabilityCode.SHUTTING_DOWN, "the broker is shutting down"))
        if refusal := self._stale(epoch) or self._journal_refusal(journal_problem):
            return Answer(refusal)
        effects: tuple[Effect, ...] = ()
        if self.active:
            if stalled := self.stalled_for(now):
                return self._refuse_stalled(stalled)
            if now > self.lease_deadline:
                effects = self._self_fence(self._lease_expired_reason())
            else:
                return Answer(reply_of(BrokerState.ACTIVE, self.epoch))
        return Answer(self._fenced_term(epoch) or reply_of(BrokerState.INACTIVE, self.epoch), effects)

    def renewal_arrives(self, now: float) -> Answer:
        """A renewing ``active=true``, before the lock. No reply means: go on under the lock.

        The stall is asked first: this call may have sat in the socket buffer through it. A
        lease the watcher has not yet seen run out is over all the same.
        """
        if stalled := self.stalled_for(now):
            return self._refuse_stalled(stalled)
        if self.active and now > self.lease_deadline:
            return Answer(effects=self._self_fence(self._lease_expired_reason()))
        return Answer()

    def renew(
        self, epoch: int, started: float, journal_problem: str | None, *, lease_seconds: float | None = None
    ) -> Answer:
        """A renewing ``active=true`` under the lock, after :meth:`drain_due`: refuse, or go on.

        A broken journal is named before a fenced term: it is why a journal failure fenced it.
        """
        if self.shutting_down:
            return Answer(self._unavailable(UnavailabilityCode.SHUTTING_DOWN, "the broker is shutting down"))
        if (
            refusal := self._stale(epoch)
            or self._journal_refusal(journal_problem)
            or self._fenced_term(epoch)
        ):
            return Answer(refusal)
        if epoch > self.epoch:
            return Answer(awaiting=StoreEpoch(epoch))  # a new term: leaseSeconds is not honoured
        if self.active and lease_seconds is not None:
            return self._handover(started, lease_seconds)
        return self.proceed(started)

    def epoch_stored(self, epoch: int) -> tuple[Effect, ...]:
        """:class:`StoreEpoch` succeeded. Active already: the log shows one term end and the next begin."""
        previous, self.epoch = self.epoch, epoch
        if not self.active:
            return ()
        # The old term's handover extension ends with it: the new epoch's operator counts its own lease.
        self.lease_deadline = self.plain_deadline
        # So the validator sees who was active with which epoch.
        return (LogLifecycle(Event.DEACTIVATED, previous), LogLifecycle(Event.ACTIVATED, epoch))

    def epoch_not_stored(self, error: str) -> HeartbeatReply:
        """:class:`StoreEpoch` failed on a renewal: nothing changed, the volume needs looking at."""
        return self._unavailable(UnavailabilityCode.JOURNAL_ERROR, error)

    def proceed(self, started: float) -> Answer:
        """The epoch is stored: an inactive broker activates (awaited), an active one is renewed."""
        if not self.active:
            return Answer(awaiting=Activate(self.epoch))
        return Answer(self._renewed(started))

    def activated(self, started: float) -> Answer:
        """:class:`Activate` succeeded: Active under the stored epoch, and renewed."""
        self.active = True
        # A new term: no handover extension of an earlier term at this epoch carries over.
        self.lease_deadline = self.plain_deadline
        effects = (LogLifecycle(Event.ACTIVATED, self.epoch), StartRelaying(self.epoch))
        return Answer(self._renewed(started), effects)

    def activation_failed(self, code: UnavailabilityCode, message: str) -> Answer:
        """:class:`Activate` failed: the broker stays inactive (the epoch stays stored)."""
        return Answer(self._unavailable(code, message))

    def _handover(self, started: float, asked: float) -> Answer:
        """A handover renewal of the Active term at its epoch: the lease it asks, up to the maximum.

        Sent by a stopping operator so that its active outlives the gap until a successor renews
        it; the successor waits out the longest lease any predecessor could grant
        (docs/failover-engine.md), which the maximum bounds.
        """
        granted = min(asked, self.max_lease_seconds)
        return Answer(self._renewed(started, granted), (HandoverRenewed(self.epoch, granted),))

    def _renewed(self, started: float, granted: float | None = None) -> HeartbeatReply:
        self.fenced_epoch = None  # an epoch above the fenced one is Active now
        # Counted from when this call started to be handled: the operator counts from when it
        # saw the answer, which is later, so the broker's lease always ends first. Never moved
        # back: a renewal that got the lock later, or asked a shorter lease, shortens nothing.
        granted = self.lease_seconds if granted is None else granted
        self.plain_deadline = max(self.plain_deadline, started + min(granted, self.lease_seconds))
        if started + granted > self.lease_deadline:
            self.lease_deadline, self.granted_seconds = started + granted, granted
        return reply_of(BrokerState.ACTIVE, self.epoch)

    # ---- refusals ------------------------------------------------------------------------------

    def _unavailable(self, code: UnavailabilityCode, message: str) -> HeartbeatReply:
        return reply_of(BrokerState.UNAVAILABLE, self.epoch, code.value, message)

    def _stale(self, epoch: int) -> HeartbeatReply | None:
        if epoch < self.epoch:
            return self._unavailable(
                UnavailabilityCode.STALE_EPOCH,
                f"heartbeat epoch {epoch} is below this broker's stored epoch {self.epoch}; "
                "a newer operator decision exists",
            )
        return None

    def _journal_refusal(self, problem: str | None) -> HeartbeatReply | None:
        return None if problem is None else self._unavailable(UnavailabilityCode.JOURNAL_ERROR, problem[:500])

    def _fenced_term(self, epoch: int) -> HeartbeatReply | None:
        """``LEASE_EXPIRED`` for an ``active=true`` that would revive the term this broker fenced."""
        fenced = self.fenced_epoch
        if fenced is None or epoch > fenced:
            return None
        return self._unavailable(
            UnavailabilityCode.LEASE_EXPIRED,
            f"this broker deactivated itself at epoch {fenced} ({self.fence_reason}); epoch {epoch} "
            f"cannot make it Active again: activate it with an epoch above {fenced}",
        )

    def _refuse_stalled(self, stalled: float) -> Answer:
        reason = self._stall_reason(stalled)
        effects: tuple[Effect, ...] = ()
        if self.active:
            effects = self._self_fence(reason)
            outcome = (
                f"the broker deactivated itself at epoch {self.epoch}: activate it with an epoch "
                f"above {self.epoch}"
            )
        else:
            outcome = "nothing changed"
        reply = self._unavailable(
            UnavailabilityCode.EVENT_LOOP_STALLED,
            f"{reason} when this call was handled; a call that waited that long may be older than "
            f"the operator's fence, so it was not acted on; {outcome}",
        )
        return Answer(reply, effects)

    def _stall_reason(self, stalled: float) -> str:
        return (
            f"event loop stalled for {stalled:.2f}s, longer than the lease margin of {self.margin_seconds:g}s"
        )

    def _lease_expired_reason(self) -> str:
        granted = self.granted_seconds
        why = " (the lease a handover renewal granted)" if granted != self.lease_seconds else ""
        return f"lease expired: no active=true heartbeat for {granted:g}s{why}"
