"""Shared pieces of the plugin's unit tests: BrokerCluster bodies and a stand-in for the API calls."""

from __future__ import annotations

import copy
from typing import Any

from broker_operator.kubectl_plugin.errors import UsageError
from broker_operator.kubectl_plugin.kube import BrokerAddress


def cluster_body(**status: Any) -> dict[str, Any]:
    """BrokerCluster ``orders`` (two pods) with a Healthy status unless ``status`` overrides fields."""
    base: dict[str, Any] = {
        "phase": "Healthy",
        "active": "orders-0",
        "epoch": 3,
        "failovers": 1,
        "brokers": [
            {"name": "orders-1", "priority": 1, "state": "Inactive", "unavailabilityCode": None,
             "unavailabilityMessage": None, "lastHeartbeatTime": "2026-11-23T11:59:50.000000Z"},
            {"name": "orders-0", "priority": 0, "state": "Active", "unavailabilityCode": None,
             "unavailabilityMessage": None, "lastHeartbeatTime": "2026-11-23T11:59:55.000000Z"},
        ],
        "lastFailover": {"time": "2026-11-23T11:00:00Z", "from": "orders-1", "to": "orders-0",
                         "reason": "ActiveUnavailable", "durationMs": 812},
        "conditions": [{"type": "SpecValid", "status": "True", "reason": "Valid", "message": "ok"}],
    }  # fmt: skip
    base.update(status)
    return {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {"account": "acme", "company": "1000", "replicas": 2},
        "status": base,
    }


class FakeKube:
    """The :class:`Kube` calls the commands make, over an in-memory BrokerCluster whose status a test
    scripts: each ``get_cluster`` after a patch takes the next scripted status (the last one stays)."""

    namespace = "shop"

    def __init__(self, body: dict[str, Any], after_patch: list[dict[str, Any]] | None = None) -> None:
        self.body = body
        self.after_patch = list(after_patch or [])
        self.patches: list[str | None] = []
        self.token = "operator-token"
        self.secrets: dict[tuple[str, str], bytes] = {}  # (Secret, key) -> decoded value

    def get_cluster(self, name: str) -> dict[str, Any]:
        if name != self.body["metadata"]["name"]:
            raise UsageError(f"BrokerCluster {name!r} not found in namespace shop")
        if self.patches and self.after_patch:
            status = self.after_patch.pop(0) if len(self.after_patch) > 1 else self.after_patch[0]
            self.body["status"] = {**self.body["status"], **status}
        return copy.deepcopy(self.body)

    def set_preferred_active(self, name: str, broker: str | None) -> None:
        self.patches.append(broker)
        self.body["spec"]["preferredActive"] = broker

    def broker_addresses(self, body: dict[str, Any]) -> list[BrokerAddress]:
        return [BrokerAddress("orders-0", "http://127.0.0.10:8080/soap"), BrokerAddress("orders-1", None)]

    def operator_token(self, body: dict[str, Any]) -> str:
        return self.token

    def secret_bytes(self, secret: str, key: str) -> bytes | None:
        return self.secrets.get((secret, key))
