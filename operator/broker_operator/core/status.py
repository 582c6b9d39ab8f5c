"""The BrokerCluster status fields the failover engine owns, and their camelCase patch.

``ClusterStatus`` is what the engine hands the shell in ``record_status``; it is
also what the shell hands back at start (``ClusterStatus.from_status``) so that a
restarted operator knows the last active and the highest epoch it was granted.

Why ``lastHeartbeatTime`` is left out of equality: status is written only when
something changes, never once per heartbeat. The times are refreshed whenever
some other field changes, which is often enough for a person reading
``kubectl describe`` and costs the API server nothing in the steady state.

Why ``epoch`` is read but never written here: ``status.epoch`` has exactly one
writer, the compare-and-swap that allocates it (``controller/epochs.py``, conditional
on the ``resourceVersion`` it read). A status patch carrying the epoch had no such
precondition, so an engine that stalled past another's allocation wrote its lower
epoch back, and the next allocation handed out an epoch a broker had already been
given. ``ClusterStatus.epoch`` is the engine's view of it, for metrics and the local
runner's lines; it takes no part in equality, so a grant alone causes no status write.

This module does not own ``ordering``, ``conditions``, ``observedGeneration`` or
the ``Conflict`` phase: the validator and the controller write those.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    PENDING = "Pending"  # the engine has not yet settled who is active
    HEALTHY = "Healthy"  # an active and every standby ready
    DEGRADED = "Degraded"  # an active, but a standby is missing or unavailable
    FAILING_OVER = "FailingOver"  # a failover or planned move is under way
    UNAVAILABLE = "Unavailable"  # no broker could be activated


def format_time(wall: float) -> str:
    """RFC 3339 UTC text for a ``time.time()`` value, as Kubernetes writes date-times.

    The same text as ``datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")``
    (microseconds rounded half to even, as ``fromtimestamp`` rounds them), with the date
    and time of day formatted once per second: the engine renders each broker's last
    heartbeat at every step, and ``strftime`` was a few percent of the operator's CPU.
    """
    fraction, whole = math.modf(wall)
    micros = round(fraction * 1e6)
    if micros >= 1_000_000:
        micros -= 1_000_000
        whole += 1
    elif micros < 0:
        micros += 1_000_000
        whole -= 1
    return f"{_whole_second(int(whole))}.{micros:06d}Z"


def parse_time(text: str) -> float | None:
    """The ``time.time()`` value of a date-time :func:`format_time` wrote (or any RFC 3339 text
    with a zone); None for text that is not one. ``format_time(parse_time(t)) == t`` for its own
    text: a double holds today's seconds to a quarter of a microsecond."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


@functools.lru_cache(maxsize=64)
def _whole_second(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class BrokerStatus:
    name: str
    priority: int
    state: str  # Active | Inactive | Unavailable | Unknown
    unavailability_code: str | None = None
    unavailability_message: str | None = None
    last_heartbeat_time: str | None = field(default=None, compare=False)

    def to_patch(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "priority": self.priority,
            "state": self.state,
            "unavailabilityCode": self.unavailability_code,
            "unavailabilityMessage": self.unavailability_message,
            "lastHeartbeatTime": self.last_heartbeat_time,
        }


@dataclass(frozen=True)
class LastFailover:
    time: str
    from_: str | None
    to: str | None
    reason: str
    duration_ms: int

    def to_patch(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "from": self.from_,
            "to": self.to,
            "reason": self.reason,
            "durationMs": self.duration_ms,
        }


# Keys that show an engine ran (or an epoch was granted); the controller alone writes only
# ``phase``, ``conflictsWith``, ``conditions`` and ``observedGeneration``.
_WRITTEN_BY_ENGINE = ("epoch", "active", "brokers", "lastFailover", "failovers")


@dataclass(frozen=True)
class ClusterStatus:
    phase: str = Phase.PENDING.value
    active: str | None = None
    # The highest epoch ever granted to this cluster, as the engine knows it. Read back at
    # start; never in the patch (see the module docstring) and not part of "changed".
    epoch: int = field(default=0, compare=False)
    brokers: tuple[BrokerStatus, ...] = ()
    last_failover: LastFailover | None = None
    failovers: int = 0
    # The epoch ``active`` was activated with, written with it. ``epoch`` runs ahead of it from
    # an allocation until the new active's status lands; a restarted engine that finds them apart
    # cannot tell who holds ``epoch`` and allocates above it (``knowledge.initial_state``).
    active_epoch: int | None = None

    def to_status_patch(self) -> dict[str, Any]:
        """The camelCase ``status`` dict for a Kubernetes merge patch; without ``epoch``, whose
        only writer is the epoch allocation's compare-and-swap."""
        return {
            "phase": self.phase,
            "active": self.active,
            "activeEpoch": self.active_epoch,
            "brokers": [broker.to_patch() for broker in self.brokers],
            "lastFailover": self.last_failover.to_patch() if self.last_failover else None,
            "failovers": self.failovers,
        }

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> ClusterStatus | None:
        """Read back what an earlier engine wrote and the granted epoch (``None`` when neither is there)."""
        if not status or not any(key in status for key in _WRITTEN_BY_ENGINE):
            return None
        last = status.get("lastFailover")
        return cls(
            phase=str(status.get("phase") or Phase.PENDING.value),
            active=status.get("active") or None,
            epoch=int(status.get("epoch") or 0),
            brokers=tuple(
                BrokerStatus(
                    name=str(b.get("name")),
                    priority=int(b.get("priority") or 0),
                    state=str(b.get("state") or "Unknown"),
                    unavailability_code=b.get("unavailabilityCode"),
                    unavailability_message=b.get("unavailabilityMessage"),
                    last_heartbeat_time=b.get("lastHeartbeatTime"),
                )
                for b in status.get("brokers") or ()
                if isinstance(b, Mapping)
            ),
            last_failover=LastFailover(
                time=str(last.get("time")),
                from_=last.get("from"),
                to=last.get("to"),
                reason=str(last.get("reason")),
                duration_ms=int(last.get("durationMs") or 0),
            )
            if isinstance(last, Mapping)
            else None,
            failovers=int(status.get("failovers") or 0),
            active_epoch=int(status["activeEpoch"]) if status.get("activeEpoch") is not None else None,
        )
