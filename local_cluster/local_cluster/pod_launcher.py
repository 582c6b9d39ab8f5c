"""How a container enters its pod in pod-network mode: the argv prefix that runs ``pod_enter``.

``pod_enter`` gives the container a mount namespace of its own in the pod's network
namespace, with every volumeMount bind-mounted at its mountPath (read-only ones read-only,
subPath as the sub-directory or file of the volume) and the pod's ``resolv.conf`` and
``hosts``, written here as the kubelet writes them for ClusterFirst DNS; missing mount points
are made in private tmpfs layers, never on the machine. Command, args, workingDir and exec
probe commands are passed as written, as on a real node.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from local_cluster import pod_enter
from local_cluster.pod_volumes import Mount


@dataclass(frozen=True)
class PodNetwork:
    """Where a pod lives in pod-network mode: its network namespace and the cluster's DNS."""

    namespace_path: Path
    dns_server: str
    cluster_domain: str
    kubernetes_service: tuple[str, int]


def write_network_files(
    etc: Path, network: PodNetwork, *, namespace: str, pod_name: str, pod_ip: str
) -> dict[str, Path]:
    """The pod's resolv.conf and hosts under ``etc``, by the path each is mounted at."""
    etc.mkdir(parents=True, exist_ok=True)
    domain = network.cluster_domain
    search = f"{namespace}.svc.{domain} svc.{domain} {domain}"
    resolv = etc / "resolv.conf"
    resolv.write_text(f"search {search}\nnameserver {network.dns_server}\noptions ndots:5\n")
    hosts = etc / "hosts"
    hosts.write_text(
        "# Kubernetes-managed hosts file (broker-failover node agent).\n"
        f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{pod_ip}\t{pod_name}\n"
    )
    return {"/etc/resolv.conf": resolv, "/etc/hosts": hosts}


def launcher_argv(
    network: PodNetwork, network_files: dict[str, Path], mounts: list[Mount], working_dir: str | None
) -> list[str]:
    """The argv prefix that starts a container inside the pod's namespaces.

    ``pod_enter`` mounts parents first and makes missing mount points in private tmpfs
    layers; ``working_dir`` is entered once they are in place.
    """
    binds = {target: (local, False) for target, local in network_files.items()}
    # A volume mounted at /etc/hosts wins over the generated file, as on a real node.
    binds.update({mount.mount_path: (mount.local_path, mount.read_only) for mount in mounts})
    prefix = [sys.executable, str(Path(pod_enter.__file__)), f"--netns={network.namespace_path}"]
    for target, (local, read_only) in sorted(binds.items(), key=lambda item: len(Path(item[0]).parts)):
        prefix.append(f"--bind{'-ro' if read_only else ''}={local}:{target}")
    if working_dir:
        prefix.append(f"--workdir={working_dir}")
    return [*prefix, "--"]
