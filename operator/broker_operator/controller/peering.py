"""Joining kopf's peering before kopf looks at it: wait for the peering object, announce early.

kopf decides which replica handles the BrokerClusters from the records in the peering object
(``KopfPeering`` per watched namespace, ``ClusterKopfPeering`` cluster-wide): a replica that
sees a live record of higher priority pauses. Two gaps let two replicas handle at once:

* Helm creates custom resources after Deployments, so on a first install the operator pods can
  start before the peering object exists. kopf's keep-alive then finds nothing to write, its
  watch then sees the object appear empty, and every replica resumes; they see each other only
  at the next keep-alive, 20 to 25 s later (measured: two replicas granting epochs 1 to 3 to
  two brokers in turn at install; the compare-and-swap kept each epoch single).
* Replicas started at the same instant each list the object before the other's first record.

So, before kopf starts its peering (startup handlers run first), each replica waits for the
object (bounded), writes its own record in kopf's format, and waits a moment for the records of
replicas started with it: kopf's first listing then holds them all, and only the highest resumes.
Peering decides who handles; the epoch compare-and-swap stays the fence (``epochs.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

PEERING_OBJECT_WAIT_SECONDS: Final = 60.0
"""How long a starting replica waits for the peering object before leaving it to kopf (which
handles nothing until the object exists)."""
POLL_SECONDS: Final = 0.25
SETTLE_SECONDS: Final = 1.0
"""After its own record is written: long enough for a replica started at the same instant to
have written its record too (each polls for the object every 0.25 s)."""

log = logging.getLogger(__name__)


class PeeringApi(Protocol):
    async def peering_exists(self, name: str, namespace: str | None) -> bool: ...

    async def write_peer(
        self, name: str, namespace: str | None, identity: str, record: Mapping[str, Any]
    ) -> None: ...


def peer_record(priority: int, lifetime_seconds: int, now: datetime | None = None) -> dict[str, Any]:
    """A replica's record as kopf writes it (``kopf._core.engines.peering.Peer.as_dict``)."""
    seen = now or datetime.now(UTC)
    return {"priority": int(priority), "lifetime": int(lifetime_seconds), "lastseen": seen.isoformat()}


def own_identity() -> str | None:
    """kopf's identity for this replica when it is predictable: ``POD_ID`` (the chart sets the pod's
    name). Otherwise kopf makes one with random parts, and no record can be written for it."""
    return os.environ.get("POD_ID") or None


async def join_peering(
    api: PeeringApi,
    name: str,
    namespaces: tuple[str, ...],
    *,
    priority: int,
    lifetime_seconds: int,
    identity: str | None,
    wait_seconds: float = PEERING_OBJECT_WAIT_SECONDS,
    settle_seconds: float = SETTLE_SECONDS,
) -> bool:
    """Wait for each peering object, write this replica's record into it, settle; True if all were
    found within ``wait_seconds`` (else a warning: kopf pauses until they exist anyway)."""
    places: list[str | None] = list(namespaces) or [None]
    deadline = time.monotonic() + wait_seconds
    missing = list(places)
    said = False
    while missing:
        missing = [place for place in missing if not await api.peering_exists(name, place)]
        if not missing:
            break
        if time.monotonic() >= deadline:
            log.warning(
                "peering %r: no %s after %.0f s; kopf handles nothing until it exists (the chart creates it)",
                name,
                _describe(name, missing),
                wait_seconds,
            )
            return False
        if not said:
            log.info("peering %r: waiting for %s (the chart creates it)", name, _describe(name, missing))
            said = True
        await asyncio.sleep(POLL_SECONDS)
    if identity is not None:
        record = peer_record(priority, lifetime_seconds)
        for place in places:
            await api.write_peer(name, place, identity, record)
        log.info("peering %r: announced %s (priority %d) before kopf's first look", name, identity, priority)
        await asyncio.sleep(settle_seconds)
    return True


def _describe(name: str, places: list[str | None]) -> str:
    return ", ".join(
        f"ClusterKopfPeering {name!r}" if place is None else f"KopfPeering {place}/{name}" for place in places
    )
