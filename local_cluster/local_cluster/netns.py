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

Also here: ``call_in_network_namespace`` (a thread of this process in the cluster's network) and
``partition_network``/``heal_network`` (nftables in a pod's own namespace).

What it does not do: IPv6, more than one node, or network policies.
"""

from __future__ import annotations

import ctypes
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


def partition_network(namespace: str, direction: str = "both") -> None:
    """Drop a pod's traffic on its ``eth0`` with nftables, inside the pod's network namespace
    (``namespace``: a path such as ``/proc/<pid>/ns/net`` of one of its containers).

    ``direction``: ``ingress`` (nothing reaches the pod), ``egress`` (nothing leaves it) or
    ``both``. Established connections stall as on a real partition (no resets are sent);
    ``heal_network`` removes the rules. Numeric priorities: nft 1.0.6 wants them in hand-written rules.
    """
    chains = {"ingress": ["input"], "egress": ["output"], "both": ["input", "output"]}[direction]
    script = [f"table inet {PARTITION_TABLE} {{"]
    for chain in chains:
        interface = "iifname" if chain == "input" else "oifname"
        script += [
            f"  chain {chain} {{",
            f"    type filter hook {chain} priority 0;",
            f'    {interface} "eth0" drop',
            "  }",
        ]
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
