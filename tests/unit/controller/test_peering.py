"""Ranking a joining replica below every live one (controller/peering.py): the records kopf counts
as alive, and the compare-and-swap that orders two replicas joining at once. The same join against
a real API server, and with two operator processes: tests/e2e/test_peering_join.py and
tests/e2e/test_two_replicas_at_install.py."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from broker_operator.controller.peering import (
    PeeringConflict,
    join_peering,
    live_priorities,
    peer_record,
    rank_below,
)

NOW = datetime(2026, 11, 28, 1, 0, tzinfo=UTC)


def peering(**records: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "resourceVersion": "1"}, "status": records}


def test_live_records_but_ones_own_count() -> None:
    body = peering(
        me=peer_record(50, 60, NOW),
        other=peer_record(40, 60, NOW - timedelta(seconds=59)),
        expired=peer_record(90, 60, NOW - timedelta(seconds=61)),
        cleared=peer_record(80, 0, NOW),  # kopf's record of a replica that stopped
        unreadable={"priority": 70},
    )
    assert live_priorities(body, besides="me", now=NOW) == [40]
    assert live_priorities(None, besides="me", now=NOW) == []


def test_a_joining_replica_ranks_strictly_below_every_live_one() -> None:
    assert rank_below(100, []) == 100
    assert rank_below(100, [40, 70]) == 39  # older start, later join: below the replicas there
    assert rank_below(10, [40, 70]) == 10  # below them already


class Peerings:
    """One peering object with a resourceVersion, as the API server keeps it; ``rival`` writes a
    record just after the first read, as a replica joining at the same instant."""

    def __init__(self, rival: tuple[str, int] | None = None) -> None:
        self.body: dict[str, Any] = peering()
        self.rival = rival
        self.writes: list[tuple[str, int, str | None]] = []

    async def read_peering(self, name: str, namespace: str | None) -> Mapping[str, Any] | None:
        body = {"metadata": dict(self.body["metadata"]), "status": dict(self.body["status"])}
        if self.rival is not None:
            identity, priority = self.rival
            self.rival = None
            self._store(identity, peer_record(priority, 60))
        return body

    async def write_peer(
        self,
        name: str,
        namespace: str | None,
        identity: str,
        record: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> None:
        self.writes.append((identity, int(record["priority"]), resource_version))
        if resource_version is not None and resource_version != self.body["metadata"]["resourceVersion"]:
            raise PeeringConflict(resource_version)
        self._store(identity, dict(record))

    def _store(self, identity: str, record: dict[str, Any]) -> None:
        self.body["status"][identity] = record
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)


async def test_a_replica_that_loses_the_write_to_another_ranks_again_below_it() -> None:
    api = Peerings(rival=("operator-l", 20))
    joined = await join_peering(
        api, "p", ("ns",), priority=30, lifetime_seconds=60, identity="operator-h", settle_seconds=0
    )
    assert joined.found and joined.priority == 19
    assert api.writes == [("operator-h", 30, "1"), ("operator-h", 19, "2")]
    assert api.body["status"]["operator-h"]["priority"] == 19


async def test_a_pinned_priority_is_kept() -> None:
    api = Peerings(rival=("operator-l", 20))
    joined = await join_peering(
        api, "p", ("ns",), priority=30, lifetime_seconds=60, identity="h", pinned=True, settle_seconds=0
    )
    assert joined.priority == 30 and api.writes == [("h", 30, None)]


async def test_a_ranked_join_hands_over_to_kopf_at_once() -> None:
    # A restarted container (kill -9) must renew the leases within leaseSeconds: no settle after a
    # write the API server ordered. A settle of an hour would run past the bound and fail here.
    api = Peerings(rival=("operator-l", 20))
    join = join_peering(
        api, "p", ("ns",), priority=30, lifetime_seconds=60, identity="h", settle_seconds=3600
    )
    joined = await asyncio.wait_for(join, timeout=10)
    assert joined.priority == 19
