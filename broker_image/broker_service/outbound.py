"""The outbound stream table: per-stream accept cursors, delivery queues, watermarks and holds.

This is the broker's in-memory model of backend-to-cloud traffic, kept free of
I/O so that its rules can be read (and unit-tested) in one place:

* :meth:`OutboundTable.reserve` applies the seq rule to a bundle: the next
  ``seq`` is accepted, an old one is a duplicate (acknowledged again, not
  queued twice), a gap is refused with the expected ``seq``. Accepted messages
  enter ``unconfirmed`` at once (so a journal snapshot taken at any moment
  covers them) but enter the delivery ``queue`` only in :meth:`commit`, after
  the journal says they are durable: nothing is forwarded before it is safe.
  A duplicate is an acknowledgement too, so it must not be answered before
  the message is durable: when a duplicate's ``seq`` was reserved by a bundle
  whose journal write has not finished (a backend retrying a timed-out bundle
  while the first copy is still being journaled), ``reserve`` says so and the
  caller waits for the journal before it answers.
* :meth:`take_bundle` builds one cloud bundle across streams; a stream is in
  at most one bundle at a time, which is what keeps its order when several
  bundles are in flight.
* :meth:`settle` applies the cloud's per-message answers: delivered messages
  leave the queue; a rejection counts an attempt, schedules a retry with
  backoff, and after ``maxDeliveries`` applies the ``onPoison`` policy.
* The confirmation watermark of a stream (what may be confirmed to the backend)
  is the highest delivered ``seq`` below anything still held or queued.
* :meth:`load` rebuilds it all from the journal after a restart, holds and
  discards included: a held message stays held (not tried again), a discarded
  one is not forwarded again. :meth:`snapshot_frames` writes the same back
  when the journal compacts.

Transport failures (cloud unreachable) are not attempts: a cloud outage must
not turn every message into poison. The forwarder retries those with backoff.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

from broker_contracts.message_log import Direction, format_ts
from broker_contracts.relay import DeliveryStatus
from broker_contracts.soap import AcceptStatus
from broker_service.holds import HeldEntry, HoldQueue, Release
from broker_service.journal import (
    JournalMessage,
    RecoveredJournal,
    accepted_frame,
    confirmed_frame,
    held_frame,
    released_frame,
)
from broker_service.settings import PoisonPolicy
from broker_service.soap_codec import AcceptResult

_OK = DeliveryStatus.OK.value
_DUPLICATE = DeliveryStatus.DUPLICATE.value
_REJECTED = DeliveryStatus.REJECTED.value


@dataclass(slots=True, eq=False)
class OutboundStream:
    name: str
    expected: int = 1  # the next seq this broker accepts
    durable: int = 0  # every seq up to this one is journaled (or confirmed by the backend)
    unconfirmed: deque[JournalMessage] = field(default_factory=deque)  # accepted, not confirmed to backend
    queue: deque[JournalMessage] = field(default_factory=deque)  # durable, not yet taken by the cloud
    in_flight: bool = False
    ready: bool = False  # listed in the table's ready deque
    blocked: bool = False  # BlockStream: the queue head is held
    waiting_retry: bool = False
    attempts: int = 0  # failed deliveries of the queue head
    last_delivered: int = 0
    confirmed: int = 0  # watermark the backend has acknowledged

    def watermark(self, holds: HoldQueue) -> int:
        mark = self.last_delivered
        if self.queue and self.queue[0][1] <= mark:
            mark = self.queue[0][1] - 1
        held = holds.lowest_seq(self.name) if self.blocked or len(holds) else None
        if held is not None and held <= mark:
            mark = held - 1
        return max(mark, self.confirmed)


@dataclass
class SettleOutcome:
    delivered: list[JournalMessage] = field(default_factory=list)  # for the message log
    # The cloud already had these: logged as `deduplicated`, the validator's proof that a delivery
    # a crash kept out of the log happened.
    deduplicated: list[JournalMessage] = field(default_factory=list)
    held: list[HeldEntry] = field(default_factory=list)
    rejected: int = 0


Bundle = list[tuple[OutboundStream, list[JournalMessage]]]


class OutboundTable:
    def __init__(
        self,
        *,
        max_deliveries: int,
        on_poison: PoisonPolicy,
        retry_base_seconds: float,
        retry_max_seconds: float,
        schedule: Callable[[float, Callable[[], None]], object],
        on_ready: Callable[[], None],
    ) -> None:
        self.streams: dict[str, OutboundStream] = {}
        self.ready: deque[OutboundStream] = deque()
        self.holds = HoldQueue()
        # Discarded by an operator, not yet confirmed by the backend: still in `unconfirmed`, so
        # a journal snapshot must say they are not to be forwarded again.
        self.discarded: dict[str, set[int]] = {}
        self.max_deliveries = max_deliveries
        self.on_poison = on_poison
        self.retry_base_seconds = retry_base_seconds
        self.retry_max_seconds = retry_max_seconds
        self._schedule = schedule  # loop.call_later, injected so unit tests can drive time
        self._on_ready = on_ready

    # ---- accepting ---------------------------------------------------------------------------

    def _stream(self, name: str) -> OutboundStream:
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = OutboundStream(name)
        return stream

    def reserve(
        self, streams: list[str], seqs: list[int], msg_ids: list[str], payloads: list[str]
    ) -> tuple[list[AcceptResult], list[JournalMessage], list[int], bool]:
        """Apply the seq rule to one bundle; accepted messages must be journaled, then :meth:`commit`-ed.

        Returns the per-message results, the accepted messages, their indices in the bundle, and
        whether a ``Duplicate`` names a seq that is not durable yet: then the answer must wait
        until every journal write queued so far is on disk (and fail if that write fails).
        """
        results: list[AcceptResult] = []
        accepted: list[JournalMessage] = []
        indices: list[int] = []
        unsettled_duplicate = False
        table = self.streams
        accepted_status, duplicate_status, gap_status = (
            AcceptStatus.ACCEPTED,
            AcceptStatus.DUPLICATE,
            AcceptStatus.GAP,
        )
        for index, name in enumerate(streams):
            seq = seqs[index]
            stream = table.get(name) or self._stream(name)
            expected = stream.expected
            if seq == expected:
                message = (name, seq, msg_ids[index], payloads[index])
                stream.expected = expected + 1
                stream.unconfirmed.append(message)
                accepted.append(message)
                indices.append(index)
                results.append((name, seq, accepted_status, None))
            elif seq < expected:
                results.append((name, seq, duplicate_status, None))
                if seq > stream.durable:
                    unsettled_duplicate = True
            else:
                results.append((name, seq, gap_status, expected))
        return results, accepted, indices, unsettled_duplicate

    def commit(self, accepted: list[JournalMessage]) -> None:
        """The journal has these messages durably: queue them for the cloud."""
        table = self.streams
        for message in accepted:
            stream = table[message[0]]
            stream.queue.append(message)
            # Journal writes complete in the order they were queued, so this only moves forward.
            stream.durable = message[1]
            if not stream.ready:
                self._mark_ready(stream)
        if accepted:
            self._on_ready()

    def _mark_ready(self, stream: OutboundStream) -> None:
        if stream.in_flight or stream.blocked or stream.waiting_retry or not stream.queue or stream.ready:
            return
        stream.ready = True
        self.ready.append(stream)

    # ---- forwarding --------------------------------------------------------------------------

    def take_bundle(self, limit: int) -> Bundle:
        bundle: Bundle = []
        count = 0
        while self.ready and count < limit:
            stream = self.ready.popleft()
            stream.ready = False
            if stream.in_flight or stream.blocked or stream.waiting_retry or not stream.queue:
                continue
            take = min(len(stream.queue), limit - count)
            bundle.append((stream, list(islice(stream.queue, take))))
            stream.in_flight = True
            count += take
        return bundle

    def release(self, bundle: Bundle) -> None:
        """The bundle never reached the cloud (transport failure): its streams are ready again."""
        for stream, _ in bundle:
            stream.in_flight = False
            self._mark_ready(stream)

    def settle(self, bundle: Bundle, results: list[str], reasons: dict[str, str]) -> SettleOutcome:
        outcome = SettleOutcome()
        delivered = outcome.delivered
        index = 0
        for stream, messages in bundle:
            stream.in_flight = False
            first_index = index
            count = len(messages)
            queue = stream.queue
            # Fast path, the common case: the cloud took the whole slice the first time.
            if (
                results[index : index + count].count(_OK) == count
                and queue
                and queue[0] is messages[0]
                and len(queue) >= count
            ):
                for _ in range(count):
                    queue.popleft()
                delivered.extend(messages)
                stream.last_delivered = max(stream.last_delivered, messages[-1][1])
                stream.attempts = 0
                index += count
                self._mark_ready(stream)
                continue
            for message in messages:
                status = results[index] if index < len(results) else DeliveryStatus.SKIPPED.value
                index += 1
                if status in (_OK, _DUPLICATE):
                    if queue and queue[0] is message:
                        queue.popleft()
                    else:  # an operator replay put a message in front meanwhile
                        queue.remove(message)
                    stream.last_delivered = max(stream.last_delivered, message[1])
                    stream.attempts = 0
                    if status == _OK:
                        delivered.append(message)
                    else:
                        outcome.deduplicated.append(message)
                    continue
                if status == _REJECTED:
                    outcome.rejected += 1
                    self._rejected(
                        stream, message, reasons.get(str(index - 1), "rejected by the cloud"), outcome
                    )
                break  # rejected or skipped: the rest of this stream waits
            index = first_index + len(messages)
            self._mark_ready(stream)
        if self.ready:
            self._on_ready()
        return outcome

    def _rejected(
        self, stream: OutboundStream, message: JournalMessage, reason: str, outcome: SettleOutcome
    ) -> None:
        stream.attempts += 1
        if stream.attempts < self.max_deliveries:
            delay = min(self.retry_max_seconds, self.retry_base_seconds * 2 ** (stream.attempts - 1))
            stream.waiting_retry = True
            self._schedule(delay, lambda: self._retry_due(stream))
            return
        blocks = self.on_poison is PoisonPolicy.BLOCK_STREAM
        entry = HeldEntry(Direction.OUTBOUND, message, stream.attempts, reason, format_ts(), blocks)
        self.holds.add(entry)
        outcome.held.append(entry)
        stream.attempts = 0
        if blocks:
            stream.blocked = True  # the message stays at the head of the queue
        else:
            stream.queue.remove(message)

    def _retry_due(self, stream: OutboundStream) -> None:
        stream.waiting_retry = False
        self._mark_ready(stream)
        if stream.ready:
            self._on_ready()

    def reset_in_flight(self) -> None:
        """After the forwarder stopped: nothing is in flight and every stream with work is ready."""
        self.ready.clear()
        for stream in self.streams.values():
            stream.in_flight = stream.ready = False
            self._mark_ready(stream)

    # ---- admin -------------------------------------------------------------------------------

    def replay(self, stream_name: str, seq: int) -> HeldEntry | None:
        entry = self.holds.pop(stream_name, seq)
        if entry is None:
            return None
        stream = self.streams[stream_name]
        stream.attempts = 0
        if stream.blocked and stream.queue and stream.queue[0][1] == seq:
            stream.blocked = False
        else:  # Hold policy: the message left the queue; it goes in front of the rest again
            stream.queue.appendleft(entry.message)
        self._mark_ready(stream)
        self._on_ready()
        return entry

    def discard(self, stream_name: str, seq: int) -> HeldEntry | None:
        entry = self.holds.pop(stream_name, seq)
        if entry is None:
            return None
        stream = self.streams[stream_name]
        stream.attempts = 0
        if stream.blocked and stream.queue and stream.queue[0][1] == seq:
            stream.queue.popleft()
            stream.blocked = False
        # Discarding counts as done for the watermark: the backend may forget it.
        stream.last_delivered = max(stream.last_delivered, seq)
        if seq > stream.confirmed:
            self.discarded.setdefault(stream_name, set()).add(seq)
        self._mark_ready(stream)
        self._on_ready()
        return entry

    # ---- confirmations -----------------------------------------------------------------------

    def watermarks(self, names: set[str] | None = None) -> dict[str, int]:
        """Streams whose confirmable watermark moved past what the backend has acknowledged."""
        moved = {}
        for stream in self.streams.values() if names is None else (self.streams[n] for n in names):
            mark = stream.watermark(self.holds)
            if mark > stream.confirmed:
                moved[stream.name] = mark
        return moved

    def confirmed(self, watermarks: dict[str, int]) -> list[JournalMessage]:
        """The backend acknowledged these watermarks; return the messages that are now done."""
        done: list[JournalMessage] = []
        for name, mark in watermarks.items():
            stream = self.streams[name]
            if mark <= stream.confirmed:
                continue
            stream.confirmed = mark
            unconfirmed = stream.unconfirmed
            while unconfirmed and unconfirmed[0][1] <= mark:
                done.append(unconfirmed.popleft())
            if self.discarded:
                self._forget_discarded(name, mark)
        return done

    def _forget_discarded(self, name: str, upto: int) -> None:
        seqs = self.discarded.get(name)
        if seqs:
            seqs.difference_update([s for s in seqs if s <= upto])
            if not seqs:
                del self.discarded[name]

    # ---- recovery and resend -----------------------------------------------------------------

    def load(self, recovered: RecoveredJournal) -> None:
        """Rebuild the table from the journal after a (re)start, holds and discards included."""
        names = set(recovered.pending) | set(recovered.confirmed) | set(recovered.last_accepted)
        for name in names:
            stream = self._stream(name)
            confirmed = recovered.confirmed.get(name, 0)
            pending = [recovered.pending[name][seq] for seq in sorted(recovered.pending.get(name, {}))]
            stream.confirmed = stream.last_delivered = confirmed
            stream.expected = max(recovered.last_accepted.get(name, 0), confirmed) + 1
            stream.durable = stream.expected - 1  # all of it came from the journal
            stream.unconfirmed = deque(pending)
            stream.queue = deque(pending)
        for name, seqs in recovered.discarded.items():
            self._restore_discarded(name, seqs)
        for (direction, _, _), entry in sorted(recovered.holds.items()):
            if direction is Direction.OUTBOUND:
                self._restore_hold(entry)
        for name in names:
            self._mark_ready(self.streams[name])

    def _restore_discarded(self, name: str, seqs: set[int]) -> None:
        """As :meth:`discard` left it: out of the queue, passed by the watermark, still unconfirmed."""
        stream = self.streams.get(name)
        if stream is None:
            return
        stream.queue = deque(m for m in stream.queue if m[1] not in seqs)
        stream.last_delivered = max(stream.last_delivered, *seqs)
        self.discarded[name] = set(seqs)

    def _restore_hold(self, entry: HeldEntry) -> None:
        """As :meth:`_rejected` left it: held, not tried again, its stream stopped if it stopped it."""
        stream = self.streams.get(entry.stream)
        message = next((m for m in stream.unconfirmed if m[1] == entry.seq), None) if stream else None
        if stream is None or message is None:
            return  # confirmed meanwhile: nothing is held any more
        entry.message = message
        self.holds.add(entry)
        if entry.blocks_stream:
            # The stream had stopped at this message, so every seq before it had reached the cloud
            # (a stream is delivered in order): do not send those again, start at the held one.
            while stream.queue and stream.queue[0][1] < entry.seq:
                stream.queue.popleft()
            stream.last_delivered = max(stream.last_delivered, entry.seq - 1)
            stream.blocked = True
        else:
            stream.queue = deque(m for m in stream.queue if m is not message)

    def apply_resend_cursors(self, cursors: dict[str, int]) -> dict[str, int]:
        """Use the backend's first-unconfirmed seqs: drop what another broker delivered, move cursors.

        Returns the watermarks that moved, for the journal.
        """
        moved: dict[str, int] = {}
        for name, first_unconfirmed in cursors.items():
            stream = self._stream(name)
            done = first_unconfirmed - 1
            if done > stream.confirmed:
                stream.confirmed = done
                stream.last_delivered = max(stream.last_delivered, done)
                while stream.unconfirmed and stream.unconfirmed[0][1] <= done:
                    stream.unconfirmed.popleft()
                stream.queue = deque(m for m in stream.queue if m[1] > done)
                self.holds.drop_upto(name, done)
                if stream.blocked and (not stream.queue or self.holds.get(name, stream.queue[0][1]) is None):
                    stream.blocked = False
                moved[name] = done
                if self.discarded:
                    self._forget_discarded(name, done)
            stream.expected = max(stream.expected, first_unconfirmed)
            # Below the backend's cursor everything is confirmed end to end: a duplicate is true.
            stream.durable = max(stream.durable, first_unconfirmed - 1)
            self._mark_ready(stream)
        return moved

    def snapshot_frames(self, chunk: int = 1000) -> list[bytes]:
        """Journal frames that reproduce every unconfirmed message and every stream's watermark."""
        frames: list[bytes] = []
        batch: list[JournalMessage] = []
        for stream in self.streams.values():
            for message in stream.unconfirmed:
                batch.append(message)
                if len(batch) >= chunk:
                    frames.append(accepted_frame(batch))
                    batch = []
        if batch:
            frames.append(accepted_frame(batch))
        marks = {s.name: s.confirmed for s in self.streams.values() if s.confirmed}
        if marks:
            frames.append(confirmed_frame(marks))
        # Cursors of streams whose every accepted message is confirmed are implied by the marks;
        # a stream with unconfirmed messages carries its cursor in its last accepted message.
        # Holds and discards after the messages they name, as they were first written.
        frames += [held_frame(entry) for entry in self.holds.entries()]
        frames += [
            released_frame(Direction.OUTBOUND, name, seq, Release.DISCARDED)
            for name, seqs in self.discarded.items()
            for seq in sorted(seqs)
        ]
        return frames

    @property
    def queued(self) -> int:
        return sum(len(s.queue) for s in self.streams.values())

    @property
    def unconfirmed_count(self) -> int:
        return sum(len(s.unconfirmed) for s in self.streams.values())
