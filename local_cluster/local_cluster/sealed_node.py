"""A node of a running sealed cluster, as a test on the machine reaches it (``SealedCluster.nodes``):
its address and pod CIDR, a command or a call in its network namespace, the machine's pids of its
kubelet, containerd and kube-proxy, the processes under its cgroup, and a partition of its link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from local_cluster import netns, processes
from local_cluster.cgroups import CgroupRoot

T = TypeVar("T")


class SealedClusterError(RuntimeError):
    """A fault could not be injected (no such container, ``ctr`` or ``nft`` failed)."""


@dataclasses.dataclass(frozen=True)
class SealedNode:
    """A node of a running sealed cluster, as a test on the machine reaches it."""

    name: str
    address: str  # the Node's InternalIP
    pod_cidr: str
    # "/broker-failover-<hash>/node-2": with several nodes every process of the node (kubelet,
    # containerd, shims, kube-proxy, containers) runs under it; with one, only its pods do.
    cgroup: str
    containerd_socket: str  # in the cluster's /run
    pod_logs: Path
    supervisor_pid: int
    # In the cluster's /run (several nodes); None: the node is the cluster's own namespace.
    namespace_path: str | None
    namespace_pids: dict[str, int]  # containerd, kubelet, kube-proxy, in the cluster's PID namespace

    @property
    def network_namespace(self) -> Path:
        """A path this machine can open (``setns``, ``nsenter --net=``): the node's network namespace."""
        if self.namespace_path is None:
            return Path(f"/proc/{self.supervisor_pid}/ns/net")
        return Path(f"/proc/{self.supervisor_pid}/root{self.namespace_path}")

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the node's network namespace, with the cluster's mounts (its /run) and
        PID namespace: ``ip route``, ``nft``, a client on the node."""
        enter = ["nsenter", "-t", str(self.supervisor_pid), "--mount", "--pid", "--"]
        if self.namespace_path is None:
            return [*enter[:3], "--net", *enter[3:], *argv]
        return [*enter, "nsenter", f"--net={self.namespace_path}", "--", *argv]

    def call_in_network(self, function: Callable[[], T], timeout: float = 60) -> T:
        """Run ``function`` on a thread in the node's network namespace (pod IPs, ClusterIPs)."""
        return netns.call_in_network_namespace(self.network_namespace, function, timeout)

    def partition(self, direction: str = "both") -> None:
        """A node partition: nftables in the node's namespace drop everything on its ``eth0`` (to
        and from the API server, the other nodes and their pods), its pods' forwarded traffic
        included; ``heal`` removes it. With one node there is no such link: use ``partition_pod``."""
        if self.namespace_path is None:
            raise SealedClusterError("the single node has no link of its own to partition")
        netns.partition_network(str(self.network_namespace), direction, forwarded=True)

    def heal(self) -> None:
        if self.namespace_path is not None:
            netns.heal_network(str(self.network_namespace))

    def crash(self) -> list[int]:
        """A node crash: every process of the node (kubelet, containerd, shims, kube-proxy, the
        pods' containers) frozen at once in its cgroup, killed, and thawed to die; the machine's
        pids killed. Nothing shuts down cleanly. ``SealedCluster.restart_node`` boots it again."""
        if self.namespace_path is None:
            raise SealedClusterError("the single node's crash would be the cluster's: use several nodes")
        state = CgroupRoot.hierarchy("freezer") / self.cgroup.lstrip("/") / "freezer.state"
        state.write_text("FROZEN")
        try:
            deadline = time.monotonic() + 10
            while state.read_text().strip() != "FROZEN":  # FREEZING while a task is still running
                if time.monotonic() > deadline:
                    raise SealedClusterError(f"{self.name} did not freeze within 10 s")
                time.sleep(0.01)
            pids = self.cgroup_pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            state.write_text("THAWED")  # frozen tasks take their SIGKILL once thawed
        return pids

    def host_pids(self) -> dict[str, int]:
        """The machine's pids of the node's containerd, kubelet and kube-proxy (``os.kill`` them)."""
        return {
            name: processes.host_pid_of(self.supervisor_pid, pid) for name, pid in self.namespace_pids.items()
        }

    def cgroup_pids(self) -> list[int]:
        """The machine's pids of every process under the node's cgroup (the ``pids`` hierarchy): with
        several nodes, the whole node; freeze and kill these for a node crash."""
        top = CgroupRoot.hierarchy("pids") / self.cgroup.lstrip("/")
        found: set[int] = set()
        for procs in top.rglob("cgroup.procs") if top.is_dir() else []:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in procs.read_text().split())
        return sorted(found)
