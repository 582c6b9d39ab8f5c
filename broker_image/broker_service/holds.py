"""Held (poison) messages: the record of a message that failed ``maxDeliveries`` times.

Both directions keep their held messages in a :class:`HoldQueue`, keyed by
``(stream, seq)``. Under ``BlockStream`` the held message also stops its stream;
under ``Hold`` the stream goes on without it. Either way the message is kept,
never dropped, until an operator replays or discards it (the admin SOAP
operations). The queue itself is bookkeeping only: where the message's bytes
live (the outbound journal, the cloud's resend list) is the direction's
business, which is why holding survives a broker restart by being re-detected
(the message fails again and is held again), not by being journaled here.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_contracts.message_log import Direction
from broker_service.soap_codec import HeldMessageView

HeldMessage = tuple[str, int, str, str]
"""``(stream, seq, msgId, payload)``, the same shape as a journaled message."""


@dataclass(slots=True)
class HeldEntry:
    direction: Direction
    message: HeldMessage
    attempts: int
    last_error: str
    held_since: str  # xsd:dateTime text, UTC

    @property
    def stream(self) -> str:
        return self.message[0]

    @property
    def seq(self) -> int:
        return self.message[1]

    def view(self) -> HeldMessageView:
        return HeldMessageView(
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
