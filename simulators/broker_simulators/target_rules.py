"""What both simulators share: the epoch fence, the receiving side of a delivery, and poison marks.

The simulators stand in for the SAP backend and the cloud service in tests,
benchmarks and the demo. They are real HTTP servers speaking
:mod:`broker_contracts.relay`, so the broker under test cannot tell them from
real adapters. Both follow the same target rules:

* :class:`EpochFence`: remember the highest broker epoch seen; refuse a lower
  one with HTTP 409 (the broker then fences itself).
* :class:`Receiver`: take each stream's messages in request order, drop
  duplicates by ``(stream, seq)``, and record what was taken, in arrival order,
  in memory (for ``GET /sim/received``) and in a file (one
  ``stream<TAB>seq<TAB>msgId`` line per message), so tests can prove order and
  loss from outside.
* Poison: a payload that starts with ``POISON:<n>:`` is refused the first
  ``n`` times it arrives (``n`` = ``always`` refuses forever); the rest of its
  stream in that request is ``skipped``. That is how tests make a message
  poison without mocking anything.

The simulators share the benchmark machine's cores with the broker they
measure, so they are kept cheap: JSON goes through the relay codec, orjson when
installed (:func:`read_json`, :func:`json_reply`), and both run on uvloop when it is
installed (:func:`use_fastest_event_loop`).

Not here: producing messages (each simulator does its own side).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from broker_contracts import relay

POISON_PREFIX = "POISON:"


def use_fastest_event_loop() -> None:
    """uvloop as the event loop policy if installed; the simulators behave the same on asyncio's."""
    try:
        import uvloop  # optional
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def json_reply(body: object, status: int = 200) -> web.Response:
    """``web.json_response`` with the relay codec (orjson when installed; bytes, no ``str`` trip)."""
    return web.Response(body=relay.dumps(body), status=status, content_type="application/json")


def poison_payload(times: int | None, filler: str = "") -> str:
    """A payload the receiving simulator refuses ``times`` times (``None``: always)."""
    return f"{POISON_PREFIX}{'always' if times is None else times}:{filler}"


class EpochFence:
    def __init__(self) -> None:
        self.seen = 0
        self.refused = 0

    def check(self, request: web.Request) -> web.Response | None:
        """``None`` if the caller's epoch is acceptable, else the 409/400 response to send."""
        text = request.headers.get(relay.EPOCH_HEADER)
        try:
            epoch = int(text) if text is not None else None
        except ValueError:
            epoch = None
        if epoch is None:
            error = f"header {relay.EPOCH_HEADER} (the broker's epoch, decimal) is required; got {text!r}"
            return json_reply({"error": error}, status=400)
        if epoch < self.seen:
            self.refused += 1
            reply: relay.StaleEpochReply = {
                "error": f"epoch {epoch} is below epoch {self.seen} already seen; another broker is active",
                "seenEpoch": self.seen,
            }
            return json_reply(reply, status=relay.STALE_EPOCH_STATUS)
        self.seen = epoch
        return None


class BadRequestError(ValueError):
    pass


def parse_messages(body: Any, key: str = "messages") -> list[tuple[str, int, str, str]]:
    """Check a request's message list against the wire shape ``[stream, seq, msgId, payload]``."""
    if not isinstance(body, dict) or not isinstance(body.get(key), list):
        raise BadRequestError(f"body must be a JSON object with a {key!r} list")
    messages = []
    for item in body[key]:
        if (
            not isinstance(item, list)
            or len(item) != 4
            or not isinstance(item[0], str)
            or not isinstance(item[1], int)
            or not isinstance(item[2], str)
            or not isinstance(item[3], str)
        ):
            raise BadRequestError(f"message {item!r:.100} is not [stream, seq, msgId, payload]")
        messages.append((item[0], item[1], item[2], item[3]))
    return messages


async def read_json(request: web.Request) -> Any:
    try:
        return relay.loads(await request.read())
    except ValueError as error:
        raise BadRequestError(f"body is not JSON: {error}") from None


class Receiver:
    """The receiving side of a target: in-order per request, dedup, poison, recording."""

    def __init__(self, record_path: Path | None) -> None:
        self.seen: dict[str, set[int]] = {}
        self.order: dict[str, list[int]] = {}
        self.taken = 0
        self.duplicates = 0
        self.rejected = 0
        self._poison_refusals: dict[tuple[str, int], int] = {}
        self._record = open(record_path, "a", encoding="utf-8") if record_path else None  # noqa: SIM115

    def close(self) -> None:
        if self._record is not None:
            self._record.close()

    def _refuse(self, stream: str, seq: int, payload: str) -> bool:
        spec = payload[len(POISON_PREFIX) :].split(":", 1)[0]
        refused = self._poison_refusals.get((stream, seq), 0)
        if spec != "always" and refused >= int(spec or 0):
            return False
        self._poison_refusals[(stream, seq)] = refused + 1
        return True

    def receive(self, messages: list[tuple[str, int, str, str]]) -> relay.DeliveryReply:
        results: list[str] = []
        reasons: dict[str, str] = {}
        stopped: set[str] = set()
        lines: list[str] = []
        ok, duplicate = relay.DeliveryStatus.OK.value, relay.DeliveryStatus.DUPLICATE.value
        for index, (stream, seq, msg_id, payload) in enumerate(messages):
            if stream in stopped:
                results.append(relay.DeliveryStatus.SKIPPED.value)
                continue
            seen = self.seen.get(stream)
            if seen is None:
                seen = self.seen[stream] = set()
                self.order[stream] = []
            if seq in seen:
                self.duplicates += 1
                results.append(duplicate)
                continue
            if payload.startswith(POISON_PREFIX) and self._refuse(stream, seq, payload):
                self.rejected += 1
                stopped.add(stream)
                results.append(relay.DeliveryStatus.REJECTED.value)
                reasons[str(index)] = f"simulated poison: {stream} seq {seq} refused"
                continue
            seen.add(seq)
            self.order[stream].append(seq)
            lines.append(f"{stream}\t{seq}\t{msg_id}\n")
            results.append(ok)
        self.taken += len(lines)
        if self._record is not None and lines:
            self._record.write("".join(lines))
            self._record.flush()
        return {"results": results, "reasons": reasons}


def bad_request(error: Exception) -> web.Response:
    return json_reply({"error": str(error)}, status=400)
