"""What a node agent is told at start and what it derives from it: the node, its addresses, the API server.

In loopback mode pods get 127.x.y.2-254 (a random /24 per cluster, ``random_pod_subnet``) and
the node is 127.0.0.1; in pod-network mode (``netns``) pods get the bridge's /24 and the node
its bridge address.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import yaml

from local_cluster import netns
from local_cluster.container_env import ApiServerAddress
from local_cluster.images import DEFAULT_IMAGES_FILE

HOST_IP = "127.0.0.1"


@dataclass(frozen=True)
class NodeAgentSettings:
    kubeconfig: Path
    state_dir: Path
    node_name: str = "local-node"
    # First three octets of the pod addresses; pods get .2 to .254. A random /24 per
    # cluster keeps two clusters on one machine from handing out the same address.
    pod_subnet: str = "127.0.0"
    images_file: Path = DEFAULT_IMAGES_FILE
    loop_interval_seconds: float = 0.1
    volume_resync_seconds: float = 3.0  # how often Secret/ConfigMap volumes follow their objects
    # The kubelet API (kubectl logs; kubelet_api.py): 0 picks a free port. Certificate and key
    # default to kubelet.crt/kubelet.key next to the kubeconfig's CA, where pki.py writes them.
    kubelet_port: int = 0
    kubelet_cert: Path | None = None
    kubelet_key: Path | None = None
    # Pod-network mode (netns.py): each pod in a network namespace of its own on the cluster's
    # bridge; the agent must then run inside the cluster's sealed namespace.
    pod_network: bool = False

    @property
    def host_ip(self) -> str:
        return netns.NODE_ADDRESS if self.pod_network else HOST_IP

    @property
    def pgid_dir(self) -> Path:
        return self.state_dir / "pgids"


def random_pod_subnet() -> str:
    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"


def apiserver_address(kubeconfig: Path) -> ApiServerAddress:
    document = yaml.safe_load(kubeconfig.read_text())
    cluster = document["clusters"][0]["cluster"]
    server = urlparse(cluster["server"])
    if server.hostname is None or server.port is None:
        raise ValueError(f"kubeconfig {kubeconfig}: server {cluster['server']!r} needs a host and a port")
    return ApiServerAddress(
        host=server.hostname, port=server.port, ca_cert=Path(cluster["certificate-authority"])
    )
