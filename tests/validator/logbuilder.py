"""Hand-written message-log histories for the validator's tests: a few records, exactly placed.

``History`` writes records as a broker would (``broker_contracts.message_log.encode``, segments
named by ``segment_name`` and sealed with the sha256 of their bytes, ``sealed_segment_name``, in
``<store>/<cluster>/<broker>/``), with a clock the test moves, so a
test states the history it means record by record. Generated histories at scale come from
``broker_validator.synthetic``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker_contracts.message_log import (
    CLOSED_SEGMENT_SUFFIX,
    MessageLogRecord,
    encode,
    format_ts,
    sealed_segment_name,
    segment_name,
    segment_stem,
)

START = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@dataclass
class History:
    store: Path
    cluster: str = "c1"
    now: datetime = START
    open: dict[str, list[MessageLogRecord]] = field(default_factory=dict)
    index: int = 0

    def tick(self, ms: float = 1.0) -> None:
        self.now += timedelta(milliseconds=ms)

    def log(  # noqa: PLR0917  # the record's fields, in the schema's order
        self,
        event: str,
        broker: str,
        epoch: int,
        direction: str | None = None,
        stream: str | None = None,
        seq: int | None = None,
        *,
        attempt: int | None = None,
    ) -> None:
        self.open.setdefault(broker, []).append(
            MessageLogRecord(
                event=event,
                ts=format_ts(self.now),
                cluster=self.cluster,
                broker=broker,
                epoch=epoch,
                direction=direction,
                account="acme",
                company="1000",
                stream=stream,
                seq=seq,
                msgId=None if seq is None else f"{direction}-{stream}-{seq}",
                attempt=attempt,
            )
        )

    def relay(
        self,
        broker: str,
        epoch: int,
        stream: str,
        seqs: range,
        *,
        direction: str = "outbound",
        delivered: bool = True,
    ) -> None:
        """Accepted, forwarded, delivered and confirmed, one message after the other."""
        for seq in seqs:
            self.log("accepted", broker, epoch, direction, stream, seq)
            self.tick()
            self.log("forwarded", broker, epoch, direction, stream, seq, attempt=1)
            self.tick()
            if delivered:
                self.log("delivered", broker, epoch, direction, stream, seq)
                self.tick()
                self.log("confirmed", broker, epoch, direction, stream, seq)
                self.tick()

    def close(self, broker: str | None = None) -> list[Path]:
        """Write the open records of ``broker`` (default: every broker) as closed segments."""
        written = []
        for name in [broker] if broker else sorted(self.open):
            records = self.open.pop(name, [])
            if not records:
                continue
            directory = self.store / self.cluster / name
            directory.mkdir(parents=True, exist_ok=True)
            stem = segment_name(name, self.now, self.index).removesuffix(CLOSED_SEGMENT_SUFFIX)
            self.index += 1
            written.append(write_sealed(directory / stem, b"".join(encode(record) for record in records)))
        return written


def write_sealed(stem: Path, data: bytes) -> Path:
    """``data`` as a closed segment ``<stem>.<sha256>.jsonl``, as a broker closes one."""
    path = stem.with_name(sealed_segment_name(stem.name, hashlib.sha256(data).hexdigest()))
    path.write_bytes(data)
    return path


def reseal(path: Path, data: bytes) -> Path:
    """Replace a closed segment by one holding ``data`` (a test writing what a broker might)."""
    path.unlink()
    return write_sealed(path.with_name(segment_stem(path.name)), data)
