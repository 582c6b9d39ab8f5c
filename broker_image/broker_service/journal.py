"""The broker's write-ahead journal: accepted messages are durable before they are acknowledged.

Layout: ``<data-dir>/journal/journal-<n>.log``, append-only: a file header with the format
version, then frames ``<u32 length><u32 crc32><u32 header crc32><kind byte><JSON body>``; the
bytes, and how recovery tells a torn tail from damage, are :mod:`broker_service.journal_format`'s.
The kinds:

* ``B`` (bundle): a SendMessages request body exactly as received, after a
  JSON line listing which of its messages were accepted. The hot path encodes
  nothing: the bytes are already there; recovery parses them again.
(JSON is written with the relay contract's codec, :func:`broker_contracts.relay.dumps`:
compact UTF-8, orjson when installed, the same text either way.)

* ``A`` (accepted): a JSON array of ``[stream, seq, msgId, payload]``; what
  compaction snapshots write.
* ``C`` (confirmed): ``{stream: seq}`` watermarks; everything up to them is
  confirmed to the backend and need not survive (outbound holds and discards
  at or below them included).
* ``H`` (held): one held message, either direction, as ``ListHeld`` shows it
  (``direction``, ``stream``, ``seq``, ``msgId``, ``attempts``, ``lastError``,
  ``heldSince``) and whether it stops its stream. Outbound, the message itself
  is in an ``A`` or ``B`` record before it (a held message is never confirmed);
  inbound, the cloud keeps it.
* ``R`` (released): ``direction``, ``stream``, ``seq`` and the
  :class:`~broker_service.holds.Release` outcome. An outbound ``discarded`` one
  also says the message must not be forwarded again, though it stays
  unconfirmed until the backend's watermark passes it.

Holds are rare, so their records are written as they happen (with the next
group commit) and ``ListHeld`` waits for the journal before it answers: what
it lists survives a kill -9.

Group commit: :meth:`Journal.append` queues a frame and waits; one writer task
writes every queued frame with one ``write`` and one ``fsync`` (in a worker
thread, so the event loop keeps accepting bundles meanwhile) and then wakes
all waiters. Under load one fsync covers many bundles. Writes complete in the
order their frames were queued; :meth:`Journal.flushed` waits for everything
queued so far without adding a frame.

Recovery (:func:`recover`) reads the files in order and stops at the first bad
frame. A bad frame at the very end of the last file, or followed only by zero
bytes, is a torn write from a crash: it was never fsynced, so never
acknowledged, and it is cut off. A bad frame with anything else after it is real
corruption (the frame's length is under its own CRC, so a damaged length cannot pass for a
torn tail); we refuse to guess and raise :class:`JournalCorruptError` naming the file, the
offset and the frame (the broker then reports ``JOURNAL_ERROR`` and stays out of service)
rather than drop acknowledged records silently. A file of an older format is refused too
(:class:`JournalFormatError`), with what to do.

Compaction: on open and whenever a file passes ``rotate_bytes``, the journal
starts a new file with a snapshot of what is still unconfirmed (supplied by the
caller), fsyncs it, and only then deletes the older files; a crash in between
leaves both, and recovery is idempotent over duplicates.

Not here: deciding what is accepted or confirmed (the stream table does that).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker_contracts.message_log import Direction
from broker_contracts.relay import dumps, loads
from broker_service.holds import HeldEntry, Release
from broker_service.journal_format import (
    FILE_HEADER,
    KIND_ACCEPTED,
    KIND_BUNDLE,
    KIND_CONFIRMED,
    KIND_HELD,
    KIND_RELEASED,
    JournalCorruptError,
    JournalError,
    JournalFormatError,
    frame,
    scan,
)
from broker_service.soap_codec import SendMessagesRequest, SoapFaultError, parse_request

_FILE_RE = re.compile(r"^journal-(\d{12})\.log$")

JournalMessage = tuple[str, int, str, str]
"""``(stream, seq, msgId, payload)``."""


__all__ = [
    "FILE_HEADER",
    "KIND_ACCEPTED",
    "KIND_BUNDLE",
    "KIND_CONFIRMED",
    "KIND_HELD",
    "KIND_RELEASED",
    "Journal",
    "JournalCorruptError",
    "JournalError",
    "JournalFormatError",
    "JournalMessage",
    "RecoveredJournal",
    "accepted_frame",
    "bundle_frame",
    "confirmed_frame",
    "frame",
    "held_frame",
    "recover",
    "released_frame",
    "scan",
]


def accepted_frame(messages: list[JournalMessage]) -> bytes:
    return frame(KIND_ACCEPTED, dumps(messages))


def bundle_frame(soap_body: bytes, accepted: list[int]) -> bytes:
    """The SendMessages request exactly as received, and which of its messages were accepted.

    Journaling the bytes we were given costs no encoding on the hot path (re-encoding
    50 KB of payloads as JSON was the broker's largest single cost); recovery parses
    them again with the same hardened codec.
    """
    return frame(KIND_BUNDLE, dumps(accepted), b"\n", soap_body)


def confirmed_frame(watermarks: dict[str, int]) -> bytes:
    return frame(KIND_CONFIRMED, dumps(watermarks))


def held_frame(entry: HeldEntry) -> bytes:
    stream, seq, msg_id, _ = entry.message
    record = {
        "direction": entry.direction.value,
        "stream": stream,
        "seq": seq,
        "msgId": msg_id,
        "attempts": entry.attempts,
        "lastError": entry.last_error,
        "heldSince": entry.held_since,
        "blocksStream": entry.blocks_stream,
    }
    return frame(KIND_HELD, dumps(record))


def released_frame(direction: Direction, stream: str, seq: int, outcome: Release) -> bytes:
    record = {"direction": direction.value, "stream": stream, "seq": seq, "outcome": outcome.value}
    return frame(KIND_RELEASED, dumps(record))


HoldKey = tuple[Direction, str, int]
"""``(direction, stream, seq)`` of a held message."""


@dataclass
class RecoveredJournal:
    """What the journal files say: unconfirmed messages per stream and where each stream stands."""

    pending: dict[str, dict[int, JournalMessage]] = field(default_factory=dict)
    confirmed: dict[str, int] = field(default_factory=dict)
    last_accepted: dict[str, int] = field(default_factory=dict)
    # Held messages of both directions (their payload left out: the direction has it), and outbound
    # messages an operator discarded that the backend has not confirmed yet.
    holds: dict[HoldKey, HeldEntry] = field(default_factory=dict)
    discarded: dict[str, set[int]] = field(default_factory=dict)
    torn_bytes: int = 0  # how much of a torn tail was cut off
    records: int = 0

    def apply(self, kind: bytes, body: bytes) -> None:
        if kind in (KIND_ACCEPTED, KIND_BUNDLE):
            for stream, seq, msg_id, payload in _accepted_messages(kind, body):
                if seq > self.confirmed.get(stream, 0):
                    self.pending.setdefault(stream, {})[seq] = (stream, seq, msg_id, payload)
                if seq > self.last_accepted.get(stream, 0):
                    self.last_accepted[stream] = seq
        elif kind == KIND_CONFIRMED:
            for stream, upto in loads(body).items():
                if upto > self.confirmed.get(stream, 0):
                    self.confirmed[stream] = upto
                    queued = self.pending.get(stream)
                    if queued:
                        for seq in [s for s in queued if s <= upto]:
                            del queued[seq]
                    if self.holds or self.discarded:
                        self._forget_confirmed(stream, upto)
        elif kind == KIND_HELD:
            self._held(loads(body))
        else:
            self._released(loads(body))
        self.records += 1

    def _outbound_confirmed(self, direction: Direction, stream: str, seq: int) -> bool:
        return direction is Direction.OUTBOUND and seq <= self.confirmed.get(stream, 0)

    def _held(self, record: dict[str, object]) -> None:
        direction = Direction(str(record["direction"]))
        stream, seq = str(record["stream"]), _integer(record["seq"])
        if self._outbound_confirmed(direction, stream, seq):
            return
        self.holds[(direction, stream, seq)] = HeldEntry(
            direction=direction,
            message=(stream, seq, str(record["msgId"]), ""),
            attempts=_integer(record["attempts"]),
            last_error=str(record["lastError"]),
            held_since=str(record["heldSince"]),
            blocks_stream=record["blocksStream"] is True,
        )

    def _released(self, record: dict[str, object]) -> None:
        direction = Direction(str(record["direction"]))
        stream, seq = str(record["stream"]), _integer(record["seq"])
        outcome = Release(str(record["outcome"]))
        self.holds.pop((direction, stream, seq), None)
        if (
            outcome is Release.DISCARDED
            and direction is Direction.OUTBOUND
            and not self._outbound_confirmed(direction, stream, seq)
        ):
            self.discarded.setdefault(stream, set()).add(seq)

    def _forget_confirmed(self, stream: str, upto: int) -> None:
        """The backend confirmed past these: a hold or discard there is over, whoever ended it."""
        for key in [k for k in self.holds if k[0] is Direction.OUTBOUND and k[1] == stream and k[2] <= upto]:
            del self.holds[key]
        seqs = self.discarded.get(stream)
        if seqs:
            seqs.difference_update([s for s in seqs if s <= upto])
            if not seqs:
                del self.discarded[stream]


def _integer(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _accepted_messages(kind: bytes, body: bytes) -> list[JournalMessage]:
    if kind == KIND_ACCEPTED:
        return [(str(m[0]), int(m[1]), str(m[2]), str(m[3])) for m in loads(body)]
    header, _, soap_body = body.partition(b"\n")
    try:
        request = parse_request(soap_body)
    except SoapFaultError as fault:
        raise ValueError(f"journaled SendMessages no longer parses: {fault.message}") from None
    if not isinstance(request, SendMessagesRequest):
        raise ValueError("journaled bundle is not a SendMessages request")
    return [
        (request.streams[i], request.seqs[i], request.msg_ids[i], request.payloads[i]) for i in loads(header)
    ]


def _journal_files(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        match = _FILE_RE.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def recover(directory: Path) -> tuple[RecoveredJournal, int]:
    """Read every journal file in order; cut a torn tail; return the state and the last file number."""
    directory.mkdir(parents=True, exist_ok=True)
    recovered = RecoveredJournal()
    files = _journal_files(directory)
    for index, (_, path) in enumerate(files):
        data = path.read_bytes()
        good = scan(data, recovered.apply, source=str(path), last_file=index == len(files) - 1)
        if good < len(data):
            recovered.torn_bytes = len(data) - good
            os.truncate(path, good)
    return recovered, files[-1][0] if files else 0


def _fsync_dir(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class Journal:
    """An open journal with a group-commit writer task (see the module docstring)."""

    def __init__(self, directory: Path, *, rotate_bytes: int, snapshot: Callable[[], list[bytes]]) -> None:
        self.directory = directory
        self.rotate_bytes = rotate_bytes
        self._snapshot = snapshot
        self._number = 0
        self._fd = -1
        self._size = 0
        self._frames: list[bytes] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self.failure: JournalError | None = None
        self.fsyncs = 0
        self.bytes_written = 0

    @property
    def is_open(self) -> bool:
        return self._fd >= 0 and self.failure is None

    def open(self, last_number: int) -> None:
        """Start a fresh file holding the caller's snapshot, then drop the older files."""
        self._rotate_sync(last_number + 1, b"".join(self._snapshot()))
        self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="journal-writer")

    def _rotate_sync(self, number: int, snapshot: bytes) -> None:
        path = self.directory / f"journal-{number:012d}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o640)
        os.write(fd, FILE_HEADER + snapshot)
        os.fsync(fd)
        _fsync_dir(self.directory)
        old_fd = self._fd
        self._fd, self._number, self._size = fd, number, len(FILE_HEADER) + len(snapshot)
        if old_fd >= 0:
            os.close(old_fd)
        # Only after the new file is durable may the old ones go.
        for old_number, old_path in _journal_files(self.directory):
            if old_number < number:
                old_path.unlink()
        _fsync_dir(self.directory)

    async def append(self, record: bytes) -> None:
        """Queue ``record`` (a frame) and return once it is on disk (fsynced)."""
        if self.failure is not None:
            raise self.failure
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._frames.append(record)
        self._waiters.append(future)
        self._wakeup.set()
        await future

    async def flushed(self) -> None:
        """Return once every frame queued before this call is on disk; raise the journal's failure.

        For an answer that acknowledges messages another caller queued (a ``Duplicate`` of a
        seq whose bundle is still being journaled): it must not go out before they are durable.
        """
        if self.failure is not None:
            raise self.failure
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._wakeup.set()
        await future

    def append_lazily(self, record: bytes) -> None:
        """Queue ``record`` to go out with the next group commit, without waiting for it."""
        if self.failure is None:
            self._frames.append(record)
            self._wakeup.set()

    def _write_sync(self, blob: bytes) -> None:
        view = memoryview(blob)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    async def _write_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._frames:
                # Only :meth:`flushed` waiters: what was queued before them went out in a write
                # that has finished (writes run one at a time, in this loop).
                waiters, self._waiters = self._waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                continue
            frames, waiters = self._frames, self._waiters
            self._frames, self._waiters = [], []
            blob = b"".join(frames)
            try:
                await asyncio.to_thread(self._write_sync, blob)
                self.fsyncs += 1
                self.bytes_written += len(blob)
                self._size += len(blob)
                if self._size > self.rotate_bytes:
                    # The snapshot is taken after the write, and callers add messages to the
                    # in-memory table before awaiting, so it covers everything written so far.
                    snapshot = b"".join(self._snapshot())
                    await asyncio.to_thread(self._rotate_sync, self._number + 1, snapshot)
            except OSError as error:
                self.failure = JournalError(f"journal write to {self.directory} failed: {error}")
                for waiter in waiters + self._waiters:
                    if not waiter.done():
                        waiter.set_exception(self.failure)
                return
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def close(self) -> None:
        """Flush what is queued, stop the writer and close the file."""
        if self._writer is not None:
            if self._frames and self.failure is None:
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.append(done)
                self._wakeup.set()
                with contextlib.suppress(JournalError, TimeoutError):
                    await asyncio.wait_for(done, timeout=10)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
