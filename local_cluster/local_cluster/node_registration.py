"""The Node this agent plays kubelet for: its object, its status, and where its kubelet API is.

The status reports a Ready node with fixed capacity (one node, everything fits), the
node's InternalIP, and ``daemonEndpoints.kubeletEndpoint.Port``, which is where the
apiserver proxies ``kubectl logs`` to (``kubelet_api``).
"""

from __future__ import annotations

import time

from kubernetes import client
from kubernetes.client.rest import ApiException

from local_cluster.container_state import rfc3339
from local_cluster.node_settings import NodeAgentSettings
from local_cluster.pod_references import Body


def node_body(settings: NodeAgentSettings) -> client.V1Node:
    labels = {
        "kubernetes.io/hostname": settings.node_name,
        "kubernetes.io/os": "linux",
        "broker-failover.dev/node-agent": "true",
    }
    return client.V1Node(metadata=client.V1ObjectMeta(name=settings.node_name, labels=labels))


def node_status(settings: NodeAgentSettings) -> Body:
    now = rfc3339(time.time())
    resources = {"cpu": "8", "memory": "32Gi", "pods": "250", "ephemeral-storage": "100Gi"}
    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": settings.host_ip},
                {"type": "Hostname", "address": "localhost"},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "NodeAgentReady",
                    "message": "broker-failover node agent (fake kubelet) is running",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v0.0.0-node-agent",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "local://processes",
                "kernelVersion": "",
                "osImage": "local processes",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
        }
    }


def register_node(core: client.CoreV1Api, settings: NodeAgentSettings, kubelet_port: int | None) -> None:
    """Create the Node (or keep the one there) and write its status; ``kubelet_port`` if served."""
    try:
        core.create_node(node_body(settings))
    except ApiException as error:
        if error.status != 409:
            raise
    status = node_status(settings)
    if kubelet_port is not None:  # where the apiserver finds this node's kubelet API
        status["status"]["daemonEndpoints"] = {"kubeletEndpoint": {"Port": kubelet_port}}
    core.patch_node_status(settings.node_name, status)
