"""bench/bench_operator.py's heartbeat stand-in: one process serving many brokers' ``Heartbeat``.

Each broker is a loopback address (``address``: 127.<group>.x.y) with a listener on one port;
the stand-in keeps each address's active flag and epoch, refuses stale epochs as a broker does,
and with ``refuse_activations`` stores each activation's epoch and then refuses it with
``BACKEND_UNREACHABLE``, as a broker whose backend and cloud are unreachable. Per address it
also keeps the longest time between two accepted ``active=true`` heartbeats (``Renewals``), and
prints them as one JSON line on SIGUSR1: from outside the operator's process, how long a broker
went without its lease renewed.

A handover renewal (``leaseSeconds``, from a stopping operator) is honoured as a broker honours
it: only by a renewal of an active address at its epoch, capped at ``max_lease_seconds``; a value
that is not a finite number above 0 is refused. The lease it grants is recorded, and so is every
renewal that came after the lease then in force had run out (``lapsed``: a real broker would have
fenced itself by then). Benchmark scaffolding, not a broker: the engine's integration tests use
real brokers.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import time

__all__ = ["TOKEN", "Renewals", "StandinProtocol", "address", "serve_standin"]

TOKEN = "bench-operator-token-of-32-bytes"  # the operator refuses a token under 32 bytes
LEASE_SECONDS = 5.0  # the clusters' heartbeat.leaseSeconds in the benchmarks (the design's default)
MAX_LEASE_SECONDS = 30.0  # what their pods would get as BROKER_MAX_LEASE_SECONDS (handoverLeaseSeconds)
_ACTIVE = re.compile(rb"<(?:\w+:)?active>(true|false|1|0)</")
_EPOCH = re.compile(rb"<(?:\w+:)?epoch>(\d+)</")
_CHECK = re.compile(rb"<(?:\w+:)?renewLease>\s*(?:false|0)\s*</")
_LEASE = re.compile(rb"<(?:\w+:)?leaseSeconds>([^<]*)</")
_LENGTH = re.compile(rb"(?i)content-length:\s*(\d+)")
_AUTH = f"Bearer {TOKEN}".encode()
_REPLY = (
    '<?xml version="1.0" encoding="utf-8"?>'
    '<soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Body>'
    '<HeartbeatResponse xmlns="http://broker.failover.dev/soap/v1">'
    "<state>{state}</state>{code}<epoch>{epoch}</epoch></HeartbeatResponse></soap:Body></soap:Envelope>"
)


_UNREACHABLE = (
    "<unavailabilityCode>BACKEND_UNREACHABLE</unavailabilityCode>"
    "<unavailabilityMessage>POST http://127.0.0.1:1/resend failed: connection refused</unavailabilityMessage>"
)


def address(group: int, index: int) -> str:
    return f"127.{group}.{index // 250 + 1}.{index % 250 + 1}"


class Renewals:
    """Per broker address, the longest time between two accepted ``active=true`` heartbeats since
    the last report: how long a real broker would have gone without its lease renewed. Also the
    leases handover renewals granted, and the renewals that came after the lease in force (the
    normal one, or a handover's) had run out: a real broker would have fenced itself."""

    def __init__(self, lease_seconds: float = LEASE_SECONDS) -> None:
        self.lease_seconds = lease_seconds
        self.last: dict[str, float] = {}
        self.longest: dict[str, float] = {}
        self.deadline: dict[str, float] = {}  # when the lease in force runs out
        self.handover_leases: list[float] = []
        self.lapsed = 0

    def renewed(self, host: str, *, granted: float | None = None, activation: bool = False) -> None:
        """An accepted ``active=true``; ``granted``: a handover's lease; ``activation``: a new term."""
        now = time.monotonic()
        previous = self.last.get(host)
        self.last[host] = now
        if previous is not None and now - previous > self.longest.get(host, 0.0):
            self.longest[host] = now - previous
        deadline = self.deadline.get(host)
        if deadline is not None and now > deadline and not activation:
            self.lapsed += 1
        if activation or deadline is None:
            deadline = -math.inf  # a new term starts with a normal lease, as a broker's does
        if granted is not None:
            self.handover_leases.append(granted)
        self.deadline[host] = max(deadline, now + (self.lease_seconds if granted is None else granted))

    def snapshot(self) -> dict[str, object]:
        return {
            "longest_gaps": sorted(self.longest.values()),
            "handover_leases": sorted(self.handover_leases),
            "lapsed": self.lapsed,
        }

    def report(self) -> None:
        """One JSON line on stdout (the bench reads it on SIGUSR1), then start over."""
        print(json.dumps(self.snapshot()), flush=True)
        self.longest.clear()
        self.handover_leases.clear()
        self.lapsed = 0


class StandinProtocol(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the heartbeat stand-in.

    Deliberately minimal (no chunked bodies, no error pages): aiohttp's server
    costs more CPU per request than the operator's client, and on a 2-core
    machine two aiohttp stand-ins serving 2,000 brokers starved the very process
    being measured. This is benchmark scaffolding, not product code.
    """

    def __init__(
        self,
        state: dict[str, tuple[bool, int]],
        refuse_activations: bool = False,
        renewals: Renewals | None = None,
        max_lease_seconds: float = MAX_LEASE_SECONDS,
    ) -> None:
        self.state = state
        self.renewals = renewals if renewals is not None else Renewals()
        self.refuse_activations = refuse_activations
        self.max_lease_seconds = max_lease_seconds
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.host = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.host = str(transport.get_extra_info("sockname")[0])

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            length_match = _LENGTH.search(head)
            length = int(length_match.group(1)) if length_match else 0
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            self.transport.write(self.answer(head, body))

    def answer(self, head: bytes, body: bytes) -> bytes:
        active_match, epoch_match = _ACTIVE.search(body), _EPOCH.search(body)
        if _AUTH not in head or not active_match or not epoch_match:
            return b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
        active, epoch = active_match.group(1) in (b"true", b"1"), int(epoch_match.group(1))
        asked = _lease_asked(body)
        if asked is not None and not (math.isfinite(asked) and asked > 0):
            return b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"  # a broker's fault
        was_active, stored = self.state.get(self.host, (False, 0))
        if active and epoch < stored:
            code = "<unavailabilityCode>STALE_EPOCH</unavailabilityCode>"
            text = _REPLY.format(state="Unavailable", code=code, epoch=stored)
        elif active and self.refuse_activations:
            # A broker stores the epoch first, then its activation fails on the unreachable backend.
            self.state[self.host] = (False, max(epoch, stored))
            text = _REPLY.format(state="Unavailable", code=_UNREACHABLE, epoch=max(epoch, stored))
        else:
            self.state[self.host] = (active, max(epoch, stored))
            text = _REPLY.format(state="Active" if active else "Inactive", code="", epoch=max(epoch, stored))
            if active:
                # Honoured as a broker honours it: a renewal of the active at its epoch, capped.
                handover = asked is not None and was_active and epoch == stored and not _CHECK.search(body)
                granted = min(asked, self.max_lease_seconds) if handover and asked is not None else None
                self.renewals.renewed(self.host, granted=granted, activation=not was_active or epoch > stored)
        payload = text.encode()
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/xml; charset=utf-8\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )


def _lease_asked(body: bytes) -> float | None:
    """The ``leaseSeconds`` a heartbeat asks, NaN when it is no number, None when absent."""
    match = _LEASE.search(body)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return math.nan


def serve_standin(group: int, count: int, refuse_activations: bool, port: int) -> None:
    state: dict[str, tuple[bool, int]] = {}
    renewals = Renewals()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, renewals.report)
        for index in range(count):
            await loop.create_server(
                lambda: StandinProtocol(state, refuse_activations, renewals),
                address(group, index),
                port,
                backlog=512,
            )
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
