"""Held (poison) messages: the record of a message that failed ``maxDeliveries`` times.

Both directions keep their held messages in a :class:`HoldQueue`, keyed by
``(stream, seq)``. Under ``BlockStream`` the held message also stops its stream;
under ``Hold`` the stream goes on without it. Either way the message is kept,
never dropped, until an operator replays or discards it (the admin SOAP
operations), or until this broker learns from the source that another broker
resolved it (:class:`Release`).

The queue is bookkeeping: where the message's bytes live (the outbound journal,
the cloud's resend list) is the direction's business. The hold itself is
journaled (``H`` and ``R`` records, :mod:`broker_service.journal`), so a
restarted broker knows what it held, with the same attempts and ``heldSince``,
and does not try the message again. Each entry remembers whether it stops its
stream, so a restart under another ``onPoison`` setting keeps what was decided.

Not here: deciding when to hold (the stream table and the inbound poller), and
anything about another broker's holds: brokers do not share journals.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from broker_contracts import soap
from broker_contracts.message_log import Direction

HeldMessage = tuple[str, int, str, str]
"""``(stream, seq, msgId, payload)``, the same shape as a journaled message."""


class Release(StrEnum):
    """How a hold ended, as the journal's ``R`` record says."""

    REPLAYED = "replayed"  # an operator put it back for delivery
    DISCARDED = "discarded"  # an operator dropped it; outbound, the watermark may pass it
    RESOLVED = "resolved"  # the source shows another broker had it confirmed


@dataclass(slots=True)
class HeldEntry:
    direction: Direction
    message: HeldMessage  # inbound entries recovered from the journal carry no payload (the cloud has it)
    attempts: int
    last_error: str
    held_since: str  # xsd:dateTime text, UTC
    blocks_stream: bool = False  # held under BlockStream: its stream stops here

    @property
    def stream(self) -> str:
        return self.message[0]

    @property
    def seq(self) -> int:
        return self.message[1]

    def view(self) -> soap.HeldMessage:
        return soap.HeldMessage(
            direction=self.direction.value,
            stream=self.stream,
            seq=self.seq,
            msg_id=self.message[2],
            attempts=self.attempts,
            last_error=self.last_error,
            held_since=self.held_since,
        )


class HoldQueue:
    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], HeldEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: HeldEntry) -> None:
        self._entries[(entry.stream, entry.seq)] = entry

    def get(self, stream: str, seq: int) -> HeldEntry | None:
        return self._entries.get((stream, seq))

    def pop(self, stream: str, seq: int) -> HeldEntry | None:
        return self._entries.pop((stream, seq), None)

    def entries(self, stream: str | None = None) -> list[HeldEntry]:
        found = [e for e in self._entries.values() if stream is None or e.stream == stream]
        return sorted(found, key=lambda e: (e.stream, e.seq))

    def lowest_seq(self, stream: str) -> int | None:
        seqs = [seq for (name, seq) in self._entries if name == stream]
        return min(seqs) if seqs else None

    def drop_upto(self, stream: str, upto: int) -> None:
        """Forget holds another broker already resolved (the backend confirmed past them)."""
        for key in [k for k in self._entries if k[0] == stream and k[1] <= upto]:
            del self._entries[key]

    def blocked_streams(self) -> set[str]:
        return {stream for stream, _ in self._entries}
