"""``SendMessages``: the backend's bundles, admitted by the term, journaled before they are acknowledged.

The hot path. It does not take the heartbeat lock: it asks the term
(:meth:`broker_service.term.TermMachine.admits_bundle`, a few comparisons) whether the
broker is Active, in lease and not stalled on entry, and refuses with ``BROKER_INACTIVE``
otherwise (an Active broker whose lease ran out or whose loop stalled fences itself then).
Deactivation waits (:meth:`BundleIntake.idle`) for the bundles already past that check
to be journaled, so every acknowledged message is durable, and asks the term again
(:meth:`~broker_service.term.TermMachine.may_relay`) once the bundle is journaled: a broker
paused meanwhile acknowledges nothing after its term ran out. A ``Duplicate`` is an
acknowledgement too: a bundle whose duplicates name seqs still being journaled by another
bundle answers only once the journal has them.

Not here: the seq rule and queues (:mod:`broker_service.outbound`), forwarding
(:mod:`broker_service.forwarder`), the term rules (:mod:`broker_service.term`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import NoReturn

from broker_contracts.message_log import Direction, Event
from broker_contracts.soap import FaultCode
from broker_service.journal import Journal, JournalError, bundle_frame
from broker_service.message_log_writer import MessageLogWriter, now_ts
from broker_service.metrics import BrokerMetrics
from broker_service.outbound import OutboundTable
from broker_service.settings import BrokerSettings
from broker_service.soap_codec import AcceptResult, SendMessagesRequest, SoapFaultError
from broker_service.term import Effect, TermMachine


class BundleIntake:
    def __init__(
        self,
        *,
        settings: BrokerSettings,
        term: TermMachine,
        outbound: OutboundTable,
        journal: Journal,
        message_log: MessageLogWriter,
        metrics: BrokerMetrics,
        perform: Callable[[tuple[Effect, ...]], None],
        journal_failed: Callable[[str], None],
    ) -> None:
        self._settings = settings
        self._term = term
        self._outbound = outbound
        self._journal = journal
        self._message_log = message_log
        self._metrics = metrics
        self._perform = perform  # the broker carries out the term's (synchronous) effects
        self._journal_failed = journal_failed
        self._accepting = 0
        self._accepts_idle = asyncio.Event()
        self._accepts_idle.set()

    async def idle(self, within_seconds: float) -> None:
        """Wait (at most ``within_seconds``) until no admitted bundle is still being journaled."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._accepts_idle.wait(), timeout=within_seconds)

    async def send_messages(self, request: SendMessagesRequest) -> tuple[int, list[AcceptResult]]:
        now = time.monotonic()
        term = self._term
        if not term.admits_bundle(now):
            self._refuse(now)
        settings = self._settings
        if settings.pair_fixed and (request.account, request.company) != (settings.account, settings.company):
            raise SoapFaultError(
                FaultCode.WRONG_PAIR,
                f"bundle is for account {request.account!r} company {request.company!r}; this broker serves "
                f"account {settings.account!r} company {settings.company!r}",
            )
        stamp: str | None = None
        results, accepted, indices, unsettled_duplicate = self._outbound.reserve(
            request.streams, request.seqs, request.msg_ids, request.payloads
        )
        if accepted or unsettled_duplicate:
            self._accepting += 1
            self._accepts_idle.clear()
            try:
                if accepted:
                    # Writes complete in order: this one also covers what a duplicate waits for.
                    await self._journal.append(bundle_frame(request.raw, indices))
                else:
                    await self._journal.flushed()
            except JournalError as error:
                self._journal_failed(str(error))
                raise SoapFaultError(
                    FaultCode.JOURNAL_ERROR, f"journal write failed: {error}", client=False
                ) from None
            finally:
                self._accepting -= 1
                if not self._accepting:
                    self._accepts_idle.set()
            # Asked again after the wait: a broker paused while journaling may no longer hold
            # the term, and then it acknowledges nothing (the backend resends to the active one).
            # The record's time is taken first, so it is no later than the check that allowed it.
            stamp = now_ts()
            now = time.monotonic()
            if not term.may_relay(now):
                self._outbound.commit(accepted)  # durable all the same, like any journaled message
                self._refuse(now)
        if accepted:
            self._outbound.commit(accepted)
            self._message_log.messages(
                Event.ACCEPTED, term.epoch, Direction.OUTBOUND, accepted, first=True, ts=stamp
            )
            self._metrics.accepted.inc(len(accepted))
        if len(accepted) != len(results):
            self._count_refusals(results)
        return term.epoch, results

    def _refuse(self, now: float) -> NoReturn:
        """``BROKER_INACTIVE``; an Active broker whose lease ran out or whose loop stalled fences itself."""
        self._perform(self._term.refuse_bundle(now))
        settings = self._settings
        raise SoapFaultError(
            FaultCode.BROKER_INACTIVE,
            f"broker {settings.name!r} is {self._term.state.value}, not Active; send to the active broker "
            f"(Service {settings.cluster}-active) and retry",
            client=False,
        )

    def _count_refusals(self, results: list[AcceptResult]) -> None:
        gaps = sum(1 for r in results if r[3] is not None)
        duplicates = sum(1 for r in results if r[2].value == "Duplicate")
        self._metrics.gaps.inc(gaps)
        self._metrics.duplicates.inc(duplicates)
