"""The broker process: runs the term state machine, performs its effects, and owns the parts.

:class:`Broker` is the one object the HTTP server talks to. It builds the parts (journal,
outbound table, forwarders, cloud poller, message log, relay client), recovers the journal
at start and drains at SIGTERM, and runs the heartbeat contract by driving the pure
:class:`~broker_service.term.TermMachine` (every rule lives there) and carrying out what it
decides: storing the epoch, activating (probe the cloud, ask the backend to resend, apply its
cursors), starting and draining the relays, message-log ``activated``/``deactivated`` records,
metrics and logs.

Concurrency is what this module adds to the rules. Heartbeats and deactivation are
serialized by one lock, so activation and draining never interleave. A check
(``renewLease=false``) does not wait for it, so it never queues behind an activation. A
self-fence (lease watcher, a target's higher epoch, a journal failure, a late bundle) does
not wait for it either: the term stops being Active at once and the drain runs in a task
that takes the lock; a heartbeat that gets the lock first finishes that drain before it does
anything else. A renewal is asked about stalls and the lease before it waits for the lock,
and its lease is counted from when its handler started. ``SendMessages`` does not take the
lock (:mod:`broker_service.send_messages`); the drain waits for the bundles already admitted.

Not here: the term rules (:mod:`broker_service.term`), bundles
(:mod:`broker_service.send_messages`), the admin operations on held messages
(:mod:`broker_service.held_admin`), parsing SOAP (:mod:`broker_service.soap_codec`), HTTP
and credentials (:mod:`broker_service.server`), the delivery loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from broker_contracts.soap import BrokerState, HeartbeatReply, UnavailabilityCode
from broker_service.epoch_store import EpochStore, EpochStoreError
from broker_service.forwarder import OutboundForwarder
from broker_service.held_admin import HeldAdmin
from broker_service.holds import HeldEntry
from broker_service.inbound import InboundPoller
from broker_service.journal import Journal, JournalError, confirmed_frame, recover
from broker_service.message_log_writer import MessageLogWriter
from broker_service.metrics import BrokerMetrics
from broker_service.outbound import OutboundTable
from broker_service.relay_client import RelayClient, StaleEpochError, TargetUnreachableError
from broker_service.send_messages import BundleIntake
from broker_service.settings import BrokerSettings
from broker_service.soap_codec import AcceptResult, HeartbeatRequest, SendMessagesRequest
from broker_service.target_credentials import relay_target
from broker_service.term import (
    Activate,
    Effect,
    HandoverRenewed,
    LogLifecycle,
    SelfFenced,
    StallSeen,
    StartRelaying,
    StopAccepting,
    StopRelaying,
    StoreEpoch,
    TermMachine,
)
from broker_service.upstream_tls import follow_upstream_trust, upstream_trust

__all__ = ["Broker", "HeartbeatReply"]

logger = logging.getLogger(__name__)


class Broker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.metrics = BrokerMetrics()
        self.epochs = EpochStore(settings.data_dir)
        self.metrics.epoch.set(self.epochs.value)
        self.term = TermMachine(
            lease_seconds=settings.lease_seconds,
            max_lease_seconds=settings.max_lease_cap_seconds,
            tick_seconds=settings.lease_tick_seconds,
            margin_seconds=settings.lease_margin_seconds,
            epoch=self.epochs.value,
            now=time.monotonic(),
        )
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
        # The targets' credentials are read (and checked) here; parse_settings checked them already.
        # So is the upstream trust (TlsFilesError if the file no longer loads).
        self.upstream_trust = upstream_trust(settings)
        self.relay = RelayClient(
            backend=relay_target(
                "backend",
                settings.backend_url,
                settings.backend_credentials_dir,
                flag="--backend-url",
                dir_flag="--backend-credentials-dir",
            ),
            cloud=relay_target(
                "cloud",
                settings.cloud_url,
                settings.cloud_credentials_dir,
                flag="--cloud-url",
                dir_flag="--cloud-credentials-dir",
            ),
            broker_name=settings.name,
            timeout_seconds=settings.relay_timeout_seconds,
            reply_limit_bytes=settings.relay_reply_limit_bytes,
            trust=self.upstream_trust,
        )
        self._lock = asyncio.Lock()
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
            epoch=lambda: self.term.epoch,
            may_relay=self.may_relay,
            fence=self.fence,
        )
        self.inbound = InboundPoller(
            settings=settings,
            relay=self.relay,
            journal=self.journal,
            message_log=self.message_log,
            metrics=self.metrics,
            epoch=lambda: self.term.epoch,
            may_relay=self.may_relay,
            fence=self.fence,
        )
        self.intake = BundleIntake(
            settings=settings,
            term=self.term,
            outbound=self.outbound,
            journal=self.journal,
            message_log=self.message_log,
            metrics=self.metrics,
            perform=self._perform_now,
            journal_failed=self._journal_failed,
        )
        self.held = HeldAdmin(
            outbound=self.outbound,
            inbound=self.inbound,
            forwarder=self.forwarder,
            journal=self.journal,
            message_log=self.message_log,
            epoch=lambda: self.term.epoch,
            journal_error=lambda: self.journal_error,
            journal_failed=self._journal_failed,
        )

    def _wake_forwarder(self) -> None:
        self.forwarder.wake()

    def _snapshot_frames(self) -> list[bytes]:
        """What a compacted journal starts with: the outbound table, then the inbound holds."""
        return self.outbound.snapshot_frames() + self.inbound.snapshot_frames()

    @property
    def epoch(self) -> int:
        return self.term.epoch

    @property
    def state(self) -> BrokerState:
        return self.term.state

    @property
    def ready(self) -> bool:
        """``/readyz``: the process is up and its journal is open (independent of Active)."""
        return self.journal.is_open and self.journal_error is None and not self.term.shutting_down

    @property
    def not_ready_code(self) -> UnavailabilityCode:
        """Why ``/readyz`` says not ready, as a code and nothing more: it answers anyone who
        reaches the port, and the journal's error (paths, errno) is for the log, where it went."""
        if self.term.shutting_down:
            return UnavailabilityCode.SHUTTING_DOWN
        return UnavailabilityCode.JOURNAL_ERROR

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
        self.term.watch_from(time.monotonic())  # recovery may have taken long; that was no stall
        self._background.append(loop.create_task(self._watch_lease(), name="lease-watch"))
        if self.upstream_trust is not None and self.settings.upstream_ca_file is not None:
            # Followed with or without TLS on the listeners: it is the trust of the broker's own calls.
            seconds = self.settings.tls_reload_seconds
            follow = follow_upstream_trust(self.upstream_trust, seconds, self.metrics)
            self._background.append(loop.create_task(follow, name="upstream-tls-files"))

    async def stop(self) -> None:
        """SIGTERM: deactivate and drain, then close everything."""
        self.term.begin_shutdown()
        async with self._lock:
            await self._perform(self.term.drain_due())
            await self._perform(self.term.deactivate("the broker is shutting down (SIGTERM)"))
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
        term = self.term
        if not request.active:
            async with self._lock:
                reply = await self._release(request)
        elif not request.renew_lease:
            answer = term.check(request.epoch, started, self._journal_problem())
            self._perform_now(answer.effects)
            assert answer.reply is not None  # a check always answers at once
            reply = answer.reply
        else:
            answer = term.renewal_arrives(started)
            self._perform_now(answer.effects)
            if answer.reply is not None:
                reply = answer.reply
            else:
                async with self._lock:
                    reply = await self._renew(request.epoch, started, request.lease_seconds)
        self.metrics.heartbeats.labels(reply.state.value).inc()
        return reply

    async def _release(self, request: HeartbeatRequest) -> HeartbeatReply:
        """``active=false``, under the lock: drain, store a higher epoch (best effort), answer."""
        term = self.term
        await self._perform(term.drain_due())
        answer = term.release(request.epoch, request.operator_id)
        await self._perform(answer.effects)
        if isinstance(answer.awaiting, StoreEpoch):
            with contextlib.suppress(EpochStoreError):
                await self._store_epoch(answer.awaiting.epoch)
        return term.standby_reply(self.journal_error)

    async def _renew(self, epoch: int, started: float, lease_seconds: float | None) -> HeartbeatReply:
        """A renewing ``active=true``, under the lock: store the epoch, activate if inactive, renew.

        ``lease_seconds`` (a handover renewal's) counts only for a renewal of the Active term.
        """
        term = self.term
        # A self-fence's drain goes first: a new term never starts on top of the old one's work.
        await self._perform(term.drain_due())
        answer = term.renew(epoch, started, self._journal_problem(), lease_seconds=lease_seconds)
        if isinstance(answer.awaiting, StoreEpoch):
            try:
                await self._store_epoch(answer.awaiting.epoch)
            except EpochStoreError as error:
                return term.epoch_not_stored(str(error))
            answer = term.proceed(started)
        if isinstance(answer.awaiting, Activate):
            failure = await self._activate(answer.awaiting.epoch)
            answer = term.activated(started) if failure is None else term.activation_failed(*failure)
        self._perform_now(answer.effects)
        assert answer.reply is not None  # nothing is awaited any more
        return answer.reply

    def _journal_problem(self) -> str | None:
        """Why the journal cannot take a new term's work, or None if it can."""
        if self.journal_error or not self.journal.is_open:
            return self.journal_error or (
                str(self.journal.failure) if self.journal.failure else "journal not open"
            )
        return None

    async def _store_epoch(self, epoch: int) -> None:
        began = time.monotonic()
        # Two fsyncs, in a worker thread: on a slow or busy volume they can take longer than the
        # lease margin, and in the loop that would read as a stall and fence this broker (the
        # heartbeat lock keeps heartbeats waiting meanwhile; bundles and the watcher go on).
        await asyncio.to_thread(self.epochs.store, epoch)
        # The failover benchmark reads this line for the hop.
        logger.info("stored epoch %d in %.1f ms", epoch, (time.monotonic() - began) * 1000)
        self.metrics.epoch.set(epoch)
        self._perform_now(self.term.epoch_stored(epoch))

    async def _activate(self, epoch: int) -> tuple[UnavailabilityCode, str] | None:
        """Probe the cloud and ask the backend to resend, at once; apply its cursors; the code if
        either failed (the cloud's first). Concurrent because a failover waits on both round trips
        and neither depends on the other: whichever fails, both targets may have seen the epoch,
        as with one after the other, and the next activation uses a new one anyway."""
        began = time.monotonic()
        cloud, backend = await asyncio.gather(
            self.relay.cloud_ready(epoch),
            self.relay.request_resend(epoch, self.settings.account, self.settings.company),
            return_exceptions=True,
        )
        for outcome, unreachable in (
            (cloud, UnavailabilityCode.CLOUD_UNREACHABLE),
            (backend, UnavailabilityCode.BACKEND_UNREACHABLE),
        ):
            if isinstance(outcome, StaleEpochError):
                return UnavailabilityCode.STALE_EPOCH, str(outcome)
            if isinstance(outcome, TargetUnreachableError):
                return unreachable, str(outcome)
            if isinstance(outcome, BaseException):
                raise outcome
        cursors = backend
        assert not isinstance(cursors, BaseException)
        moved = self.outbound.apply_resend_cursors(cursors)
        if moved:
            self.journal.append_lazily(confirmed_frame(moved))
        logger.info(
            "activated with epoch %d (%d streams known from the backend; both targets told in %.0f ms)",
            epoch,
            len(cursors),
            (time.monotonic() - began) * 1000,
        )
        return None

    # ---- fencing, the lease watcher, effects ---------------------------------------------------

    def may_relay(self) -> bool:
        """Asked by the relays right before each call to a target (:meth:`TermMachine.may_relay`).

        An Active broker whose lease ran out or whose loop stalled fences itself here at once,
        rather than at the lease watcher's next tick, which may come after the relays' turn.
        """
        now = time.monotonic()
        if self.term.may_relay(now):
            return True
        self._perform_now(self.term.refuse_bundle(now))
        return False

    def fence(self, reason: str) -> None:
        """A target saw a higher epoch, or the journal failed: deactivate without waiting for anyone."""
        self._perform_now(self.term.fence(reason))

    def _journal_failed(self, error: str) -> None:
        self.journal_error = error
        self.fence(f"journal failed: {error}")

    async def _watch_lease(self) -> None:
        """Every tick: the term's stall and lease check, and close a message-log segment that is due.

        Kept to a few comparisons: it runs every 100 ms (or lease/10) on every broker.
        """
        tick = self.term.tick_seconds
        while True:
            await asyncio.sleep(tick)
            if effects := self.term.tick(time.monotonic()):
                self._perform_now(effects)
            self.message_log.close_if_due()

    async def _drain_after_fence(self) -> None:
        async with self._lock:
            await self._perform(self.term.drain_due())

    async def _perform(self, effects: tuple[Effect, ...]) -> None:
        """Carry out the term's effects in order, the drain included (call it under the lock)."""
        for effect in effects:
            if isinstance(effect, StopRelaying):
                drain = self.settings.drain_seconds
                # Bundles past the admission check finish journaling, so their acknowledgements stay true.
                await self.intake.idle(drain)
                await asyncio.gather(self.inbound.stop(drain), self.forwarder.stop(drain))
                logger.info("deactivated (epoch %d): %s", effect.epoch, effect.reason)
            else:
                self._perform_now((effect,))

    def _perform_now(self, effects: tuple[Effect, ...]) -> None:
        """Carry out the term's synchronous effects (everything but a drain) in order."""
        for effect in effects:
            if isinstance(effect, LogLifecycle):
                self.message_log.lifecycle(effect.event, effect.epoch)
                if effect.close_segment:
                    self.message_log.close_segment()
            elif isinstance(effect, StartRelaying):
                self.metrics.active.set(1)
                self.forwarder.start()
                self.inbound.start()
            elif isinstance(effect, StopAccepting):
                self.metrics.active.set(0)
            elif isinstance(effect, SelfFenced):
                logger.warning("fencing itself at epoch %d: %s", effect.epoch, effect.reason)
                task = asyncio.get_running_loop().create_task(self._drain_after_fence(), name="fence-drain")
                # The loop keeps only weak references to tasks; hold this one until it is done.
                self._drains.add(task)
                task.add_done_callback(self._drains.discard)
            elif isinstance(effect, HandoverRenewed):
                # Once per handover: a stopping operator sends one such renewal.
                logger.info(
                    "lease extended to %g s by a handover renewal at epoch %d", effect.seconds, effect.epoch
                )
            elif isinstance(effect, StallSeen):
                self.metrics.stalls.inc()
                logger.warning(
                    "the event loop was stalled for %.2fs (limit %.2fs)", effect.seconds, effect.limit
                )
            else:  # StoreEpoch, Activate and StopRelaying are awaited where the term asks for them
                raise AssertionError(f"effect {effect!r} cannot be carried out synchronously")

    # ---- SendMessages and held messages: their own modules -------------------------------------

    async def send_messages(self, request: SendMessagesRequest) -> tuple[int, list[AcceptResult]]:
        return await self.intake.send_messages(request)

    async def list_held(self, stream: str | None) -> list[HeldEntry]:
        return await self.held.list_held(stream)

    async def replay_held(self, direction: str, stream: str, seq: int) -> HeldEntry:
        return await self.held.replay_held(direction, stream, seq)

    async def discard_held(self, direction: str, stream: str, seq: int) -> HeldEntry:
        return await self.held.discard_held(direction, stream, seq)
