"""The segment and store writers and the clock: log lines byte for byte as a broker writes them.

Lines are built as :mod:`broker_service.message_log_writer` builds them (schema field order, no
spaces): a per-bundle ``head``/``tail`` around cached per-message fragments joined in C, written in
blocks of about a megabyte, into ``<store>/<cluster>/<broker>/<segment>.<sha256>.jsonl`` named by
:func:`broker_contracts.message_log.segment_name` and sealed with the sha256 of its bytes on close,
as a broker seals its segments. This is where the generator's speed comes from;
most of the remaining time is the kernel writing. What it deliberately does not do: decide what a
record says or when it happens. Times come in as µs since the epoch, already chosen.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from broker_contracts.message_log import sealed_segment_name, segment_name, segment_stem

_UNIX = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"start {moment!r} has no time zone; message-log times are UTC")
    delta = moment.astimezone(UTC) - _UNIX
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    return _UNIX + timedelta(microseconds=micros)


class Clock:
    """Formats µs-since-epoch ints as the schema's ts, the date part once per second (as
    ``message_log_writer.now_ts`` does)."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def text(self, micros: int) -> str:
        second, fraction = divmod(micros, 1_000_000)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{fraction:06d}Z"


class SegmentWriter:
    """One broker's segments: records go into a block, blocks into the open file; a segment is
    closed after ``segment_records`` records (only between bundles) and at the end of a term."""

    def __init__(self, store: StoreWriter, cluster: str, broker: str, account: str, company: str) -> None:
        self.store = store
        self.broker = broker
        self.directory = store.root / cluster / broker
        self.static = f'"cluster":"{cluster}","broker":"{broker}",'
        self.pair = f'"account":"{account}","company":"{company}",'
        self.index = 0
        self.file: Any = None
        self.path: Path | None = None
        self.parts: list[str] = []
        self.digest = hashlib.sha256()
        self.segment_records = 0

    def _open(self, micros: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / segment_name(self.broker, from_micros(micros), self.index)
        self.index += 1
        self.file = open(self.path, "wb")  # noqa: SIM115  # closed in close(), spans many calls
        self.digest = hashlib.sha256()
        self.segment_records = 0

    def messages(
        self, event: str, micros: int, epoch: int, direction: str, *, attempt: int | None, frags: list[str]
    ) -> None:
        if not frags:
            return
        if self.file is None:
            self._open(micros)
        head = (
            f'{{"event":"{event}","ts":"{self.store.clock.text(micros)}",{self.static}"epoch":{epoch},'
            f'"direction":"{direction}",{self.pair}"stream":'
        )
        tail = ',"attempt":null}\n' if attempt is None else f',"attempt":{attempt}}}\n'
        self.parts.append(head + (tail + head).join(frags) + tail)
        self.segment_records += len(frags)
        self.store.records += len(frags)
        if len(self.parts) >= 64:
            self.flush()

    def lifecycle(self, event: str, micros: int, epoch: int) -> None:
        if self.file is None:
            self._open(micros)
        self.parts.append(
            f'{{"event":"{event}","ts":"{self.store.clock.text(micros)}",{self.static}"epoch":{epoch},'
            f'"direction":null,{self.pair}"stream":null,"seq":null,"msgId":null,"attempt":null}}\n'
        )
        self.segment_records += 1
        self.store.records += 1

    def flush(self) -> None:
        if self.parts:
            blob = "".join(self.parts).encode()
            self.parts.clear()
            self.file.write(blob)
            self.digest.update(blob)
            self.store.bytes += len(blob)

    def close_if_full(self) -> None:
        if self.segment_records >= self.store.segment_records:
            self.close()

    def close(self) -> None:
        if self.file is None:
            return
        self.flush()
        self.file.close()
        self.file = None
        assert self.path is not None
        sealed = self.path.with_name(
            sealed_segment_name(segment_stem(self.path.name), self.digest.hexdigest())
        )
        os.replace(self.path, sealed)
        self.store.segments.append(sealed)
        self.path = None


def sealed_path(path: Path, data: bytes) -> Path:
    """Where a segment holding ``data`` is closed to: its name with the sha256 of ``data``."""
    return path.with_name(sealed_segment_name(segment_stem(path.name), hashlib.sha256(data).hexdigest()))


def reseal(path: Path, data: bytes) -> Path:
    """Replace the closed segment ``path`` by one holding ``data``, sealed with its checksum."""
    sealed = sealed_path(path, data)
    sealed.write_bytes(data)
    if sealed != path:
        path.unlink()
    return sealed


@dataclass
class StoreWriter:
    """What one part writes, over every cluster and broker: the shared clock and the totals."""

    root: Path
    segment_records: int
    clock: Clock = field(default_factory=Clock)
    records: int = 0
    bytes: int = 0
    segments: list[Path] = field(default_factory=list)
