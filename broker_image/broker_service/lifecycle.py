"""The broker's state machine: Inactive, Active, Unavailable, switched only by the Heartbeat.

This is the heartbeat contract of ARCHITECTURE.md, carried out:

* ``active=true, epoch=e``: below the stored epoch is ``Unavailable /
  STALE_EPOCH`` and changes nothing. Otherwise ``e`` is stored durably first,
  then an inactive broker activates synchronously (the heartbeat answers only
  when it is done): probe the cloud, send the resend request to the backend,
  apply its cursors, start the forwarders and the cloud poller, accept
  bundles. A failed step answers ``Unavailable`` with its code and leaves the
  broker inactive. Every accepted call renews the lease.
* ``active=false``: stop accepting and polling, drain in-flight bundles and
  confirmations (bounded), answer ``Inactive``.
* Lease: an active broker with no renewing heartbeat for ``leaseSeconds``
  deactivates itself (self-fencing); so does one a target tells about a higher
  epoch (another broker is active).

Heartbeats and fencing are serialized by one lock, so activation and
deactivation never interleave. ``SendMessages`` does not take the lock (it is
the hot path); it checks the state on entry, and deactivation waits for the
bundles already past that check to be journaled, so every acknowledged message
is durable.

Not here: parsing SOAP (:mod:`broker_service.soap_codec`), HTTP
(:mod:`broker_service.server`), and the outbound/inbound delivery loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from broker_contracts.message_log import Direction, Event
from broker_contracts.soap import BrokerState, FaultCode, UnavailabilityCode
from broker_service.epoch_store import EpochStore, EpochStoreError
from broker_service.forwarder import OutboundForwarder
from broker_service.holds import HeldEntry
from broker_service.inbound import InboundPoller
from broker_service.journal import Journal, JournalError, bundle_frame, confirmed_frame, recover
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
        self._accepting = 0
        self._accepts_idle = asyncio.Event()
        self._accepts_idle.set()
        self._shutting_down = False
        self._background: list[asyncio.Task[None]] = []
        self._fences: set[asyncio.Task[None]] = set()
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
            snapshot=self.outbound.snapshot_frames,
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
            message_log=self.message_log,
            metrics=self.metrics,
            epoch=lambda: self.epochs.value,
            fence=self.fence,
        )

    def _wake_forwarder(self) -> None:
        self.forwarder.wake()

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
            self.journal.open(last_number)
            if recovered.torn_bytes:
                logger.warning(
                    "journal: cut a torn tail of %d bytes (never acknowledged)", recovered.torn_bytes
                )
            logger.info(
                "journal recovered: %d records, %d unconfirmed messages in %d streams",
                recovered.records,
                self.outbound.unconfirmed_count,
                len(self.outbound.streams),
            )
        except (JournalError, OSError) as error:
            self.journal_error = str(error)
            logger.error("journal cannot be used; this broker will refuse activation: %s", error)
        loop = asyncio.get_running_loop()
        self._background.append(loop.create_task(self._watch_lease(), name="lease-watch"))

    async def stop(self) -> None:
        """SIGTERM: deactivate and drain, then close everything."""
        self._shutting_down = True
        async with self._lock:
            if self.state is BrokerState.ACTIVE:
                await self._deactivate("the broker is shutting down (SIGTERM)")
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.journal.close()
        self.message_log.close_segment()
        await self.relay.close()

    # ---- heartbeat ---------------------------------------------------------------------------

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatReply:
        async with self._lock:
            reply = await self._heartbeat_locked(request)
        self.metrics.heartbeats.labels(reply.state.value).inc()
        return reply

    def _unavailable(self, code: UnavailabilityCode, message: str) -> HeartbeatReply:
        return HeartbeatReply(BrokerState.UNAVAILABLE, self.epoch, code.value, message)

    async def _heartbeat_locked(self, request: HeartbeatRequest) -> HeartbeatReply:  # noqa: PLR0911
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
        if request.epoch < self.epoch:
            return self._unavailable(
                UnavailabilityCode.STALE_EPOCH,
                f"heartbeat epoch {request.epoch} is below this broker's stored epoch {self.epoch}; "
                "a newer operator decision exists",
            )
        if self.journal_error or not self.journal.is_open:
            detail = self.journal_error or (
                str(self.journal.failure) if self.journal.failure else "journal not open"
            )
            return self._unavailable(UnavailabilityCode.JOURNAL_ERROR, detail[:500])
        if request.epoch > self.epoch:
            try:
                self._store_epoch(request.epoch)
            except EpochStoreError as error:
                return self._unavailable(UnavailabilityCode.JOURNAL_ERROR, str(error))
        if self.state is not BrokerState.ACTIVE:
            failure = await self._activate()
            if failure is not None:
                return failure
        self._lease_deadline = time.monotonic() + self.settings.lease_seconds
        return HeartbeatReply(BrokerState.ACTIVE, self.epoch)

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

    async def _deactivate(self, reason: str) -> None:
        """Stop accepting and polling; drain in-flight work within ``drain_seconds``."""
        self.state = BrokerState.INACTIVE
        self.metrics.active.set(0)
        drain = self.settings.drain_seconds
        # Bundles past the state check finish journaling, so their acknowledgements stay true.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._accepts_idle.wait(), timeout=drain)
        await asyncio.gather(self.inbound.stop(drain), self.forwarder.stop(drain))
        self.message_log.lifecycle(Event.DEACTIVATED, self.epoch)
        self.message_log.close_segment()
        logger.info("deactivated (epoch %d): %s", self.epoch, reason)

    def fence(self, reason: str) -> None:
        """A target saw a higher epoch: another broker is active. Deactivate without waiting for it."""
        task = asyncio.get_running_loop().create_task(self._fence(reason), name="fence")
        # The loop keeps only weak references to tasks; hold this one until it is done.
        self._fences.add(task)
        task.add_done_callback(self._fences.discard)

    async def _fence(self, reason: str) -> None:
        async with self._lock:
            if self.state is BrokerState.ACTIVE:
                logger.warning("fencing: %s", reason)
                await self._deactivate(reason)

    async def _watch_lease(self) -> None:
        tick = min(0.1, self.settings.lease_seconds / 10)
        while True:
            await asyncio.sleep(tick)
            self.message_log.close_if_due()
            if self.state is BrokerState.ACTIVE and time.monotonic() > self._lease_deadline:
                async with self._lock:
                    if self.state is BrokerState.ACTIVE and time.monotonic() > self._lease_deadline:
                        await self._deactivate(
                            f"lease expired: no active=true heartbeat for {self.settings.lease_seconds}s"
                        )

    # ---- SendMessages ------------------------------------------------------------------------

    async def send_messages(self, request: SendMessagesRequest) -> tuple[int, list[AcceptResult]]:
        # The lease is checked here too, not only by the watcher: a broker resumed after a pause
        # (SIGSTOP, a VM stall) must not accept a single bundle on a lease that ran out meanwhile.
        if self.state is not BrokerState.ACTIVE or time.monotonic() > self._lease_deadline:
            raise SoapFaultError(
                FaultCode.BROKER_INACTIVE,
                f"broker {self.settings.name!r} is {self.state.value}, not Active; send to the active broker "
                f"(Service {self.settings.cluster}-active) and retry",
                client=False,
            )
        settings = self.settings
        if settings.pair_fixed and (request.account, request.company) != (settings.account, settings.company):
            raise SoapFaultError(
                FaultCode.WRONG_PAIR,
                f"bundle is for account {request.account!r} company {request.company!r}; this broker serves "
                f"account {settings.account!r} company {settings.company!r}",
            )
        results, accepted, indices = self.outbound.reserve(
            request.streams, request.seqs, request.msg_ids, request.payloads
        )
        if accepted:
            self._accepting += 1
            self._accepts_idle.clear()
            try:
                await self.journal.append(bundle_frame(request.raw, indices))
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
            self.outbound.commit(accepted)
            epoch = self.epoch
            self.message_log.messages(Event.ACCEPTED, epoch, Direction.OUTBOUND, accepted, first=True)
            self.metrics.accepted.inc(len(accepted))
        if len(accepted) != len(results):
            self._count_refusals(results)
        return self.epoch, results

    def _count_refusals(self, results: list[AcceptResult]) -> None:
        gaps = sum(1 for r in results if r[3] is not None)
        duplicates = sum(1 for r in results if r[2].value == "Duplicate")
        self.metrics.gaps.inc(gaps)
        self.metrics.duplicates.inc(duplicates)

    # ---- held messages -----------------------------------------------------------------------

    def list_held(self, stream: str | None) -> list[HeldEntry]:
        return self.outbound.holds.entries(stream) + self.inbound.holds.entries(stream)

    async def replay_held(self, direction: str, stream: str, seq: int) -> HeldEntry:
        if direction == Direction.OUTBOUND.value:
            entry = self.outbound.replay(stream, seq)
            self.forwarder.refresh_hold_metrics()
        elif direction == Direction.INBOUND.value:
            entry = self.inbound.replay(stream, seq)
        else:
            raise SoapFaultError(
                FaultCode.MALFORMED_REQUEST, f"direction {direction!r} is not inbound or outbound"
            )
        if entry is None:
            raise SoapFaultError(
                FaultCode.NOT_FOUND, f"no held {direction} message for stream {stream!r} seq {seq}"
            )
        self.message_log.messages(Event.REPLAYED, self.epoch, entry.direction, [entry.message])
        return entry

    async def discard_held(self, direction: str, stream: str, seq: int) -> HeldEntry:
        if direction == Direction.OUTBOUND.value:
            entry = self.outbound.discard(stream, seq)
            if entry is not None:
                self.forwarder.mark_dirty(stream)
                self.forwarder.refresh_hold_metrics()
        elif direction == Direction.INBOUND.value:
            try:
                entry = await self.inbound.discard(stream, seq)
            except (TargetUnreachableError, StaleEpochError) as error:
                raise SoapFaultError(
                    FaultCode.NOT_FOUND,
                    f"cannot discard: confirming it to the cloud failed: {error}",
                    client=False,
                ) from None
        else:
            raise SoapFaultError(
                FaultCode.MALFORMED_REQUEST, f"direction {direction!r} is not inbound or outbound"
            )
        if entry is None:
            raise SoapFaultError(
                FaultCode.NOT_FOUND, f"no held {direction} message for stream {stream!r} seq {seq}"
            )
        self.message_log.messages(Event.DISCARDED, self.epoch, entry.direction, [entry.message], final=True)
        return entry
