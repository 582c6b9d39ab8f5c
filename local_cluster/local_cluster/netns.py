"""The cluster's sealed network: its own network namespace and the node's bridge.

The local cluster lives in network, mount and PID namespaces of its own, made by ``unshare``
(``containerd_sandbox.SEALED_COMMAND``) when the supervisor starts. Nothing in them has a
route out of this machine: the only routes are the bridge's pod subnet and the service
CIDR on the bridge, so a packet to any other address fails with "Network is unreachable"
before it is sent. The machine's own network namespace is never changed; everything here
disappears with the last process of the cluster (the kernel frees the namespaces, and with
them the bridge, the veths and kube-proxy's nftables rules).

Layout:

- bridge ``cni0`` at ``NODE_ADDRESS``/24 (the node's InternalIP; the API server and the
  kubelet endpoint listen there), made here (``set_up_node_network``);
- per pod a network namespace with ``eth0`` on the bridge and an address of ``POD_CIDR``,
  made by containerd's CRI with the CNI bridge plugin (not here);
- ``ip_forward`` and ``bridge-nf-call-iptables`` on inside the namespace only, so
  kube-proxy's nftables rules see bridged traffic.

Several nodes (``--nodes N``, N > 1, ``set_up_cluster_network``), laid out as kind with kindnet:

- the cluster's namespace keeps the control plane: bridge ``nodes0`` at ``CONTROL_PLANE_ADDRESS``
  (172.18.0.1/24), where the API server listens;
- each node a network namespace of its own (``/run/netns/node-<i>``, in the cluster's /run) joined
  to ``nodes0`` by a veth: ``eth0`` at 172.18.0.<10+i> (the node's InternalIP), its own ``cni0``
  at 10.244.<i>.1/24 for its pods (``NodeNetwork``);
- routes as kindnet sets them: in each node, every other node's pod CIDR via that node's address;
  in the cluster's namespace, every pod CIDR via its node, and the service CIDR via the first node
  (its kube-proxy translates ClusterIPs for the control plane's side and the tests' clients);
- no default route anywhere: an address outside the cluster is "Network is unreachable" in every
  namespace, as with one node.

Also here: ``call_in_network_namespace`` (a thread of this process in the cluster's network) and
``partition_network``/``heal_network`` (nftables in a pod's own namespace, or a node's).

What it does not do: IPv6 or network policies.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

NODE_ADDRESS = "10.244.0.1"
POD_CIDR = "10.244.0.0/24"
BRIDGE = "cni0"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
NETNS_DIR = Path("/run/netns")
# Several nodes: the control plane's bridge and address in the cluster's namespace, the nodes'
# addresses on it, the pod CIDRs every node's kube-proxy counts as the cluster's.
NODES_BRIDGE = "nodes0"
NODES_CIDR = "172.18.0.0/24"
CONTROL_PLANE_ADDRESS = "172.18.0.1"
CLUSTER_POD_CIDR = "10.244.0.0/16"
MAX_NODES = 9

CLONE_NEWNET = 0x40000000
T = TypeVar("T")


class PodNetworkError(RuntimeError):
    """A namespace, link or address could not be set up; carries the failing command's stderr."""


def ip(*args: str) -> str:
    command = ["ip", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise PodNetworkError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result.stdout


def _write_sysctl(name: str, value: str) -> None:
    path = Path("/proc/sys") / name.replace(".", "/")
    try:
        path.write_text(value)
    except OSError as error:
        raise PodNetworkError(f"cannot set {name}={value} inside the cluster's namespace: {error}") from error


def set_up_node_network() -> None:
    """Turn the (freshly unshared, empty) namespace of this process into the node's network.

    Must run in the namespace ``containerd_sandbox.SEALED_COMMAND`` made: it refuses to touch a
    namespace that has routes (the machine's own, most likely).
    """
    if ip("route", "show").strip():
        raise PodNetworkError(
            "refusing to set up the pod network in a namespace that already has routes "
            "(is this the machine's own namespace? start the cluster through SEALED_COMMAND)"
        )
    # /run becomes a tmpfs of the cluster's own: the pods' network namespaces (/run/netns) and
    # the kubelet's and containerd's state live there, never in the machine's /run.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run"], check=True, timeout=30)
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    ip("link", "set", "lo", "up")
    _write_sysctl("net.ipv4.ip_forward", "1")
    _write_sysctl("net.bridge.bridge-nf-call-iptables", "1")
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("addr", "add", f"{NODE_ADDRESS}/24", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")
    # The node's own clients (the operator outside the cluster, tests) reach ClusterIPs: without
    # a route, connect() fails with "Network is unreachable" before kube-proxy's DNAT runs.
    ip("route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_ADDRESS)


@dataclasses.dataclass(frozen=True)
class NodeNetwork:
    """One node's network when the cluster has several: its namespace, address and pod CIDR."""

    index: int  # 1, 2, 3, ...

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def address(self) -> str:
        """The node's InternalIP on ``nodes0``: the kubelet, kube-proxy's healthz listen there."""
        return f"172.18.0.{10 + self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def gateway(self) -> str:
        """The node's ``cni0`` address: its pods' default gateway (the CNI bridge plugin's)."""
        return f"10.244.{self.index}.1"

    @property
    def namespace(self) -> Path:
        """Its network namespace, bound in the cluster's own /run (not the machine's)."""
        return NETNS_DIR / self.name


def node_networks(count: int) -> list[NodeNetwork]:
    if not 1 <= count <= MAX_NODES:
        raise ValueError(f"a local cluster has 1 to {MAX_NODES} nodes, not {count}")
    return [NodeNetwork(index) for index in range(1, count + 1)]


def set_up_cluster_network(nodes: list[NodeNetwork]) -> None:
    """Turn the freshly unshared namespace of this process into a cluster of ``nodes`` (module doc).

    Refuses, as ``set_up_node_network`` does, a namespace that already has routes.
    """
    if ip("route", "show").strip():
        raise PodNetworkError(
            "refusing to set up the nodes' network in a namespace that already has routes "
            "(is this the machine's own namespace? start the cluster through SEALED_COMMAND)"
        )
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run"], check=True, timeout=30)
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    ip("link", "set", "lo", "up")
    ip("link", "add", NODES_BRIDGE, "type", "bridge")
    ip("addr", "add", f"{CONTROL_PLANE_ADDRESS}/24", "dev", NODES_BRIDGE)
    ip("link", "set", NODES_BRIDGE, "up")
    for node in nodes:
        ip("netns", "add", node.name)
        ip("link", "add", f"veth-{node.name}", "type", "veth", "peer", "name", "eth0", "netns", node.name)
        ip("link", "set", f"veth-{node.name}", "master", NODES_BRIDGE, "up")
        inside = ("-n", node.name)
        ip(*inside, "link", "set", "lo", "up")
        ip(*inside, "addr", "add", f"{node.address}/24", "dev", "eth0")
        ip(*inside, "link", "set", "eth0", "up")
        # The node's pod bridge before its first pod: the CNI bridge plugin (isGateway) finds it
        # with the gateway address it would give it.
        ip(*inside, "link", "add", BRIDGE, "type", "bridge")
        ip(*inside, "addr", "add", f"{node.gateway}/24", "dev", BRIDGE)
        ip(*inside, "link", "set", BRIDGE, "up")
        call_in_network_namespace(node.namespace, _node_sysctls)
        for other in nodes:
            if other != node:
                ip(*inside, "route", "add", other.pod_cidr, "via", other.address)
        # The node's own clients (a probe, a test in the node) reach ClusterIPs: kube-proxy's
        # output DNAT runs after the route lookup, which needs a route.
        ip(*inside, "route", "add", SERVICE_CIDR, "dev", "eth0", "src", node.address)
        ip("route", "add", node.pod_cidr, "via", node.address)
    ip("route", "add", SERVICE_CIDR, "via", nodes[0].address, "src", CONTROL_PLANE_ADDRESS)


def _node_sysctls() -> None:
    # A node forwards its pods' traffic and lets kube-proxy's nftables see bridged packets; both
    # are per network namespace, and this thread is in the node's.
    _write_sysctl("net.ipv4.ip_forward", "1")
    _write_sysctl("net.bridge.bridge-nf-call-iptables", "1")


def routes() -> list[str]:
    """The routing table of this process's network namespace, one line per route."""
    return [line for line in ip("route", "show").splitlines() if line.strip()]


def _setns(path: str, kind: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, kind) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def call_in_network_namespace(
    namespace_path: str | Path, function: Callable[[], T], timeout: float = 60
) -> T:
    """Run ``function`` on a thread that joined another network namespace; return its result.

    setns(2) moves only the calling thread, so sockets ``function`` opens live in the cluster's
    network while the rest of this process (a test, a forwarder) stays where it is.
    """
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            _setns(str(namespace_path), CLONE_NEWNET)
            outcome["value"] = function()
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name="in-cluster-network", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"call in network namespace {namespace_path} still running after {timeout}s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


PARTITION_TABLE = "broker_failover_partition"


def partition_network(namespace: str, direction: str = "both", *, forwarded: bool = False) -> None:
    """Drop a pod's traffic on its ``eth0`` with nftables, inside the pod's network namespace
    (``namespace``: a path such as ``/proc/<pid>/ns/net`` of one of its containers), or a node's
    (its ``eth0`` is its link to the other nodes and the control plane; ``forwarded=True`` drops
    its pods' traffic too, which crosses the node's forward hook, not its input and output).

    ``direction``: ``ingress`` (nothing reaches the pod), ``egress`` (nothing leaves it) or
    ``both``. Established connections stall as on a real partition (no resets are sent);
    ``heal_network`` removes the rules. Numeric priorities: nft 1.0.6 wants them in hand-written rules.
    """
    chains = {"ingress": ["input"], "egress": ["output"], "both": ["input", "output"]}[direction]
    matches = {"ingress": ["iifname"], "egress": ["oifname"], "both": ["iifname", "oifname"]}[direction]
    script = [f"table inet {PARTITION_TABLE} {{"]
    for chain in chains:
        interface = "iifname" if chain == "input" else "oifname"
        script += [
            f"  chain {chain} {{",
            f"    type filter hook {chain} priority 0;",
            f'    {interface} "eth0" drop',
            "  }",
        ]
    if forwarded:
        script += ["  chain forward {", "    type filter hook forward priority 0;"]
        script += [f'    {match} "eth0" drop' for match in matches]
        script.append("  }")
    script.append("}")
    heal_network(namespace)
    result = subprocess.run(
        ["nsenter", f"--net={namespace}", "nft", "-f", "-"],
        input="\n".join(script) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        raise PodNetworkError(f"partitioning the pod of {namespace}: {result.stderr.strip()}")


def heal_network(namespace: str) -> None:
    """Remove a partition made by ``partition_network``; no error if there is none."""
    subprocess.run(
        ["nsenter", f"--net={namespace}", "nft", "delete", "table", "inet", PARTITION_TABLE],
        capture_output=True,
        timeout=30,
        check=False,
    )
