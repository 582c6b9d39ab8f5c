"""Inbound delivery: polls the cloud while Active and delivers to the backend in order per stream.

The loop is deliberately sequential: poll, deliver what came back to the
backend (one request, every stream in ``seq`` order), confirm to the cloud
exactly what the backend took, poll again. The cloud keeps answering with every
unconfirmed message, so no message needs journaling here: if this broker dies
between delivery and confirmation, the next active broker gets the same
messages again and the backend drops the duplicates by ``(stream, seq)``.
Only holds are journaled (a restarted broker must not try a held message again).

Per-message refusals by the backend count attempts per ``(stream, seq)``;
retries wait with backoff; after ``maxDeliveries`` the ``onPoison`` policy
applies. A held inbound message is simply never confirmed to the cloud (so the
cloud keeps it: nothing is dropped) and is filtered out of later polls; under
``BlockStream`` everything after it in its stream is filtered too. Replay lifts
the filter; discard confirms it to the cloud so the cloud forgets it.

A hold can outlive its reason when another broker was active meanwhile and had
the message replayed or discarded: the cloud then no longer offers it. Each
stream's slice of a poll starts at its lowest unconfirmed ``seq`` (the relay
contract), so a poll whose slice of a stream starts above a held ``seq`` shows
that; the hold is dropped (journaled as ``resolved``) instead of filtering that
stream forever.

This module does not decide when to run; the lifecycle starts and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from broker_contracts.message_log import Direction, Event, format_ts
from broker_contracts.relay import DeliveryStatus
from broker_service.holds import HeldEntry, HoldQueue, Release
from broker_service.journal import HoldKey, Journal, held_frame, released_frame
from broker_service.message_log_writer import MessageLogWriter, answer_ts, now_ts
from broker_service.metrics import BrokerMetrics
from broker_service.relay_client import RelayClient, RelayMessage, StaleEpochError, TargetUnreachableError
from broker_service.settings import BrokerSettings, PoisonPolicy

logger = logging.getLogger(__name__)


class InboundPoller:
    def __init__(
        self,
        *,
        settings: BrokerSettings,
        relay: RelayClient,
        journal: Journal,
        message_log: MessageLogWriter,
        metrics: BrokerMetrics,
        epoch: Callable[[], int],
        may_relay: Callable[[], bool],
        fence: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.relay = relay
        self.journal = journal
        self.log = message_log
        self.metrics = metrics
        self._epoch = epoch
        self._may_relay = may_relay
        self._fence = fence
        self.holds = HoldQueue()
        self._attempts: dict[tuple[str, int], int] = {}
        self._retry_at: dict[str, float] = {}  # stream -> monotonic time its retry is due
        self._blocked: dict[str, int] = {}  # BlockStream: stream -> held seq
        self._logged_accepted: dict[str, int] = {}
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def load(self, holds: dict[HoldKey, HeldEntry]) -> None:
        """The inbound holds the journal recovered: held still, the stream stopped if it was."""
        for (direction, stream, seq), entry in sorted(holds.items()):
            if direction is Direction.INBOUND:
                self.holds.add(entry)
                if entry.blocks_stream:
                    self._blocked[stream] = seq
        self.refresh_hold_metrics()

    def snapshot_frames(self) -> list[bytes]:
        return [held_frame(entry) for entry in self.holds.entries()]

    def start(self) -> None:
        self._running = True
        self._task = asyncio.get_running_loop().create_task(self._poll_loop(), name="inbound-poller")

    async def stop(self, drain_seconds: float) -> None:
        self._running = False
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=drain_seconds)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None

    async def _idle(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    def _backoff(self, failures: int) -> float:
        return min(self.settings.retry_max_seconds, self.settings.retry_base_seconds * 2 ** min(failures, 10))

    def _drop_resolved_holds(self, messages: list[RelayMessage]) -> None:
        """Forget holds the cloud no longer offers: another broker had them confirmed."""
        lowest: dict[str, int] = {}
        for message in messages:
            if message[1] < lowest.get(message[0], message[1] + 1):
                lowest[message[0]] = message[1]
        for entry in self.holds.entries():
            if entry.seq < lowest.get(entry.stream, entry.seq):
                self.holds.pop(entry.stream, entry.seq)
                if self._blocked.get(entry.stream) == entry.seq:
                    del self._blocked[entry.stream]
                self.journal.append_lazily(
                    released_frame(Direction.INBOUND, entry.stream, entry.seq, Release.RESOLVED)
                )
                logger.info(
                    "inbound stream %r seq %d no longer held: the cloud's stream starts at seq %d, so "
                    "another broker had it confirmed",
                    entry.stream,
                    entry.seq,
                    lowest[entry.stream],
                )
                self.refresh_hold_metrics()

    def _deliverable(self, messages: list[RelayMessage]) -> list[RelayMessage]:
        if self.holds:
            self._drop_resolved_holds(messages)
        now = time.monotonic()
        keep = []
        for message in messages:
            stream, seq = message[0], message[1]
            blocked_at = self._blocked.get(stream)
            if blocked_at is not None and seq >= blocked_at:
                continue
            if self._retry_at.get(stream, 0.0) > now or self.holds.get(stream, seq) is not None:
                continue
            keep.append(message)
        return keep

    async def _poll_loop(self) -> None:
        failures = 0
        while self._running:
            # Each call to a target asks the term first; a record carries the time of that check.
            if not self._may_relay():
                return  # fenced or deactivated: what is not confirmed stays with the cloud
            epoch = self._epoch()
            try:
                polled = await self.relay.poll_inbound(epoch, self.settings.poll_max)
                messages = self._deliverable(polled)
                if not messages:
                    await self._idle(self.settings.poll_idle_seconds)
                    continue
                checked = now_ts()  # taken before the check: no later than the last instant in term
                if not self._may_relay():
                    return
                self._log_accepted(epoch, messages, checked)
                self._log_forwarded(epoch, messages, checked)
                reply = await self.relay.deliver_inbound(epoch, messages)
                answered = answer_ts(self._may_relay, checked, "backend")
                taken = self._settle(epoch, messages, reply["results"], reply["reasons"], answered)
                if taken:
                    checked = now_ts()
                    if not self._may_relay():
                        return  # the cloud offers them again to the next active broker
                    await self.relay.confirm_inbound(epoch, [[m[0], m[1]] for m in taken])
                    self.log.messages(
                        Event.CONFIRMED, epoch, Direction.INBOUND, taken, final=True, ts=checked
                    )
                    self.metrics.confirmed.labels("inbound").inc(len(taken))
                failures = 0
                if len(polled) < self.settings.poll_max:
                    await self._idle(self.settings.poll_idle_seconds)
            except StaleEpochError as error:
                self._fence(str(error))
                return
            except TargetUnreachableError as error:
                failures += 1
                self.metrics.relay_failures.labels("inbound").inc()
                logger.warning("inbound relay failed (retry %d): %s", failures, error)
                await self._idle(self._backoff(failures))

    def _log_forwarded(self, epoch: int, messages: list[RelayMessage], ts: str) -> None:
        first_tries = []
        for message in messages:
            tried = self._attempts.get((message[0], message[1]), 0)
            if tried:
                self.log.messages(
                    Event.FORWARDED, epoch, Direction.INBOUND, [message], attempt=tried + 1, ts=ts
                )
            else:
                first_tries.append(message)
        self.log.messages(Event.FORWARDED, epoch, Direction.INBOUND, first_tries, attempt=1, ts=ts)

    def _log_accepted(self, epoch: int, messages: list[RelayMessage], ts: str) -> None:
        fresh = []
        for message in messages:
            stream, seq = message[0], message[1]
            if seq > self._logged_accepted.get(stream, 0):
                self._logged_accepted[stream] = seq
                fresh.append(message)
        if fresh:
            self.log.messages(Event.ACCEPTED, epoch, Direction.INBOUND, fresh, first=True, ts=ts)

    def _settle(
        self,
        epoch: int,
        messages: list[RelayMessage],
        results: list[str],
        reasons: dict[str, str],
        answered: str | None,
    ) -> list[RelayMessage]:
        """Sort the backend's answer; ``answered`` dates its records (``forwarder.answer_ts``)."""
        taken: list[RelayMessage] = []
        delivered: list[RelayMessage] = []
        deduplicated: list[RelayMessage] = []  # the backend had them already (see Event.DEDUPLICATED)
        held: list[HeldEntry] = []
        for index, message in enumerate(messages):
            status = results[index] if index < len(results) else DeliveryStatus.SKIPPED.value
            stream, seq = message[0], message[1]
            if status in (DeliveryStatus.OK, DeliveryStatus.DUPLICATE):
                self._attempts.pop((stream, seq), None)
                taken.append(message)
                (delivered if status == DeliveryStatus.OK else deduplicated).append(message)
            elif status == DeliveryStatus.REJECTED:
                self.metrics.rejected.labels("inbound").inc()
                attempts = self._attempts.get((stream, seq), 0) + 1
                reason = reasons.get(str(index), "rejected by the backend")
                if attempts < self.settings.max_deliveries:
                    self._attempts[(stream, seq)] = attempts
                    self._retry_at[stream] = time.monotonic() + self._backoff(attempts - 1)
                    continue
                self._attempts.pop((stream, seq), None)
                blocks = self.settings.on_poison is PoisonPolicy.BLOCK_STREAM
                entry = HeldEntry(
                    Direction.INBOUND,
                    (stream, seq, str(message[2]), str(message[3])),
                    attempts,
                    reason,
                    format_ts(),
                    blocks,
                )
                self.holds.add(entry)
                self.journal.append_lazily(held_frame(entry))
                held.append(entry)
                if blocks:
                    self._blocked[stream] = seq
        if deduplicated:  # before the deliveries: per stream the backend's duplicates are the lower seqs
            self.log.messages(Event.DEDUPLICATED, epoch, Direction.INBOUND, deduplicated, ts=answered)
        if delivered:
            self.log.messages(Event.DELIVERED, epoch, Direction.INBOUND, delivered, ts=answered)
            self.metrics.delivered.labels("inbound").inc(len(delivered))
        if held:
            for entry in held:
                self.log.messages(
                    Event.HELD, epoch, Direction.INBOUND, [entry.message], attempt=entry.attempts
                )
            for entry in held:
                logger.error("inbound stream %r seq %d held: %s", entry.stream, entry.seq, entry.last_error)
            self.refresh_hold_metrics()
        return taken

    def refresh_hold_metrics(self) -> None:
        self.metrics.held.labels("inbound").set(len(self.holds))
        self.metrics.blocked_streams.labels("inbound").set(len(self._blocked))

    def replay(self, stream: str, seq: int) -> HeldEntry | None:
        entry = self.holds.pop(stream, seq)
        if entry is not None:
            if self._blocked.get(stream) == seq:
                del self._blocked[stream]
            self._retry_at.pop(stream, None)
            self._wake.set()
            self.refresh_hold_metrics()
        return entry

    async def discard(self, stream: str, seq: int) -> HeldEntry | None:
        """Drop a held inbound message for good: confirm it to the cloud, which then forgets it."""
        entry = self.holds.get(stream, seq)
        if entry is None:
            return None
        await self.relay.confirm_inbound(self._epoch(), [[stream, seq]])
        self.holds.pop(stream, seq)
        if self._blocked.get(stream) == seq:
            del self._blocked[stream]
        self._wake.set()
        self.refresh_hold_metrics()
        return entry
