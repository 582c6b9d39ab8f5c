"""The journal claims' retention policy, decided without Kubernetes (kmock runs it in
test_operator_kmock.py, the real API server and garbage collector in tests/e2e)."""

from __future__ import annotations

from typing import Any

from broker_operator.controller.bodies import ClaimBody, OwnerReference, PodBody
from broker_operator.controller.claims import (
    SurplusClaim,
    claim_ordinal,
    surplus_claims,
    wanted_owner_references,
)

OURS: OwnerReference = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "name": "orders",
    "uid": "uid-now",
}
EARLIER: OwnerReference = {**OURS, "uid": "uid-before"}  # a BrokerCluster of that name, deleted since
FOREIGN: OwnerReference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": "uid-x"}


def claim(uid: str, **meta: Any) -> ClaimBody:
    return {"metadata": {"uid": uid, **meta}}


def test_claim_ordinals_are_read_from_this_clusters_claim_names_only() -> None:
    assert claim_ordinal("orders", "journal-orders-2") == 2
    assert claim_ordinal("orders", "journal-orders-12") == 12
    assert claim_ordinal("orders", "journal-orders-x") is None
    assert claim_ordinal("orders", "journal-orders-eu-0") is None  # cluster "orders-eu"'s claim
    assert claim_ordinal("orders", "journal-order-0") is None
    assert claim_ordinal("orders", "message-logs") is None


def test_owner_references_follow_the_policy_and_keep_others() -> None:
    # whenDeleted: Delete on an unowned claim adds the reference; on an owned one changes nothing.
    assert wanted_owner_references("orders", [], [OURS]) == [OURS]
    assert wanted_owner_references("orders", [FOREIGN, OURS], [OURS]) is None
    # whenDeleted: Retain takes ours away and leaves a reference someone else put there.
    assert wanted_owner_references("orders", [FOREIGN, OURS], []) == [FOREIGN]
    assert wanted_owner_references("orders", [], []) is None
    # A reference to an earlier BrokerCluster of the same name is replaced, never kept: the garbage
    # collector would delete a claim whose only owner no longer exists.
    assert wanted_owner_references("orders", [EARLIER], [OURS]) == [OURS]
    assert wanted_owner_references("orders", [EARLIER], []) == []


def test_a_surplus_claim_is_a_candidate_only_once_its_pod_is_gone_and_it_is_not_active() -> None:
    claims = {
        "journal-orders-0": claim("u0"),
        "journal-orders-1": claim("u1"),
        "journal-orders-2": claim("u2"),
        "journal-orders-3": claim("u3"),
        "journal-orders-4": claim("u4", deletionTimestamp="2026-11-23T10:00:00Z"),
    }
    pods: dict[str, PodBody] = {"orders-0": {}, "orders-1": {}, "orders-3": {}}
    found = surplus_claims("orders", 2, claims, pods, active="orders-0")
    # 0 and 1 are wanted; 3's pod is still there; 4 is already going.
    assert found == [SurplusClaim("journal-orders-2", "u2", "orders-2")]
    # The recorded active keeps its claim even with its pod gone: the engine has not moved yet.
    assert surplus_claims("orders", 2, claims, pods, active="orders-2") == []
    # Scaled back up: nothing is surplus.
    assert surplus_claims("orders", 5, claims, {}, active=None) == []
