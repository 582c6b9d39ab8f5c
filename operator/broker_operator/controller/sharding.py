"""Which BrokerClusters an operator process drives when several share them: ``--shard I/N``.

One process heartbeats 2,000 clusters at 1 Hz within one core (docs/benchmarks.md, "Operator
scale"). Past that, run N operator Deployments, each with ``--shard i/N`` (i = 0 … N-1): shard i
drives the clusters whose ``crc32("<namespace>/<name>") mod N`` is i, so every cluster has
exactly one shard, the same in every process, and the shards need not talk to each other.
kopf's peering stays what it is within a shard (replicas of that shard; give each shard its own
peering name): it elects who handles, it does not divide the work.

What is not sharded: the index of (account, company) claims. Every shard indexes every
BrokerCluster of its namespaces, so each decides ``Conflict`` from the same claims, whichever
shard the rival cluster belongs to (controller/conflicts.py).

Changing the layout (one process to N shards, or N to M): each shard's finalizer names its
layout, so clusters keep the finalizer of the layout they had, and nobody of the new layout removes
it: a cluster deleted later would stay Terminating. Remove the old layout's finalizers by hand
after the change (docs/operator.md, "Shards"). Doing it in the operator raced kopf's own
index-based finalizer patches in tests, so it is not automatic.

Not a fence: two processes configured with different N (a rollout from 2 shards to 3) may drive
one cluster for a while. The epochs and leases keep that safe, as with two replicas of one
operator (docs/failover-engine.md); sharding only divides the load.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from broker_operator.controller.names import GROUP

__all__ = ["Shard"]

_SYNTAX = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: need 0 <= index < count")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"i/N"``, as ``--shard`` and ``OPERATOR_SHARD`` take it."""
        match = _SYNTAX.fullmatch(text)
        if match is None:
            raise ValueError(f"shard {text!r}: expected INDEX/COUNT, e.g. 0/2")
        return cls(int(match.group(1)), int(match.group(2)))

    def drives(self, namespace: str, name: str) -> bool:
        """Whether this shard drives the BrokerCluster ``namespace/name``."""
        return zlib.crc32(f"{namespace}/{name}".encode()) % self.count == self.index

    @property
    def finalizer(self) -> str:
        """kopf's finalizer for this shard (kopf removes its finalizer wherever no handler of its
        own needs it, so the shards must not share one)."""
        return f"{GROUP}/shard-{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
