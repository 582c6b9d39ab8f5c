"""Node faults on a sealed cluster of several nodes, and the layout that keeps the traffic out of
their way (issue 22): used by the soak, ``bench-drain`` and the three-node e2e tests.

The layout: the simulators and CoreDNS run on the quiet node (``node-1``), the brokers on the
other nodes, one a node. A crash or partition of the active's node then takes one broker (and
maybe an operator replica), never the traffic's source and sink, nor every name lookup: the
cluster runs one CoreDNS replica, and the backend resolves the ``-active`` Service again every
10 s.

A drain is limited to the brokers' and the operator's pods (``DRAINED_PODS``): the simulators are
bare pods with no controller to re-create them, which a real drain would refuse without
``--force``; CoreDNS is pinned to the quiet node and would wait there.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from local_cluster.sealed_cluster import SealedCluster

QUIET_NODE = "node-1"
HOSTNAME = "kubernetes.io/hostname"
DRAINED_PODS = "app.kubernetes.io/name in (broker, broker-failover)"


def brokers_off_node_and_apart(cluster_name: str, node: str = QUIET_NODE) -> dict[str, Any]:
    """``spec.affinity`` for a BrokerCluster: never on ``node``, never two brokers on one node."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": HOSTNAME, "operator": "NotIn", "values": [node]}]}
                ]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": HOSTNAME,
                    "labelSelector": {"matchLabels": {"broker.failover.dev/cluster": cluster_name}},
                }
            ]
        },
    }


def move_cluster_dns(cluster: SealedCluster, node: str = QUIET_NODE) -> None:
    """Pin CoreDNS to ``node`` and wait for the rollout (a no-op when it is there already)."""
    patch = {"spec": {"template": {"spec": {"nodeSelector": {HOSTNAME: node}}}}}
    dns = ("-n", "kube-system")
    cluster.kubectl(*dns, "patch", "deployment", "coredns", "--type=merge", "-p", json.dumps(patch))
    cluster.kubectl(*dns, "rollout", "status", "deployment/coredns", "--timeout=120s", timeout=150)


def drain(
    cluster: SealedCluster, node: str, selector: str = DRAINED_PODS, timeout_seconds: int = 150
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``kubectl drain`` of ``node`` (cordon, then evict what ``selector`` picks, retrying what a
    budget refuses); the command's result, not checked, and how long it took."""
    started = time.monotonic()
    result = cluster.kubectl(
        "drain", node, f"--pod-selector={selector}", "--ignore-daemonsets", "--delete-emptydir-data",
        f"--timeout={timeout_seconds}s", timeout=timeout_seconds + 30, check=False,
    )  # fmt: skip
    return result, time.monotonic() - started


def unready_nodes(cluster: SealedCluster) -> list[str]:
    """Nodes not Ready, or cordoned: what a fault left to put back."""
    listed = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return sorted(
        node["metadata"]["name"]
        for node in listed
        if node["spec"].get("unschedulable")
        or not any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    )
