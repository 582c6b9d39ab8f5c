"""Joining kopf's peering before kopf looks at it: wait for the peering object, rank below every
live replica, announce early.

kopf decides which replica handles the BrokerClusters from the records in the peering object
(``KopfPeering`` per watched namespace, ``ClusterKopfPeering`` cluster-wide): a replica that
sees a live record of higher priority pauses, and resumes when none is left. Three gaps let two
replicas handle at once:

* Helm creates custom resources after Deployments, so on a first install the operator pods can
  start before the peering object exists. kopf's keep-alive then finds nothing to write, its
  watch then sees the object appear empty, and every replica resumes; they see each other only
  at the next keep-alive, 20 to 25 s later (measured: two replicas granting epochs 1 to 3 to
  two brokers in turn at install; the compare-and-swap kept each epoch single).
* Replicas started at the same instant each list the object before the other's first record.
* A priority taken from the clock when the process starts does not say who joined first. A
  replica that took its priority first but whose record landed later (a slow first API call on a
  loaded node) outranked the replica that had joined, found itself alone and resumed: that one
  paused and handed every cluster over, seconds into the install, and the two engines overlapped
  (the drain test's flake; ``tests/e2e/test_two_replicas_at_install.py``).

So, before kopf starts its peering (startup handlers run first), each replica waits for the
object (bounded), reads the records in it, takes a priority below every live record but its own
(its start-time priority when that is lower already), and writes its record in kopf's format on
condition of the object's ``resourceVersion`` it read: two replicas joining at once are ordered by
the API server, and the second one re-reads and ranks below the first. Whoever joined first
therefore always ranks highest, and a replica never outranks one already handling. kopf starts at
once after that write: a record its first listing may miss was written later, so it ranks lower
and pauses itself. This matters after a kill -9, where the restarted container must renew the
leases within ``leaseSeconds`` (issue 40). A pinned priority (``--peering-priority``) is kept as it
is and written unconditionally, so that replica then waits a moment, so that kopf's first listing
usually holds every record. Peering decides who handles; the epoch compare-and-swap stays the
fence (``epochs.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

PEERING_OBJECT_WAIT_SECONDS: Final = 60.0
"""How long a starting replica waits for the peering object before leaving it to kopf (which
handles nothing until the object exists)."""
POLL_SECONDS: Final = 0.25
SETTLE_SECONDS: Final = 1.0
"""After a pinned priority's record is written (unordered by the API server): long enough for a
replica started at the same instant to have written its record too (each polls for the object
every 0.25 s)."""
WRITE_ATTEMPTS: Final = 10
"""Conditional writes of the record before giving up (each loses only to another replica's write)."""

log = logging.getLogger(__name__)


class PeeringConflict(Exception):  # noqa: N818 - the API server's 409, named for what it means here
    """The peering object changed since it was read: read it again and rank again."""


class PeeringApi(Protocol):
    async def read_peering(self, name: str, namespace: str | None) -> Mapping[str, Any] | None:
        """The peering object, or None if it does not exist."""
        ...

    async def write_peer(
        self,
        name: str,
        namespace: str | None,
        identity: str,
        record: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> None:
        """Merge ``record`` into the object's status under ``identity``; with ``resource_version``,
        only if the object is still at that version, else raise :class:`PeeringConflict`."""
        ...


@dataclass(frozen=True)
class Joined:
    found: bool  # every peering object was there within the wait
    priority: int  # the priority to run kopf's peering with


def peer_record(priority: int, lifetime_seconds: int, now: datetime | None = None) -> dict[str, Any]:
    """A replica's record as kopf writes it (``kopf._core.engines.peering.Peer.as_dict``)."""
    seen = now or datetime.now(UTC)
    return {"priority": int(priority), "lifetime": int(lifetime_seconds), "lastseen": seen.isoformat()}


def live_priorities(
    peering: Mapping[str, Any] | None, *, besides: str | None, now: datetime | None = None
) -> list[int]:
    """The priorities of the records in ``peering`` that kopf counts as alive (``lastseen`` plus
    ``lifetime`` not yet past), but ``besides``'s own; unreadable records are left out."""
    moment = now or datetime.now(UTC)
    found: list[int] = []
    for identity, record in ((peering or {}).get("status") or {}).items():
        if identity == besides or not isinstance(record, Mapping):
            continue
        try:
            seen = datetime.fromisoformat(str(record["lastseen"]))
            if seen.tzinfo is None:
                seen = seen.replace(tzinfo=UTC)
            alive = seen + timedelta(seconds=int(record.get("lifetime", 60))) > moment
            priority = int(record.get("priority", 0))
        except (KeyError, TypeError, ValueError):
            continue
        if alive:
            found.append(priority)
    return found


def rank_below(priority: int, live: list[int]) -> int:
    """``priority``, or one below the lowest live record when that is not lower already: strictly
    below every live record (kopf pauses every replica that shares a priority)."""
    return min(priority, min(live) - 1) if live else priority


def own_identity() -> str | None:
    """kopf's identity for this replica when it is predictable: ``POD_ID`` (the chart sets the pod's
    name). Otherwise kopf makes one with random parts, and no record can be written for it."""
    return os.environ.get("POD_ID") or None


async def _wait_for_objects(
    api: PeeringApi, name: str, places: list[str | None], wait_seconds: float
) -> dict[str | None, Mapping[str, Any]] | None:
    deadline = time.monotonic() + wait_seconds
    said = False
    while True:
        found = {place: await api.read_peering(name, place) for place in places}
        missing = [place for place, body in found.items() if body is None]
        if not missing:
            return {place: body for place, body in found.items() if body is not None}
        if time.monotonic() >= deadline:
            log.warning(
                "peering %r: no %s after %.0f s; kopf handles nothing until it exists (the chart creates it)",
                name,
                _describe(name, missing),
                wait_seconds,
            )
            return None
        if not said:
            log.info("peering %r: waiting for %s (the chart creates it)", name, _describe(name, missing))
            said = True
        await asyncio.sleep(POLL_SECONDS)


async def join_peering(
    api: PeeringApi,
    name: str,
    namespaces: tuple[str, ...],
    *,
    priority: int,
    lifetime_seconds: int,
    identity: str | None,
    pinned: bool = False,
    wait_seconds: float = PEERING_OBJECT_WAIT_SECONDS,
    settle_seconds: float = SETTLE_SECONDS,
) -> Joined:
    """Wait for each peering object, rank below every live replica (unless ``pinned``), write this
    replica's record into each on condition of its version (``pinned``: unconditionally, then
    settle). ``Joined.found`` is False if an object was missing after ``wait_seconds`` (a warning:
    kopf pauses until they exist anyway)."""
    places: list[str | None] = list(namespaces) or [None]
    objects = await _wait_for_objects(api, name, places, wait_seconds)
    if objects is None:
        return Joined(found=False, priority=priority)
    chosen = priority
    for _ in range(WRITE_ATTEMPTS):
        if not pinned:
            live = [p for body in objects.values() for p in live_priorities(body, besides=identity)]
            chosen = rank_below(priority, live)
        if identity is None:
            break  # kopf's identity is random: nothing to write, but still ranked below the others
        try:
            for place, body in objects.items():
                version = None if pinned else body.get("metadata", {}).get("resourceVersion")
                await api.write_peer(name, place, identity, peer_record(chosen, lifetime_seconds), version)
        except PeeringConflict:
            # Another replica wrote since the read: its record may rank where this one would.
            objects = {place: await api.read_peering(name, place) or body for place, body in objects.items()}
            continue
        log.info(
            "peering %r: announced %s (priority %d%s) before kopf's first look",
            name,
            identity,
            chosen,
            "" if chosen == priority else ", below every live replica",
        )
        if pinned:
            await asyncio.sleep(settle_seconds)
        break
    else:
        log.warning("peering %r: the record of %s kept losing to other writes; left to kopf", name, identity)
    return Joined(found=True, priority=chosen)


def _describe(name: str, places: list[str | None]) -> str:
    return ", ".join(
        f"ClusterKopfPeering {name!r}" if place is None else f"KopfPeering {place}/{name}" for place in places
    )
