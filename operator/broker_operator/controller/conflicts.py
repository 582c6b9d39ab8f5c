"""Which BrokerCluster may serve an (account, company) pair when several in a namespace claim it.

Two clusters serving one pair would mean two active brokers for it, the one
thing the design forbids. The rule is deterministic so that every operator
replica, and every restart, reaches the same verdict without coordination: the
earliest ``creationTimestamp`` wins, ties broken by name; every later claimant
goes to phase ``Conflict`` and runs nothing. When the winner is deleted the
next one in that order takes over on its next reconciliation.

Pure functions over claims gathered by a kopf index; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class PairClaim:
    """One BrokerCluster's claim on its pair; ordering is the precedence (earliest first)."""

    created: str  # RFC 3339 UTC from the API server: sorts lexically in time order
    name: str


def pair_key(namespace: str, account: str, company: str) -> tuple[str, str, str]:
    return (namespace, account, company)


def conflicting_owner(me: PairClaim, claims: Iterable[PairClaim]) -> str | None:
    """The name of the cluster that holds ``me``'s pair instead of ``me``, or None if ``me`` holds it."""
    rivals = sorted({*claims, me})
    winner = rivals[0]
    return None if winner == me else winner.name
