"""Writes this broker's message log: closed, never-rewritten JSON Lines segments in the shared store.

The record schema and the file layout are the contract in
:mod:`broker_contracts.message_log`; this module only writes it. A segment is
open as ``<store>/<cluster>/<broker>/<name>.jsonl.open`` and closed with one
atomic rename to ``<name>.<sha256>.jsonl`` (the sha256 of its bytes,
:func:`~broker_contracts.message_log.sealed_segment_name`) when it passes a size
or an age bound, when the broker deactivates, and when it stops. The validator
reads closed segments only, so it never sees a half-written one; a closed
segment is never opened again.

Closing a segment hashes it, which costs about 3 ns a byte: on the size and age
bounds (in the relay's event loop) the hash and the rename run on one sealing
thread (``hashlib`` and ``os.read`` release the GIL), in the order the segments
were opened; deactivation and stop wait for every pending seal, so a broker's
segments are all closed before it answers that it is inactive.

The writer stays inside ``<store>/<cluster>/<broker>/`` (issue 39): the cluster
and broker names must be single path components, the two directories must be
real directories (a link another broker of the cluster planted is refused),
and segment files are opened without following links.

Lines go out with ``os.write`` straight to the file (no user-space buffer), one
call per event-loop iteration (every record queued in that iteration), so a
``kill -9`` loses at most the records of the iteration it interrupted; we do
not fsync the log, because it is evidence for the validator, not the
durability mechanism (the journal is). A segment left open by a crash is closed
at the next start, after cutting a torn last line.

Cost matters: a message produces several records, so lines are built by string
formatting around a per-batch prefix (one timestamp per batch, quoted names
cached) instead of ``json.dumps`` per record.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from json.encoder import encode_basestring  # the C string quoter json uses
from pathlib import Path
from typing import cast

from broker_contracts.message_log import (
    CLOSED_SEGMENT_SUFFIX,
    OPEN_SEGMENT_SUFFIX,
    Direction,
    Event,
    sealed_segment_name,
    segment_name,
    segment_stem,
)

_ts_second = -1
_ts_prefix = ""

logger = logging.getLogger(__name__)


def now_ts() -> str:
    """The schema's timestamp for now (as :func:`broker_contracts.message_log.format_ts` writes it).

    The date-and-seconds part is formatted once per second and reused; only the microseconds
    change between calls. ``format_ts`` (datetime, astimezone, strftime) showed in the profile,
    since every batch of records takes one.
    """
    global _ts_second, _ts_prefix  # noqa: PLW0603  # a one-entry cache, process-wide like the clock
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    if seconds != _ts_second:
        _ts_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _ts_second = seconds
    return f"{_ts_prefix}.{nanos // 1000:06d}Z"


def answer_ts(may_relay: Callable[[], bool], checked: str, target: str) -> str | None:
    """The time for the records of a target's answer: None (now, when it was read) while the term
    still holds; else ``checked``, the time read before the check that allowed the call. A broker
    paused between its call and the answer reads the answer after its term, having done nothing
    after it: its records then say when it last knew it held the term (docs/broker.md)."""
    if may_relay():
        return None
    logger.warning(
        "read the %s's answer after this broker's term had lapsed (paused?); "
        "its records are dated %s, the term check before the call",
        target,
        checked,
    )
    return checked


LoggedMessage = tuple[str, int, str, object]
"""``(stream, seq, msgId, anything)``: journaled and relayed message tuples fit as they are."""


_MAX_FRAGMENTS = 200_000
_READ_CHUNK = 1 << 20
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def path_component(kind: str, name: str) -> str:
    """``name`` if it names one entry of a directory; a name with a slash or a dot-dot would put
    this broker's segments outside its own directory (another cluster's, or the validator's)."""
    if name in {"", ".", ".."} or "/" in name or "\0" in name:
        raise ValueError(
            f"message-log {kind} name {name!r} is not a single path component; segments go to "
            "<store>/<cluster>/<broker>/ and nowhere else"
        )
    return name


def own_directory(path: Path) -> None:
    """Make ``path`` (its parent exists) and check it is a real directory, not a link to one."""
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(
            errno.ENOTDIR,
            f"message-log directory {path} is not a directory of its own (a symbolic link or a "
            "file): refusing to write through it",
        )


def seal(fd: int, path: Path) -> Path:
    """Hash the open segment ``path`` (open as ``fd``, which this closes) and close it with one
    rename to its sealed name. Runs on the sealing thread, or at start for a crash's leftover."""
    digest = hashlib.sha256()
    try:
        offset = 0
        while chunk := os.pread(fd, _READ_CHUNK, offset):
            digest.update(chunk)
            offset += len(chunk)
    finally:
        os.close(fd)
    sealed = path.with_name(sealed_segment_name(segment_stem(path.name), digest.hexdigest()))
    os.replace(path, sealed)
    return sealed


class MessageLogWriter:
    def __init__(
        self,
        store: Path | None,
        *,
        cluster: str,
        broker: str,
        account: str,
        company: str,
        max_bytes: int,
        max_seconds: float,
    ) -> None:
        path_component("cluster", cluster)
        path_component("broker", broker)
        self.store = store
        self.directory = store / cluster / broker if store is not None else None
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self._static = f'"cluster":{encode_basestring(cluster)},"broker":{encode_basestring(broker)},'
        self._pair = f'"account":{encode_basestring(account)},"company":{encode_basestring(company)},'
        self._fd = -1
        self._path: Path | None = None
        self._opened_mono = 0.0
        self._size = 0
        self._index = 0
        self._quoted: dict[str, str] = {}
        self._fragments: dict[LoggedMessage, str] = {}
        self._pending: list[str] = []
        self._sealer: ThreadPoolExecutor | None = None
        self._seals: list[Future[Path]] = []
        self.records = 0

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def start(self) -> None:
        """Create the directory and close any segment a crash left open."""
        if self.directory is None or self.store is None:
            return
        self.store.mkdir(parents=True, exist_ok=True)  # the mount (or a test's directory): not ours to check
        own_directory(self.directory.parent)
        own_directory(self.directory)
        for path in sorted(self.directory.iterdir()):
            name = path.name
            if name.endswith(OPEN_SEGMENT_SUFFIX):
                self._close_leftover(path)
            if name.endswith((OPEN_SEGMENT_SUFFIX, CLOSED_SEGMENT_SUFFIX)):
                with contextlib.suppress(IndexError, ValueError):
                    self._index = max(self._index, int(name.split("-")[1]) + 1)

    def _close_leftover(self, path: Path) -> None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | _NO_FOLLOW)
        except OSError as error:  # a link (ELOOP) or worse: not a segment this broker wrote
            logger.warning("message log: left %s alone, not a segment file (%s)", path, error.strerror)
            return
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            logger.warning("message log: left %s alone, not a regular file", path)
            return
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        cut = data.rfind(b"\n") + 1  # a torn last line (no newline) is dropped
        if cut == 0:
            os.close(fd)
            path.unlink()
            return
        os.ftruncate(fd, cut)
        seal(fd, path)

    def _open_segment(self) -> None:
        assert self.directory is not None
        closed = segment_name(self.stream_safe_broker, datetime.now(UTC), self._index)
        self._index += 1
        self._path = self.directory / (closed.removesuffix(CLOSED_SEGMENT_SUFFIX) + OPEN_SEGMENT_SUFFIX)
        # Read and write: the sealing thread hashes the segment through this descriptor.
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_EXCL | _NO_FOLLOW
        self._fd = os.open(self._path, flags, 0o644)
        self._opened_mono = time.monotonic()
        self._size = 0

    @property
    def stream_safe_broker(self) -> str:
        assert self.directory is not None
        return self.directory.name

    def close_segment(self) -> None:
        """Close the open segment (if any) into the store, and wait until every segment this writer
        closed is sealed: after this returns, all its records are in closed segments."""
        self.flush()
        self._hand_over()
        self.wait_sealed()

    def wait_sealed(self) -> None:
        """Wait for the sealing thread's pending renames; a failed one stays open for the next start."""
        seals, self._seals = self._seals, []
        self._report(seals)

    @staticmethod
    def _report(seals: list[Future[Path]]) -> None:
        for pending in seals:
            try:
                pending.result()
            except OSError as error:
                logger.error("message log: a segment could not be closed (the next start will): %s", error)

    def _hand_over(self) -> None:
        """Give the open segment to the sealing thread (hash, then rename), in order of opening."""
        if self._fd < 0 or self._path is None:
            return
        fd, path, self._fd, self._path = self._fd, self._path, -1, None
        if self._size == 0:
            os.close(fd)
            path.unlink()
            return
        if self._sealer is None:
            self._sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="message-log-seal")
        done = [pending for pending in self._seals if pending.done()]
        self._seals = [pending for pending in self._seals if not pending.done()]
        self._report(done)
        self._seals.append(self._sealer.submit(seal, fd, path))

    def close_if_due(self) -> None:
        """The age bound; called periodically so a quiet broker still ships its segment."""
        if self._fd >= 0 and time.monotonic() - self._opened_mono >= self.max_seconds:
            self._hand_over()

    def _write(self, text: str) -> None:
        """Queue ``text``; everything queued in one event-loop iteration goes out in one ``os.write``."""
        if not self._pending:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (tests, shutdown): write at once
                self._pending.append(text)
                self.flush()
                return
        self._pending.append(text)

    def flush(self) -> None:
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        if self._fd < 0:
            self._open_segment()
        blob = text.encode("utf-8")
        os.write(self._fd, blob)
        self._size += len(blob)
        if self._size >= self.max_bytes:
            self._hand_over()

    def _quote(self, stream: str) -> str:
        quoted = encode_basestring(stream)
        if len(self._quoted) < 100_000:
            self._quoted[stream] = quoted
        return quoted

    def _fragment_text(self, message: LoggedMessage) -> str:
        """``"<stream>","seq":<seq>,"msgId":"<msgId>"``: the part of a line that names the message."""
        quoted = self._quoted.get(message[0]) or self._quote(message[0])
        return f'{quoted},"seq":{message[1]},"msgId":{encode_basestring(message[2])}'

    def _fragment(self, message: LoggedMessage) -> str:
        """:meth:`_fragment_text`, remembered for the message's later events."""
        fragment = self._fragment_text(message)
        if len(self._fragments) >= _MAX_FRAGMENTS:
            self._fragments.clear()  # messages that never reached a final event; rebuilt on demand
        self._fragments[message] = fragment
        return fragment

    def lifecycle(self, event: Event, epoch: int) -> None:
        if self.directory is None:
            return
        self._write(
            f'{{"event":"{event.value}","ts":"{now_ts()}",{self._static}"epoch":{epoch},"direction":null,'
            f'{self._pair}"stream":null,"seq":null,"msgId":null,"attempt":null}}\n'
        )
        self.records += 1

    def messages(
        self,
        event: Event,
        epoch: int,
        direction: Direction,
        messages: Sequence[LoggedMessage],
        *,
        attempt: int | None = None,
        ts: str | None = None,
        first: bool = False,
        final: bool = False,
    ) -> None:
        """One record per message (``(stream, seq, msgId, ...)``), all with one timestamp and ``attempt``.

        A message is logged several times on its way (accepted, forwarded, delivered, confirmed);
        the quoted ``stream``/``seq``/``msgId`` part of its line is built on its first event and
        reused until ``final`` (its last event) forgets it. That makes every later record one dict
        lookup, done with ``map`` over the dict's own method, and the batch's lines are one
        ``str.join`` of the fragments with ``tail + head`` between them (no per-line formatting).
        """
        if self.directory is None:
            return
        if not messages:
            return
        head = (
            f'{{"event":"{event.value}","ts":"{ts or now_ts()}",{self._static}"epoch":{epoch},'
            f'"direction":"{direction.value}",{self._pair}"stream":'
        )
        tail = f',"attempt":{"null" if attempt is None else attempt}}}\n'
        fragments = self._fragments
        if first:  # the messages' first event: build every fragment in one loop and remember them
            quoted, quote = self._quoted, self._quote
            texts = [
                f'{quoted.get(m[0]) or quote(m[0])},"seq":{m[1]},"msgId":{encode_basestring(m[2])}'
                for m in messages
            ]
            if len(fragments) < _MAX_FRAGMENTS:
                fragments.update(zip(messages, texts, strict=True))
        elif final:
            try:  # map() over the dict's own method runs in C; a miss (rare) takes the slow path
                texts = list(map(fragments.pop, messages))
            except KeyError:
                texts = [fragments.pop(m, "") or self._fragment_text(m) for m in messages]
        else:
            found: list[str | None] = list(map(fragments.get, messages))
            if None in found:
                texts = [text or self._fragment(m) for m, text in zip(messages, found, strict=True)]
            else:
                texts = cast(list[str], found)
        # Every line is head + fragment + tail: one C join over the fragments builds the batch.
        self._write(head + (tail + head).join(texts) + tail)
        self.records += len(texts)
