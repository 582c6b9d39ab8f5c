"""One simulated broker process for the property tests: the broker's own term rules, its I/O simulated.

:class:`SimBroker` drives :class:`broker_service.term.TermMachine` in the order
``lifecycle.Broker`` does and answers with the reply the operator's heartbeat client would
decode. What is simulated is only what the machine leaves to its caller: storing the epoch,
the targets' part of an activation, the journal's health, and the process's clock (its lease
watcher ticks while it runs, not while it is SIGSTOPped). :mod:`tests.unit.core.simulation`
puts several of them in a world with the real decision core.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from broker_contracts.soap import UnavailabilityCode
from broker_operator.core import HeartbeatReply, SendHeartbeat
from broker_service.term import Activate, Answer, StoreEpoch, TermMachine


@dataclass
class SimBroker:
    """One broker process: the broker's own term state machine, driven as the broker drives it.

    Only the I/O is simulated: storing the epoch always succeeds, activating (the cloud
    probe and the backend's resend request) fails as the targets would, ``STALE_EPOCH`` below
    the epoch they have seen and ``BACKEND_UNREACHABLE`` while ``activation_fails``, and a
    journal that failed (``journal_error``) stays failed until the process restarts. The
    process's monotonic clock is the world's; its lease watcher ticks on time while it runs
    (:meth:`run_until`) and not while it is paused, so a pause or a clock step is found the
    way the broker finds it, as a gap between two ticks.
    """

    name: str
    lease: float
    # --max-lease-seconds: what a handover renewal may grant (0: the lease, the broker's default).
    max_lease: float = 0.0
    alive: bool = True
    partitioned: bool = False
    slow: bool = False
    activation_fails: bool = False
    journal_error: str | None = None
    epoch: InitVar[int] = 0  # the epoch stored on its disk when the process starts
    term: TermMachine = field(init=False)
    paused_at: float | None = None  # SIGSTOPped since then; requests queue in `queued`
    queued: list[SendHeartbeat] = field(default_factory=list)

    def __post_init__(self, epoch: int) -> None:
        self.term = self._term(epoch)

    def _term(self, epoch: int) -> TermMachine:
        cap = max(self.lease, self.max_lease)
        return TermMachine.for_lease(self.lease, max_lease_seconds=cap, epoch=epoch)

    def new_process(self, epoch: int | None = None) -> None:
        """kill -9 or a restart: a process starts Inactive with its stored epoch, nothing else.

        ``epoch``: a disk that stores another one (a re-created cluster's brokers remember theirs).
        """
        stored = self.term.epoch if epoch is None else epoch
        self.term = self._term(stored)
        self.paused_at, self.queued = None, []
        self.journal_error = None  # recovery opens it again

    @property
    def active(self) -> bool:
        return self.term.active

    def acts_as_active(self, now: float) -> bool:
        """Whether it would act as the active if it ran now (the rule ``SendMessages`` applies)."""
        return self.alive and self.term.admits_bundle(now)

    def run_until(self, now: float) -> None:
        """The process ran up to ``now``: its lease watcher ticked on time (a lease run out fences)."""
        term = self.term
        term.watch_from(max(term.last_tick, now - term.tick_seconds))
        term.tick(now)

    def handle(  # noqa: PLR0917 - the Heartbeat's own fields, in the callers' order
        self,
        active: bool,
        epoch: int,
        now: float,
        renew: bool = True,
        target_epoch: int = 0,
        lease_seconds: float | None = None,
    ) -> HeartbeatReply:
        """One Heartbeat handled at ``now``, in the broker's order (lifecycle.Broker.heartbeat).

        ``target_epoch``: the highest epoch the backend and cloud have seen; an activation
        below it fails, as the real broker's resend request and cloud probe do (STALE_EPOCH).
        """
        term = self.term
        if not active:
            term.drain_due()
            release = term.release(epoch, "sim")
            if isinstance(release.awaiting, StoreEpoch):
                term.epoch_stored(release.awaiting.epoch)
            return _operator_view(term.standby_reply(self.journal_error))
        if not renew:
            return _operator_view(term.check(epoch, now, self.journal_error).reply)
        answer = term.renewal_arrives(now)
        if answer.reply is None:
            term.drain_due()  # under the heartbeat lock, first thing
            answer = term.renew(epoch, now, self.journal_error, lease_seconds=lease_seconds)
            if isinstance(answer.awaiting, StoreEpoch):
                term.epoch_stored(answer.awaiting.epoch)
                answer = term.proceed(now)
            if isinstance(answer.awaiting, Activate):
                answer = self._activate(answer.awaiting.epoch, now, target_epoch)
        return _operator_view(answer.reply)

    def _activate(self, epoch: int, now: float, target_epoch: int) -> Answer:
        """The targets' part of an activation; a failure's message is its code (tests compare it)."""
        if epoch < target_epoch:
            code = UnavailabilityCode.STALE_EPOCH
        elif self.activation_fails:
            code = UnavailabilityCode.BACKEND_UNREACHABLE
        else:
            return self.term.activated(now)
        return self.term.activation_failed(code, code.value)


def _operator_view(reply: HeartbeatReply | None) -> HeartbeatReply:
    """The broker's reply is the operator's type: the contract's, one class for both sides."""
    assert reply is not None, "the term machine left a heartbeat unanswered"
    return reply
