"""The broker's state machine: Inactive, Active, Unavailable, switched only by the Heartbeat.

This is the heartbeat contract of ARCHITECTURE.md, carried out:

* ``active=true, epoch=e`` (``renewLease`` absent or true): below the stored
  epoch is ``Unavailable / STALE_EPOCH`` and changes nothing. Otherwise ``e``
  is stored durably first, then an inactive broker activates synchronously
  (the heartbeat answers only when it is done): probe the cloud, send the
  resend request to the backend, apply its cursors, start the forwarders and
  the cloud poller, accept bundles. A failed step answers ``Unavailable`` with
  its code and leaves the broker inactive. Every accepted call renews the
  lease, counted from the moment its handler started (never later than the
  operator's own count, which starts when it sees the answer).
* ``active=true, renewLease=false``: a pure check of the active. It answers
  ``Active`` only while the broker is Active, in lease and not stalled; it
  activates, stores and renews nothing and does not wait for the heartbeat
  lock, so a check never queues behind an activation and a late copy of it
  cannot extend a lease the operator is waiting out.
* ``active=false``: stop accepting and polling, drain in-flight bundles and
  confirmations (bounded), answer ``Inactive``.
* Self-fencing: an Active broker deactivates itself when its lease runs out,
  when a target reports a higher epoch (another broker is active), or when its
  event loop was stalled (SIGSTOP, a VM pause, a long GC) for longer than the
  lease margin, ``max(0.25 s, 10 % of the lease)``, the slack the operator
  allows on top of the lease. A stall is seen by the lease watcher (the gap
  between two of its ticks) or, if a request got scheduled before the watcher
  after the loop resumed, by that request's handler; a renewing heartbeat or a
  bundle handled then is refused instead of acted on, since it may have sat in
  the socket buffer since before the operator's fence. Once fenced at stored
  epoch ``e``, only an ``active=true`` with an epoch above ``e`` activates the
  broker again (``LEASE_EXPIRED``): the operator gives every new activation
  ``epoch+1``, and a copy of an old renewal must not revive the fenced term.
  ``active=false`` does not create that restriction; it lives in memory only
  (a restarted broker starts Inactive anyway).

Heartbeats and deactivation are serialized by one lock, so activation and
draining never interleave. A self-fence does not wait for it: it stops the
broker being Active at once (synchronously) and leaves the drain to a task
that takes the lock; a heartbeat that gets the lock first finishes that drain
before it does anything else. ``SendMessages`` does not take the lock (it is
the hot path); it checks the state, the lease and the stall on entry, and
deactivation waits for the bundles already past that check to be journaled,
so every acknowledged message is durable. A ``Duplicate`` is an
acknowledgement too: a bundle whose duplicates name seqs still being
journaled by another bundle answers only once the journal has them.

Not here: parsing SOAP (:mod:`broker_service.soap_codec`), HTTP
(:mod:`broker_service.server`), and the outbound/inbound delivery loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import NoReturn

from broker_contracts.message_log import Direction, Event
from broker_contracts.soap import BrokerState, FaultCode, UnavailabilityCode
from broker_service.epoch_store import EpochStore, EpochStoreError
from broker_service.forwarder import OutboundForwarder
from broker_service.holds import HeldEntry, Release
from broker_service.inbound import InboundPoller
from broker_service.journal import (
    Journal,
    JournalError,
    bundle_frame,
    confirmed_frame,
    recover,
    released_frame,
)
from broker_service.message_log_writer import MessageLogWriter
from broker_service.metrics import BrokerMetrics
from broker_service.outbound import OutboundTable
from broker_service.relay_client import RelayClient, StaleEpochError, TargetUnreachableError
from broker_service.settings import BrokerSettings
from broker_service.soap_codec import AcceptResult, HeartbeatRequest, SendMessagesRequest, SoapFaultError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeartbeatReply:
    state: BrokerState
    epoch: int
    code: str | None = None
    message: str | None = None


class Broker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.metrics = BrokerMetrics()
        self.state = BrokerState.INACTIVE
        self.epochs = EpochStore(settings.data_dir)
        self.metrics.epoch.set(self.epochs.value)
        self.journal_error: str | None = None
        self.message_log = MessageLogWriter(
            settings.message_log_dir,
            cluster=settings.cluster,
            broker=settings.name,
            account=settings.account,
            company=settings.company,
            max_bytes=settings.segment_max_bytes,
            max_seconds=settings.segment_max_seconds,
        )
        self.relay = RelayClient(
            backend_url=settings.backend_url,
            cloud_url=settings.cloud_url,
            broker_name=settings.name,
            timeout_seconds=settings.relay_timeout_seconds,
        )
        self._lock = asyncio.Lock()
        self._lease_deadline = 0.0
        # Stall detection: the lease watcher's period, the gap between two of its ticks beyond
        # which the event loop counts as stalled (a tick plus the lease margin), the time of
        # its last tick, and the last stall it found (when, and how long).
        self._tick = settings.lease_tick_seconds
        self._stall_limit = settings.lease_margin_seconds
        self._stalled_after = self._tick + self._stall_limit
        self._last_tick = time.monotonic()
        self._stall_seen_at = -math.inf
        self._stall_seconds = 0.0
        # The stored epoch at which this broker last fenced itself, and why: only a higher
        # epoch activates it again. None once a higher epoch has activated it.
        self._fenced_epoch: int | None = None
        self._fence_reason = ""
        # A deactivation whose first half (stop being Active) is done and whose drain is not.
        self._pending_drain: str | None = None
        self._accepting = 0
        self._accepts_idle = asyncio.Event()
        self._accepts_idle.set()
        self._shutting_down = False
        self._background: list[asyncio.Task[None]] = []
        self._drains: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        self.outbound = OutboundTable(
            max_deliveries=settings.max_deliveries,
            on_poison=settings.on_poison,
            retry_base_seconds=settings.retry_base_seconds,
            retry_max_seconds=settings.retry_max_seconds,
            schedule=loop.call_later,
            on_ready=self._wake_forwarder,
        )
        self.journal = Journal(
            settings.data_dir / "journal",
            rotate_bytes=settings.journal_rotate_bytes,
            snapshot=self._snapshot_frames,
        )
        self.forwarder = OutboundForwarder(
            settings=settings,
            table=self.outbound,
            relay=self.relay,
            journal=self.journal,
            message_log=self.message_log,
            metrics=self.metrics,
            epoch=lambda: self.epochs.value,
            fence=self.fence,
        )
        self.inbound = InboundPoller(
            settings=settings,
            relay=self.relay,
            journal=self.journal,
            message_log=self.message_log,
            metrics=self.metrics,
            epoch=lambda: self.epochs.value,
            fence=self.fence,
        )

    def _wake_forwarder(self) -> None:
        self.forwarder.wake()

    def _snapshot_frames(self) -> list[bytes]:
        """What a compacted journal starts with: the outbound table, then the inbound holds."""
        return self.outbound.snapshot_frames() + self.inbound.snapshot_frames()

    @property
    def epoch(self) -> int:
        return self.epochs.value

    @property
    def ready(self) -> bool:
        """``/readyz``: the process is up and its journal is open (independent of Active)."""
        return self.journal.is_open and self.journal_error is None and not self._shutting_down

    # ---- process lifetime --------------------------------------------------------------------

    async def start(self) -> None:
        """Recover the journal and open it; a damaged journal leaves the broker up but not ready."""
        await self.relay.start()
        self.message_log.start()
        try:
            recovered, last_number = await asyncio.to_thread(recover, self.settings.data_dir / "journal")
            self.outbound.load(recovered)
            self.inbound.load(recovered.holds)
            self.forwarder.refresh_hold_metrics()
            self.journal.open(last_number)
            if recovered.torn_bytes:
                logger.warning(
                    "journal: cut a torn tail of %d bytes (never acknowledged)", recovered.torn_bytes
                )
            logger.info(
                "journal recovered: %d records, %d unconfirmed messages in %d streams, %d held",
                recovered.records,
                self.outbound.unconfirmed_count,
                len(self.outbound.streams),
                len(self.outbound.holds) + len(self.inbound.holds),
            )
        except (JournalError, OSError) as error:
            self.journal_error = str(error)
            logger.error("journal cannot be used; this broker will refuse activation: %s", error)
        loop = asyncio.get_running_loop()
        self._last_tick = time.monotonic()  # recovery may have taken long; that was no stall
        self._background.append(loop.create_task(self._watch_lease(), name="lease-watch"))

    async def stop(self) -> None:
        """SIGTERM: deactivate and drain, then close everything."""
        self._shutting_down = True
        async with self._lock:
            if self.state is BrokerState.ACTIVE:
                await self._deactivate("the broker is shutting down (SIGTERM)")
            else:
                await self._finish_deactivation()
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.journal.close()
        self.message_log.close_segment()
        await self.relay.close()

    # ---- heartbeat ---------------------------------------------------------------------------

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatReply:
        started = time.monotonic()
        if not request.active:
            async with self._lock:
                reply = await self._heartbeat_locked(request, started)
        elif not request.renew_lease:
            reply = self._check(request, started)
        elif stalled := self._stalled_for(started):
            # Before anything else: this call may have sat in the socket buffer through the stall.
            reply = self._refuse_stalled(stalled)
        else:
            if self.state is BrokerState.ACTIVE and started > self._lease_deadline:
                # The watcher has not run yet; the lease is over all the same.
                self._self_fence(self._lease_expired_reason())
            async with self._lock:
                reply = await self._heartbeat_locked(request, started)
        self.metrics.heartbeats.labels(reply.state.value).inc()
        return reply

    def _unavailable(self, code: UnavailabilityCode, message: str) -> HeartbeatReply:
        return HeartbeatReply(BrokerState.UNAVAILABLE, self.epoch, code.value, message)

    def _journal_unusable(self) -> HeartbeatReply | None:
        if self.journal_error or not self.journal.is_open:
            detail = self.journal_error or (
                str(self.journal.failure) if self.journal.failure else "journal not open"
            )
            return self._unavailable(UnavailabilityCode.JOURNAL_ERROR, detail[:500])
        return None

    def _stale(self, epoch: int) -> HeartbeatReply | None:
        if epoch < self.epoch:
            return self._unavailable(
                UnavailabilityCode.STALE_EPOCH,
                f"heartbeat epoch {epoch} is below this broker's stored epoch {self.epoch}; "
                "a newer operator decision exists",
            )
        return None

    def _fenced_term(self, epoch: int) -> HeartbeatReply | None:
        """``LEASE_EXPIRED`` for an ``active=true`` that would revive the term this broker fenced."""
        fenced = self._fenced_epoch
        if fenced is None or epoch > fenced:
            return None
        return self._unavailable(
            UnavailabilityCode.LEASE_EXPIRED,
            f"this broker deactivated itself at epoch {fenced} ({self._fence_reason}); epoch {epoch} "
            f"cannot make it Active again: activate it with an epoch above {fenced}",
        )

    async def _heartbeat_locked(self, request: HeartbeatRequest, started: float) -> HeartbeatReply:  # noqa: PLR0911
        # A self-fence's drain goes first: a new term never starts on top of the old one's work.
        await self._finish_deactivation()
        if not request.active:
            if self.state is BrokerState.ACTIVE:
                await self._deactivate(f"heartbeat active=false from operator {request.operator_id!r}")
            if request.epoch > self.epoch:
                with contextlib.suppress(EpochStoreError):
                    self._store_epoch(request.epoch)
            if self.journal_error:
                return self._unavailable(UnavailabilityCode.JOURNAL_ERROR, self.journal_error[:500])
            return HeartbeatReply(BrokerState.INACTIVE, self.epoch)

        if self._shutting_down:
            return self._unavailable(UnavailabilityCode.SHUTTING_DOWN, "the broker is shutting down")
        # A broken journal is named before a fenced term: it is why a journal failure fenced it.
        if (
            refusal := self._stale(request.epoch)
            or self._journal_unusable()
            or self._fenced_term(request.epoch)
        ):
            return refusal
        if request.epoch > self.epoch:
            previous = self.epoch
            try:
                self._store_epoch(request.epoch)
            except EpochStoreError as error:
                return self._unavailable(UnavailabilityCode.JOURNAL_ERROR, str(error))
            if self.state is BrokerState.ACTIVE:
                # Active already, now under a higher epoch: the log shows one term ending and the
                # next beginning, so the validator sees who was active with which epoch.
                self.message_log.lifecycle(Event.DEACTIVATED, previous)
                self.message_log.lifecycle(Event.ACTIVATED, request.epoch)
        if self.state is not BrokerState.ACTIVE:
            failure = await self._activate()
            if failure is not None:
                return failure
        self._fenced_epoch = None  # an epoch above the fenced one is Active now
        # Counted from when this call started to be handled: the operator counts from when it
        # saw the answer, which is later, so the broker's lease always ends first.
        self._lease_deadline = max(self._lease_deadline, started + self.settings.lease_seconds)
        return HeartbeatReply(BrokerState.ACTIVE, self.epoch)

    def _check(self, request: HeartbeatRequest, now: float) -> HeartbeatReply:
        """``active=true, renewLease=false``: is this broker Active? Changes nothing but a due fence."""
        if self._shutting_down:
            return self._unavailable(UnavailabilityCode.SHUTTING_DOWN, "the broker is shutting down")
        if refusal := self._stale(request.epoch) or self._journal_unusable():
            return refusal
        if self.state is BrokerState.ACTIVE:
            if stalled := self._stalled_for(now):
                return self._refuse_stalled(stalled)
            if now > self._lease_deadline:
                self._self_fence(self._lease_expired_reason())
            else:
                return HeartbeatReply(BrokerState.ACTIVE, self.epoch)
        return self._fenced_term(request.epoch) or HeartbeatReply(BrokerState.INACTIVE, self.epoch)

    def _stalled_for(self, now: float) -> float:
        """How long the event loop was stalled, if a call handled ``now`` may have waited it out; else 0.

        Either the watcher has not ticked since the loop resumed (this handler got scheduled
        first), or it found a stall less than one tick ago: what queued up in the socket
        buffers during a stall is read in the loop's first iterations after it.
        """
        gap = now - self._last_tick
        if gap > self._stalled_after:
            return gap
        if now - self._stall_seen_at <= self._tick:
            return self._stall_seconds
        return 0.0

    def _stall_reason(self, stalled: float) -> str:
        return (
            f"event loop stalled for {stalled:.2f}s, longer than the lease margin of {self._stall_limit:g}s"
        )

    def _lease_expired_reason(self) -> str:
        return f"lease expired: no active=true heartbeat for {self.settings.lease_seconds:g}s"

    def _refuse_stalled(self, stalled: float) -> HeartbeatReply:
        reason = self._stall_reason(stalled)
        if self.state is BrokerState.ACTIVE:
            self._self_fence(reason)
            outcome = (
                f"the broker deactivated itself at epoch {self.epoch}: activate it with an epoch "
                f"above {self.epoch}"
            )
        else:
            outcome = "nothing changed"
        return self._unavailable(
            UnavailabilityCode.EVENT_LOOP_STALLED,
            f"{reason} when this call was handled; a call that waited that long may be older than "
            f"the operator's fence, so it was not acted on; {outcome}",
        )

    def _store_epoch(self, epoch: int) -> None:
        self.epochs.store(epoch)
        self.metrics.epoch.set(epoch)

    async def _activate(self) -> HeartbeatReply | None:
        epoch = self.epoch
        try:
            await self.relay.cloud_ready(epoch)
        except StaleEpochError as error:
            return self._unavailable(UnavailabilityCode.STALE_EPOCH, str(error))
        except TargetUnreachableError as error:
            return self._unavailable(UnavailabilityCode.CLOUD_UNREACHABLE, str(error))
        try:
            cursors = await self.relay.request_resend(epoch, self.settings.account, self.settings.company)
        except StaleEpochError as error:
            return self._unavailable(UnavailabilityCode.STALE_EPOCH, str(error))
        except TargetUnreachableError as error:
            return self._unavailable(UnavailabilityCode.BACKEND_UNREACHABLE, str(error))
        moved = self.outbound.apply_resend_cursors(cursors)
        if moved:
            self.journal.append_lazily(confirmed_frame(moved))
        self.state = BrokerState.ACTIVE
        self.metrics.active.set(1)
        self.message_log.lifecycle(Event.ACTIVATED, epoch)
        self.forwarder.start()
        self.inbound.start()
        logger.info("activated with epoch %d (%d streams known from the backend)", epoch, len(cursors))
        return None

    def _stop_accepting(self, reason: str) -> None:
        """The first half of a deactivation, synchronous: no longer Active from this instant."""
        self.state = BrokerState.INACTIVE
        self.metrics.active.set(0)
        self._pending_drain = reason

    async def _finish_deactivation(self) -> None:
        """The second half, under the lock: drain in-flight work within ``drain_seconds``."""
        reason = self._pending_drain
        if reason is None:
            return
        self._pending_drain = None
        drain = self.settings.drain_seconds
        # Bundles past the state check finish journaling, so their acknowledgements stay true.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._accepts_idle.wait(), timeout=drain)
        await asyncio.gather(self.inbound.stop(drain), self.forwarder.stop(drain))
        self.message_log.lifecycle(Event.DEACTIVATED, self.epoch)
        self.message_log.close_segment()
        logger.info("deactivated (epoch %d): %s", self.epoch, reason)

    async def _deactivate(self, reason: str) -> None:
        """Stop accepting and polling; drain in-flight work within ``drain_seconds`` (under the lock)."""
        self._stop_accepting(reason)
        await self._finish_deactivation()

    def fence(self, reason: str) -> None:
        """A target saw a higher epoch, or the journal failed: deactivate without waiting for anyone."""
        self._self_fence(reason)

    def _self_fence(self, reason: str) -> None:
        """Stop being Active now, remember the fenced epoch, and drain in a task under the lock."""
        if self.state is not BrokerState.ACTIVE:
            return
        self._fenced_epoch = self.epoch
        self._fence_reason = reason
        logger.warning("fencing itself at epoch %d: %s", self.epoch, reason)
        self._stop_accepting(reason)
        task = asyncio.get_running_loop().create_task(self._drain_after_fence(), name="fence-drain")
        # The loop keeps only weak references to tasks; hold this one until it is done.
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _drain_after_fence(self) -> None:
        async with self._lock:
            await self._finish_deactivation()

    async def _watch_lease(self) -> None:
        """Every tick: find stalls and run-out leases, and close a message-log segment that is due.

        Kept to a few comparisons: it runs every 100 ms (or lease/10) on every broker.
        """
        tick = self._tick
        stalled_after = self._stalled_after
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            gap = now - self._last_tick
            self._last_tick = now
            if gap > stalled_after:
                self._stall_seen_at, self._stall_seconds = now, gap
                self.metrics.stalls.inc()
                logger.warning("the event loop was stalled for %.2fs (limit %.2fs)", gap, stalled_after)
                self._self_fence(self._stall_reason(gap))
            elif self.state is BrokerState.ACTIVE and now > self._lease_deadline:
                self._self_fence(self._lease_expired_reason())
            self.message_log.close_if_due()

    # ---- SendMessages ------------------------------------------------------------------------

    async def send_messages(self, request: SendMessagesRequest) -> tuple[int, list[AcceptResult]]:
        # The lease and the stall are checked here too, not only by the watcher: a broker resumed
        # after a pause (SIGSTOP, a VM stall) must not accept a single bundle on a lease that ran
        # out meanwhile, nor one that sat in the socket buffer through the pause.
        now = time.monotonic()
        if (
            self.state is not BrokerState.ACTIVE
            or now > self._lease_deadline
            or now - self._last_tick > self._stalled_after
        ):
            self._refuse_bundle(now)
        settings = self.settings
        if settings.pair_fixed and (request.account, request.company) != (settings.account, settings.company):
            raise SoapFaultError(
                FaultCode.WRONG_PAIR,
                f"bundle is for account {request.account!r} company {request.company!r}; this broker serves "
                f"account {settings.account!r} company {settings.company!r}",
            )
        results, accepted, indices, unsettled_duplicate = self.outbound.reserve(
            request.streams, request.seqs, request.msg_ids, request.payloads
        )
        if accepted or unsettled_duplicate:
            self._accepting += 1
            self._accepts_idle.clear()
            try:
                if accepted:
                    # Writes complete in order: this one also covers what a duplicate waits for.
                    await self.journal.append(bundle_frame(request.raw, indices))
                else:
                    await self.journal.flushed()
            except JournalError as error:
                self.journal_error = str(error)
                self.fence(f"journal failed: {error}")
                raise SoapFaultError(
                    FaultCode.JOURNAL_ERROR, f"journal write failed: {error}", client=False
                ) from None
            finally:
                self._accepting -= 1
                if not self._accepting:
                    self._accepts_idle.set()
        if accepted:
            self.outbound.commit(accepted)
            epoch = self.epoch
            self.message_log.messages(Event.ACCEPTED, epoch, Direction.OUTBOUND, accepted, first=True)
            self.metrics.accepted.inc(len(accepted))
        if len(accepted) != len(results):
            self._count_refusals(results)
        return self.epoch, results

    def _refuse_bundle(self, now: float) -> NoReturn:
        """``BROKER_INACTIVE``; an Active broker whose lease ran out or whose loop stalled fences itself."""
        if self.state is BrokerState.ACTIVE:
            if now > self._lease_deadline:
                self._self_fence(self._lease_expired_reason())
            else:
                self._self_fence(self._stall_reason(now - self._last_tick))
        raise SoapFaultError(
            FaultCode.BROKER_INACTIVE,
            f"broker {self.settings.name!r} is {self.state.value}, not Active; send to the active broker "
            f"(Service {self.settings.cluster}-active) and retry",
            client=False,
        )

    def _count_refusals(self, results: list[AcceptResult]) -> None:
        gaps = sum(1 for r in results if r[3] is not None)
        duplicates = sum(1 for r in results if r[2].value == "Duplicate")
        self.metrics.gaps.inc(gaps)
        self.metrics.duplicates.inc(duplicates)

    # ---- held messages -----------------------------------------------------------------------

    async def list_held(self, stream: str | None) -> list[HeldEntry]:
        """This broker's holds, once the journal has them: what it answers survives a kill -9.

        An inactive broker answers from its journal too: what it held when it was last active.
        Brokers do not share journals, so ask the active broker what is held now.
        """
        await self._journal_written("cannot list held messages")
        return self.outbound.holds.entries(stream) + self.inbound.holds.entries(stream)

    async def _journal_written(self, doing: str, record: bytes | None = None) -> None:
        """Wait until ``record`` (or what is queued so far) is on disk, or fault ``JOURNAL_ERROR``."""
        failure = self.journal_error or (None if self.journal.is_open else "journal not open")
        if failure is None:
            try:
                await (self.journal.append(record) if record is not None else self.journal.flushed())
                return
            except JournalError as error:
                failure = self.journal_error = str(error)
                self.fence(f"journal failed: {error}")
        raise SoapFaultError(
            FaultCode.JOURNAL_ERROR,
            f"{doing}: this broker's journal is not usable ({failure[:300]}); its holds are not known "
            "durably. Ask the active broker",
            client=False,
        )

    def _check_held_request(self, direction: str) -> None:
        if self.journal_error or not self.journal.is_open:
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

    async def replay_held(self, direction: str, stream: str, seq: int) -> HeldEntry:
        self._check_held_request(direction)
        if direction == Direction.OUTBOUND.value:
            entry = self.outbound.replay(stream, seq)
            self.forwarder.refresh_hold_metrics()
        else:
            entry = self.inbound.replay(stream, seq)
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
        self.message_log.messages(Event.REPLAYED, self.epoch, entry.direction, [entry.message])
        return entry

    async def discard_held(self, direction: str, stream: str, seq: int) -> HeldEntry:
        self._check_held_request(direction)
        if direction == Direction.OUTBOUND.value:
            entry = self.outbound.discard(stream, seq)
            if entry is not None:
                self.forwarder.mark_dirty(stream)
                self.forwarder.refresh_hold_metrics()
        else:
            try:
                entry = await self.inbound.discard(stream, seq)
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
        self.message_log.messages(Event.DISCARDED, self.epoch, entry.direction, [entry.message], final=True)
        return entry
