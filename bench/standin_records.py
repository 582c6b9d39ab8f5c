"""The heartbeat stand-in with a broker's lease, recording what that lease went through: each
renewal's time and the lease it granted, each activation, each lease that ran out.

``bench_operator_k8s.py`` runs two of these (``python bench/standin_records.py GROUP COUNT``), one per
broker group of ``heartbeat_standin.py`` (127.1.x.y the priority-0 brokers, 127.2.x.y the
priority-1 ones), and reads their records around each scenario (an operator upgrade, restart,
kill -9). The answers are ``heartbeat_standin.StandinProtocol``'s, except where a real broker's
lease changes them (``RecordingProtocol``; docs/broker.md, "Self-fencing"):

- an accepted ``active=true`` heartbeat that renews (``renewLease`` absent or true) at the epoch
  the broker is active at grants ``leaseSeconds`` when the request carries it (a handover renewal),
  capped at ``--max-lease-seconds``, else ``--lease-seconds``; an activation grants
  ``--lease-seconds``;
- a broker whose lease ran out fences itself: it is no longer active, and ``active=true`` at or
  below the epoch it fenced at gets ``Unavailable/LEASE_EXPIRED``, so the operator must activate a
  broker at a new epoch (that is the reactivation the benchmark counts).

Per broker, since the last report: its longest time between two renewals while active (still
active at the report: until then; fenced: until the fence was seen), how many times its lease ran
out, its activations (an accepted ``active=true`` when it held no lease, or at another epoch;
``new_epoch`` when above every epoch it was active at before), the leases requested, and the
renewals and handover renewals counted.

SIGUSR1 prints it all as one JSON line on stdout and starts the counts over (the leases held stay).
Benchmark scaffolding, not a broker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.heartbeat_standin import StandinProtocol, address  # the root is on the path now

__all__ = ["LeaseRecords", "RecordingProtocol", "cluster_index", "serve_recording_standin"]

_ACTIVE = re.compile(rb"<(?:\w+:)?active>(true|false|1|0)</")
_EPOCH = re.compile(rb"<(?:\w+:)?epoch>(\d+)</")
_RENEW = re.compile(rb"<(?:\w+:)?renewLease>(true|false|1|0)</")
_LEASE = re.compile(rb"<(?:\w+:)?leaseSeconds>([^<]+)</")
_STATE = re.compile(rb"<(?:\w+:)?state>(\w+)</")


_LEASE_EXPIRED = (
    '<?xml version="1.0" encoding="utf-8"?>'
    '<soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Body>'
    '<HeartbeatResponse xmlns="http://broker.failover.dev/soap/v1"><state>Unavailable</state>'
    "<unavailabilityCode>LEASE_EXPIRED</unavailabilityCode>"
    "<unavailabilityMessage>this broker fenced itself at epoch {fenced}: activate it with an epoch above"
    " {fenced}</unavailabilityMessage><epoch>{epoch}</epoch></HeartbeatResponse></soap:Body></soap:Envelope>"
)


def cluster_index(host: str) -> int:
    """The cluster whose broker listens on ``host`` (``heartbeat_standin.address``'s inverse)."""
    _, _, high, low = (int(part) for part in host.split("."))
    return (high - 1) * 250 + (low - 1)


@dataclass
class Held:
    """A broker's active lease as the broker would keep it."""

    epoch: int
    renewed: float  # monotonic: the last renewal or the activation
    until: float  # monotonic: when the lease granted then runs out


class LeaseRecords:
    """Per broker address, its lease as a real broker keeps it, and what that lease went through
    since the last report (module docstring). ``state`` is the stand-in's own (active, epoch) per
    address, which a fence sets inactive."""

    def __init__(self, group: int, lease_seconds: float, max_lease_seconds: float) -> None:
        self.group = group
        self.lease_seconds = lease_seconds
        self.max_lease_seconds = max_lease_seconds
        self.state: dict[str, tuple[bool, int]] = {}
        self.held: dict[str, Held] = {}
        self.fenced: dict[str, int] = {}  # the epoch each self-fenced broker fenced itself at
        self.highest_epoch: dict[str, int] = {}
        self._start_over()

    def _start_over(self) -> None:
        self.longest: dict[str, float] = {}
        self.lapsed: Counter[str] = Counter()
        self.activations: list[tuple[int, int, float, bool]] = []  # (cluster, epoch, wall time, new epoch)
        self.leases: Counter[str] = Counter()
        self.renewals = 0
        self.handovers = 0
        self.handed: set[str] = set()  # brokers that got a handover renewal

    def expire(self, host: str, now: float) -> int | None:
        """A broker whose lease ran out fences itself (it is no longer active, and only an epoch
        above the one it fenced at activates it again); the epoch it is fenced at, if it is."""
        held = self.held.get(host)
        if held is not None and now > held.until:
            del self.held[host]
            self.longest[host] = max(self.longest.get(host, 0.0), now - held.renewed)
            self.lapsed[host] += 1
            self.fenced[host] = held.epoch
            self.state[host] = (False, self.state.get(host, (False, held.epoch))[1])
        return self.fenced.get(host)

    def answered(self, host: str, body: bytes, reply: bytes, now: float) -> None:
        """One heartbeat ``body`` and the stand-in's ``reply`` to it, the broker's lease not run out."""
        active, epoch, state = _ACTIVE.search(body), _EPOCH.search(reply), _STATE.search(reply)
        if not active or not epoch or not state:
            return  # refused before the protocol (500): nothing changed on the broker
        accepted = state.group(1) == b"Active"
        if active.group(1) in (b"false", b"0"):
            if not accepted:
                self.held.pop(host, None)  # told it is a standby, and it is one
            return
        renew = _RENEW.search(body)
        if not accepted or (renew and renew.group(1) in (b"false", b"0")):
            return  # a stale epoch, a failed activation or a check: its lease (if any) is unchanged
        lease = _LEASE.search(body)
        requested = float(lease.group(1)) if lease else None
        self.leases["default" if requested is None else f"{requested:g}"] += 1
        reply_epoch = int(epoch.group(1))
        held = self.held.get(host)
        granted = self.lease_seconds
        if held is None or held.epoch != reply_epoch:  # a new term: a normal lease, as a broker's
            new_epoch = reply_epoch > self.highest_epoch.get(host, 0)
            self.activations.append((cluster_index(host), reply_epoch, time.time(), new_epoch))
            self.fenced.pop(host, None)
        else:
            self.longest[host] = max(self.longest.get(host, 0.0), now - held.renewed)
            self.renewals += 1
            if requested is not None:  # a handover renewal: the broker grants it, capped
                self.handovers += 1
                self.handed.add(host)
                granted = min(requested, self.max_lease_seconds)
        self.highest_epoch[host] = max(reply_epoch, self.highest_epoch.get(host, 0))
        self.held[host] = Held(reply_epoch, now, now + granted)

    def report(self) -> dict[str, Any]:
        """The records since the last report, then start over; a lease that ran out since its last
        heartbeat fences its broker now (as the broker's lease watcher would have)."""
        now = time.monotonic()
        for host in list(self.held):
            self.expire(host, now)
        for host, held in self.held.items():
            self.longest[host] = max(self.longest.get(host, 0.0), now - held.renewed)  # unrenewed until now
        record = {
            "group": self.group,
            "lease_seconds": self.lease_seconds,
            "max_lease_seconds": self.max_lease_seconds,
            "held": sorted(cluster_index(h) for h in self.held),
            "longest_gaps": {str(cluster_index(h)): gap for h, gap in self.longest.items()},
            "lapsed": {str(cluster_index(h)): n for h, n in self.lapsed.items()},
            "activations": self.activations,
            "leases": dict(self.leases),
            "renewals": self.renewals,
            "handover_renewals": self.handovers,
            "handed_over": sorted(cluster_index(h) for h in self.handed),
        }
        self._start_over()
        return record


class RecordingProtocol(StandinProtocol):
    """``StandinProtocol`` with the broker's lease: a broker whose lease ran out answers
    ``LEASE_EXPIRED`` to ``active=true`` at or below the epoch it fenced itself at; every other
    answer is the stand-in's, handed to ``LeaseRecords``."""

    def __init__(self, records: LeaseRecords, **standin: Any) -> None:
        super().__init__(records.state, **standin)
        self.records = records

    def answer(self, head: bytes, body: bytes) -> bytes:
        now = time.monotonic()
        fenced_at = self.records.expire(self.host, now)
        active, epoch = _ACTIVE.search(body), _EPOCH.search(body)
        asks = active is not None and active.group(1) in (b"true", b"1")
        if fenced_at is not None and asks and epoch and int(epoch.group(1)) <= fenced_at:
            stored = self.records.state.get(self.host, (False, fenced_at))[1]
            return _http(_LEASE_EXPIRED.format(epoch=stored, fenced=fenced_at))
        reply = super().answer(head, body)
        self.records.answered(self.host, body, reply, now)
        return reply


def _http(text: str) -> bytes:
    payload = text.encode()
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/xml; charset=utf-8\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def serve_recording_standin(group: int, count: int, port: int, records: LeaseRecords) -> None:
    """``heartbeat_standin.serve_standin`` with records; SIGUSR1 prints them (one JSON line)."""

    def report() -> None:
        print(json.dumps(records.report()), flush=True)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, report)
        for index in range(count):
            await loop.create_server(
                lambda: RecordingProtocol(records), address(group, index), port, backlog=512
            )
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("group", type=int, help="1: 127.1.x.y, 2: 127.2.x.y")
    parser.add_argument("count", type=int)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--lease-seconds", type=float, default=5.0, help="the clusters' heartbeat.leaseSeconds"
    )
    parser.add_argument(
        "--max-lease-seconds",
        type=float,
        default=30.0,
        help="the longest lease a handover renewal may ask (the brokers' --max-lease-seconds)",
    )
    args = parser.parse_args()
    records = LeaseRecords(args.group, args.lease_seconds, args.max_lease_seconds)
    serve_recording_standin(args.group, args.count, args.port, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
