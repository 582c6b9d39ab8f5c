"""The heartbeat stand-in, recording what a real broker's lease would have seen: each renewal's time
and the lease it granted, each activation, each lease that ran out.

``bench_operator_k8s.py`` runs two of these (``python bench/standin_records.py GROUP COUNT``), one per
broker group of ``heartbeat_standin.py`` (127.1.x.y the priority-0 brokers, 127.2.x.y the
priority-1 ones), and reads their records around each scenario (an operator upgrade, restart,
kill -9). The answers are ``heartbeat_standin.StandinProtocol``'s: this module only watches the
requests and replies go by (``RecordingProtocol.answer``), so it stays out of the stand-in's own
code. Per broker it keeps:

- whether it holds an active lease, at which epoch, and until when: an accepted ``active=true``
  heartbeat that renews (``renewLease`` absent or true) grants ``leaseSeconds`` when the request
  carries it (a handover renewal), capped at ``--max-lease-seconds``, else ``--lease-seconds``, as
  the broker does (docs/failover-engine.md);
- since the last report: its longest time between two renewals while active (an activation at a
  new epoch ends a gap too; still active and unrenewed at the report: the time until then), how
  many times a renewal came after the lease it had been granted ran out (a real broker would have
  fenced itself), its activations (an accepted ``active=true`` when it held no lease, or at
  another epoch; ``new_epoch`` when above every epoch it was active at before), the leases
  requested, and the renewals and handover renewals counted.

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
    """Per broker address, what its lease went through since the last report (module docstring)."""

    def __init__(self, group: int, lease_seconds: float, max_lease_seconds: float) -> None:
        self.group = group
        self.lease_seconds = lease_seconds
        self.max_lease_seconds = max(max_lease_seconds, lease_seconds)
        self.held: dict[str, Held] = {}
        self.highest_epoch: dict[str, int] = {}
        self._start_over()

    def _start_over(self) -> None:
        self.since = time.monotonic()
        self.longest: dict[str, float] = {}
        self.lapsed: Counter[str] = Counter()
        self.activations: list[tuple[int, int, float, bool]] = []  # (cluster, epoch, wall time, new epoch)
        self.leases: Counter[str] = Counter()
        self.renewals = 0
        self.handovers = 0

    def granted(self, requested: float | None) -> float:
        return self.lease_seconds if requested is None else min(requested, self.max_lease_seconds)

    def answered(self, host: str, body: bytes, reply: bytes) -> None:
        """One heartbeat ``body`` and the stand-in's ``reply`` to it."""
        active, epoch, state = _ACTIVE.search(body), _EPOCH.search(reply), _STATE.search(reply)
        if not active or not epoch or not state:
            return  # refused before the protocol (500): nothing changed on the broker
        now = time.monotonic()
        accepted = state.group(1) == b"Active"
        if active.group(1) in (b"false", b"0"):
            if not accepted:
                self.held.pop(host, None)  # told it is a standby, and it is one
            return
        if not accepted:
            return  # a stale epoch, or the activation failed: the lease it holds (if any) is unchanged
        renew = _RENEW.search(body)
        if renew and renew.group(1) in (b"false", b"0"):
            return  # a check of the active that renews nothing
        lease = _LEASE.search(body)
        requested = float(lease.group(1)) if lease else None
        self.leases["default" if requested is None else f"{requested:g}"] += 1
        reply_epoch = int(epoch.group(1))
        held = self.held.get(host)
        if held is not None:
            self.longest[host] = max(self.longest.get(host, 0.0), now - held.renewed)
            if now > held.until:
                self.lapsed[host] += 1
        if held is None or held.epoch != reply_epoch or now > held.until:
            new_epoch = reply_epoch > self.highest_epoch.get(host, 0)
            self.activations.append((cluster_index(host), reply_epoch, time.time(), new_epoch))
        else:
            self.renewals += 1
            self.handovers += requested is not None
        self.highest_epoch[host] = max(reply_epoch, self.highest_epoch.get(host, 0))
        self.held[host] = Held(reply_epoch, now, now + self.granted(requested))

    def report(self) -> dict[str, Any]:
        """The records since the last report, then start over."""
        now = time.monotonic()
        longest = dict(self.longest)
        lapsed = Counter(self.lapsed)
        for host, held in self.held.items():
            if held.until <= self.since:
                continue  # ran out before this period began: that period's report said so
            longest[host] = max(longest.get(host, 0.0), now - held.renewed)  # unrenewed until now
            if held.until < now:
                lapsed[host] += 1  # ran out and not renewed since: a real broker has fenced itself
        record = {
            "group": self.group,
            "lease_seconds": self.lease_seconds,
            "max_lease_seconds": self.max_lease_seconds,
            "held": sorted(cluster_index(h) for h, held in self.held.items() if held.until > now),
            "longest_gaps": {str(cluster_index(h)): gap for h, gap in longest.items()},
            "lapsed": {str(cluster_index(h)): n for h, n in lapsed.items()},
            "activations": self.activations,
            "leases": dict(self.leases),
            "renewals": self.renewals,
            "handover_renewals": self.handovers,
        }
        self._start_over()
        return record


class RecordingProtocol(StandinProtocol):
    """``StandinProtocol``, its every answer also handed to ``LeaseRecords``."""

    def __init__(self, records: LeaseRecords, state: dict[str, Any], **standin: Any) -> None:
        super().__init__(state, **standin)
        self.records = records

    def answer(self, head: bytes, body: bytes) -> bytes:
        reply = super().answer(head, body)
        self.records.answered(self.host, body, reply)
        return reply


def serve_recording_standin(group: int, count: int, port: int, records: LeaseRecords) -> None:
    """``heartbeat_standin.serve_standin`` with records; SIGUSR1 prints them (one JSON line)."""
    state: dict[str, Any] = {}

    def report() -> None:
        print(json.dumps(records.report()), flush=True)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, report)
        for index in range(count):
            await loop.create_server(
                lambda: RecordingProtocol(records, state), address(group, index), port, backlog=512
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
