"""The operator's administrative operations on held messages: ``ListHeld``, ``ReplayHeld``, ``DiscardHeld``.

Each answers only once the journal has what it changed (or, for ``ListHeld``, what was
queued before it), so what an operator was told survives a kill -9: a replay a crash
forgot would hold the message again, an outbound discard a crash forgot would forward it
after all. A broker whose journal cannot be used answers ``JOURNAL_ERROR`` instead of a
list or a change it could not keep, and a journal write that fails here fences the broker
as any other journal failure does.

An inactive broker answers from its own journal too: what it held when it was last active.
Brokers do not share journals, so the operator asks the active broker what is held now.

Not here: the hold queues themselves (:mod:`broker_service.outbound`,
:mod:`broker_service.inbound`, :mod:`broker_service.holds`), credentials (the server).
"""

from __future__ import annotations

from collections.abc import Callable

from broker_contracts.message_log import Direction, Event
from broker_contracts.soap import FaultCode
from broker_service.forwarder import OutboundForwarder
from broker_service.holds import HeldEntry, Release
from broker_service.inbound import InboundPoller
from broker_service.journal import Journal, JournalError, released_frame
from broker_service.message_log_writer import MessageLogWriter
from broker_service.outbound import OutboundTable
from broker_service.relay_client import StaleEpochError, TargetUnreachableError
from broker_service.soap_codec import SoapFaultError


class HeldAdmin:
    def __init__(
        self,
        *,
        outbound: OutboundTable,
        inbound: InboundPoller,
        forwarder: OutboundForwarder,
        journal: Journal,
        message_log: MessageLogWriter,
        epoch: Callable[[], int],
        journal_error: Callable[[], str | None],
        journal_failed: Callable[[str], None],
    ) -> None:
        self._outbound = outbound
        self._inbound = inbound
        self._forwarder = forwarder
        self._journal = journal
        self._message_log = message_log
        self._epoch = epoch
        self._journal_error = journal_error
        self._journal_failed = journal_failed

    async def list_held(self, stream: str | None) -> list[HeldEntry]:
        """This broker's holds, once the journal has them: what it answers survives a kill -9."""
        await self._journal_written("cannot list held messages")
        return self._outbound.holds.entries(stream) + self._inbound.holds.entries(stream)

    async def replay_held(self, direction: str, stream: str, seq: int) -> HeldEntry:
        self._check_request(direction)
        if direction == Direction.OUTBOUND.value:
            entry = self._outbound.replay(stream, seq)
            self._forwarder.refresh_hold_metrics()
        else:
            entry = self._inbound.replay(stream, seq)
        if entry is None:
            raise SoapFaultError(
                FaultCode.NOT_FOUND, f"no held {direction} message for stream {stream!r} seq {seq}"
            )
        # Queued in the same step as the change (a journal snapshot cannot fall in between), and
        # answered only once it is on disk: a replay a crash forgot would hold the message again.
        await self._journal_written(
            "the replay could not be journaled",
            released_frame(entry.direction, stream, seq, Release.REPLAYED),
        )
        self._message_log.messages(Event.REPLAYED, self._epoch(), entry.direction, [entry.message])
        return entry

    async def discard_held(self, direction: str, stream: str, seq: int) -> HeldEntry:
        self._check_request(direction)
        if direction == Direction.OUTBOUND.value:
            entry = self._outbound.discard(stream, seq)
            if entry is not None:
                self._forwarder.mark_dirty(stream)
                self._forwarder.refresh_hold_metrics()
        else:
            try:
                entry = await self._inbound.discard(stream, seq)
            except (TargetUnreachableError, StaleEpochError) as error:
                raise SoapFaultError(
                    FaultCode.NOT_FOUND,
                    f"cannot discard: confirming it to the cloud failed: {error}",
                    client=False,
                ) from None
        if entry is None:
            raise SoapFaultError(
                FaultCode.NOT_FOUND, f"no held {direction} message for stream {stream!r} seq {seq}"
            )
        # Outbound, a discard a crash forgot would forward the message after all.
        await self._journal_written(
            "the discard could not be journaled",
            released_frame(entry.direction, stream, seq, Release.DISCARDED),
        )
        self._message_log.messages(
            Event.DISCARDED, self._epoch(), entry.direction, [entry.message], final=True
        )
        return entry

    async def _journal_written(self, doing: str, record: bytes | None = None) -> None:
        """Wait until ``record`` (or what is queued so far) is on disk, or fault ``JOURNAL_ERROR``."""
        journal = self._journal
        failure = self._journal_error() or (None if journal.is_open else "journal not open")
        if failure is None:
            try:
                await (journal.append(record) if record is not None else journal.flushed())
                return
            except JournalError as error:
                failure = str(error)
                self._journal_failed(failure)
        raise SoapFaultError(
            FaultCode.JOURNAL_ERROR,
            f"{doing}: this broker's journal is not usable ({failure[:300]}); its holds are not known "
            "durably. Ask the active broker",
            client=False,
        )

    def _check_request(self, direction: str) -> None:
        if self._journal_error() or not self._journal.is_open:
            raise SoapFaultError(
                FaultCode.JOURNAL_ERROR,
                "this broker's journal is not usable, so a replay or discard could not be kept; "
                "nothing changed. Ask the active broker",
                client=False,
            )
        if direction not in (Direction.OUTBOUND.value, Direction.INBOUND.value):
            raise SoapFaultError(
                FaultCode.MALFORMED_REQUEST, f"direction {direction!r} is not inbound or outbound"
            )
