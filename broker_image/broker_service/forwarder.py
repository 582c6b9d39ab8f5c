"""Outbound delivery: forwards durable messages to the cloud and confirms them to the backend.

Two kinds of tasks run while the broker is Active:

* ``forward_concurrency`` forwarding workers. Each takes a bundle across
  streams from the :class:`~broker_service.outbound.OutboundTable` (a stream
  is never in two bundles at once, so order holds with several in flight),
  posts it to the cloud, and settles the per-message answers. Bundles grow
  naturally under load: whatever queued while the previous one was in flight
  goes in the next, up to ``forward_bundle_max``.
* One confirmer. It coalesces every stream whose confirmation watermark moved
  and sends them to the backend in one call; only after the backend answers
  are the messages forgotten (and a ``C`` record journaled, lazily: losing it
  only means the backend resends and the cloud drops the duplicates).

A stale-epoch answer from either target means another broker is active; the
loops stop and ask the lifecycle to fence (deactivate) this broker. Transport
failures are retried with capped exponential backoff and never count as
delivery attempts.

This module does not decide when to run; :mod:`broker_service.lifecycle`
starts it on activation and drains it on deactivation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from broker_contracts.message_log import Direction, Event
from broker_service.holds import HeldEntry
from broker_service.journal import Journal, JournalMessage, confirmed_frame, held_frame
from broker_service.message_log_writer import MessageLogWriter, answer_ts, now_ts
from broker_service.metrics import BrokerMetrics
from broker_service.outbound import Bundle, OutboundTable
from broker_service.relay_client import RelayClient, StaleEpochError, TargetUnreachableError
from broker_service.settings import BrokerSettings

logger = logging.getLogger(__name__)


class OutboundForwarder:
    def __init__(
        self,
        *,
        settings: BrokerSettings,
        table: OutboundTable,
        relay: RelayClient,
        journal: Journal,
        message_log: MessageLogWriter,
        metrics: BrokerMetrics,
        epoch: Callable[[], int],
        may_relay: Callable[[], bool],
        fence: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.table = table
        self.relay = relay
        self.journal = journal
        self.log = message_log
        self.metrics = metrics
        self._epoch = epoch
        self._may_relay = may_relay
        self._fence = fence
        self._ready = asyncio.Event()
        self._dirty: set[str] = set()
        self._dirty_event = asyncio.Event()
        self._running = False
        self._workers: list[asyncio.Task[None]] = []
        self._confirmer: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """The table has ready streams (called by the table)."""
        self._ready.set()

    def start(self) -> None:
        self._running = True
        self._ready.set()
        loop = asyncio.get_running_loop()
        self._workers = [
            loop.create_task(self._forward_loop(), name=f"forwarder-{i}")
            for i in range(self.settings.forward_concurrency)
        ]
        self._confirmer = loop.create_task(self._confirm_loop(), name="confirmer")
        # Watermarks that moved while we were inactive (e.g. a discard) go out first.
        self._dirty.update(self.table.streams)
        self._dirty_event.set()

    async def stop(self, drain_seconds: float) -> None:
        """Finish in-flight bundles and send pending confirmations, within ``drain_seconds``."""
        self._running = False
        self._ready.set()
        self._dirty_event.set()
        tasks = [*self._workers, *([self._confirmer] if self._confirmer else [])]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_seconds)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._workers, self._confirmer = [], None
        self.table.reset_in_flight()

    def _backoff(self, failures: int) -> float:
        return min(self.settings.retry_max_seconds, self.settings.retry_base_seconds * 2 ** min(failures, 10))

    async def _forward_loop(self) -> None:
        failures = 0
        table = self.table
        while self._running:
            if not table.ready:
                self._ready.clear()
                await self._ready.wait()
                continue
            bundle = table.take_bundle(self.settings.forward_bundle_max)
            if not bundle:
                continue
            checked = now_ts()  # taken before the check: the records say when the term was last held
            if not self._may_relay():
                table.release(bundle)
                return  # fenced or deactivated: the next active broker's resend covers the rest
            epoch = self._epoch()
            wire = [m for _, messages in bundle for m in messages]
            self._log_forwarded(epoch, bundle, wire, checked)
            try:
                reply = await self.relay.forward_outbound(epoch, wire)
            except StaleEpochError as error:
                table.release(bundle)
                self._fence(str(error))
                return
            except TargetUnreachableError as error:
                table.release(bundle)
                self.metrics.relay_failures.labels("cloud").inc()
                failures += 1
                logger.warning(
                    "cloud bundle of %d messages failed (retry %d): %s", len(wire), failures, error
                )
                await asyncio.sleep(self._backoff(failures))
                continue
            except BaseException:
                table.release(bundle)
                raise
            failures = 0
            outcome = table.settle(bundle, reply["results"], reply["reasons"])
            answered = answer_ts(self._may_relay, checked, "cloud")
            # Duplicates first: per stream the cloud answers them for the lower seqs, so the log
            # keeps the order in which the cloud had the messages.
            if outcome.deduplicated:
                self.log.messages(
                    Event.DEDUPLICATED, epoch, Direction.OUTBOUND, outcome.deduplicated, ts=answered
                )
            if outcome.delivered:
                self.log.messages(Event.DELIVERED, epoch, Direction.OUTBOUND, outcome.delivered, ts=answered)
            self.metrics.delivered.labels("outbound").inc(len(outcome.delivered))
            if outcome.rejected:
                self.metrics.rejected.labels("outbound").inc(outcome.rejected)
            if outcome.held:
                self._record_held(epoch, outcome.held)
            self._dirty.update(stream.name for stream, _ in bundle)
            self._dirty_event.set()

    def _log_forwarded(self, epoch: int, bundle: Bundle, wire: list[JournalMessage], ts: str) -> None:
        """One ``forwarded`` record per message with its attempt number; one log call per bundle
        in the common case (every stream on its first attempt) rather than one per stream."""
        if not any(stream.attempts for stream, _ in bundle):
            self.log.messages(Event.FORWARDED, epoch, Direction.OUTBOUND, wire, attempt=1, ts=ts)
            return
        for stream, messages in bundle:
            self.log.messages(
                Event.FORWARDED, epoch, Direction.OUTBOUND, messages, attempt=stream.attempts + 1, ts=ts
            )

    def _record_held(self, epoch: int, held: list[HeldEntry]) -> None:
        # Journaled in the same step as the table took them (a snapshot in between cannot miss
        # them); ListHeld waits for the journal, so what it shows survives a crash.
        for entry in held:
            self.journal.append_lazily(held_frame(entry))
        for entry in held:
            self.log.messages(Event.HELD, epoch, Direction.OUTBOUND, [entry.message], attempt=entry.attempts)
        for entry in held:
            logger.error(
                "outbound stream %r seq %d held after %d deliveries (%s): %s",
                entry.stream,
                entry.seq,
                entry.attempts,
                self.settings.on_poison.value,
                entry.last_error,
            )
        self.refresh_hold_metrics()

    def refresh_hold_metrics(self) -> None:
        self.metrics.held.labels("outbound").set(len(self.table.holds))
        self.metrics.blocked_streams.labels("outbound").set(
            sum(1 for s in self.table.streams.values() if s.blocked)
        )

    def mark_dirty(self, stream: str) -> None:
        self._dirty.add(stream)
        self._dirty_event.set()

    async def _confirm_loop(self) -> None:
        failures = 0
        while True:
            if not self._dirty:
                if not self._running:
                    return
                self._dirty_event.clear()
                await self._dirty_event.wait()
                continue
            names, self._dirty = self._dirty, set()
            marks = self.table.watermarks(names)
            if not marks:
                continue
            checked = now_ts()
            if not self._may_relay():
                self._dirty.update(marks)
                return  # fenced or deactivated: the backend resends what it has no confirmation of
            epoch = self._epoch()
            try:
                await self.relay.confirm_outbound(epoch, marks)
            except StaleEpochError as error:
                self._fence(str(error))
                return
            except TargetUnreachableError as error:
                self._dirty.update(marks)
                self.metrics.relay_failures.labels("backend").inc()
                failures += 1
                if not self._running:
                    return  # draining: the next active broker's resend covers these
                logger.warning("confirming %d streams to the backend failed: %s", len(marks), error)
                await asyncio.sleep(self._backoff(failures))
                continue
            failures = 0
            done = self.table.confirmed(marks)
            self.journal.append_lazily(confirmed_frame(marks))
            if done:
                self.log.messages(Event.CONFIRMED, epoch, Direction.OUTBOUND, done, final=True, ts=checked)
                self.metrics.confirmed.labels("outbound").inc(len(done))
