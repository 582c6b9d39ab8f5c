"""Several real nodes in one sealed cluster (``--nodes N``, N > 1): a kubelet, containerd and
kube-proxy per node, each node in a network namespace and a cgroup of its own.

``start_cluster_nodes`` runs in the sealed cluster's supervisor, as ``kubelet_node.start_kubelet_node``
does for the single node, once ``netns.set_up_cluster_network`` has made the nodes' namespaces
(``node-1``, ``node-2``, ...; addresses, pod CIDRs and routes: ``netns``). Per node, in order:

* its cgroup ``/<cluster root>/<node>`` in every hierarchy of the machine (cpuset's cpus and mems
  copied) and ``.../runtime`` below it, where the node's own processes start: containerd (and so
  its shims), the kubelet, kube-proxy. The kubelet's ``cgroupRoot`` is the node's cgroup, so its
  pods live under ``/<cluster root>/<node>/kubepods``: the whole node, runtime and containers, is
  one cgroup subtree, which a test can freeze or kill at once (a node crash);
* containerd with its root under ``<workdir>/nodes/<node>``, state and socket under ``/run/<node>``
  (the cluster's /run, short paths), its CNI bridge conflist for the node's pod CIDR and its own
  host-local IPAM directory; then the images ``make images`` built, imported into it without
  unpacking (``--no-unpack``: unpacking every image into three snapshotters at once took most of a
  three-node start; the CRI unpacks an image on a node when a container of it first starts there);
* the kubelet, ``--root-dir`` ``/run/<node>/kubelet`` (bind-mounted from the node's directory),
  its own ``podLogsDir``, serving on the node's address. One path is not under its root: the
  device-plugin socket, ``/var/lib/kubelet/device-plugins/kubelet.sock``, fixed in the kubelet. Each
  kubelet removes what is in that directory and then listens there, so two starting at once fail
  with "address already in use" (it happened); the kubelets start one after the other, each once
  the previous one's socket is there, over a tmpfs the cluster's mount namespace puts on
  ``/var/lib/kubelet`` (so no other cluster on the machine shares the directory either);
* kube-proxy, nftables in the node's namespace, healthz on the node's address.

Each of those starts as ``sh -c 'echo $$ > <cgroup>/cgroup.procs ...; exec nsenter --net=/run/netns/<node>
...'``: ``nsenter``, not ``ip netns exec``, which mounts a /sys of its own and hides the cgroup
hierarchies from the kubelet (``../shared/design/REAL_NODE.md``). The control plane and
kube-scheduler are the cluster's, as with one node, and so are CoreDNS and kind's
local-path-provisioner (``local_path_storage``), pods the scheduler places on any node; the control
plane listens on the cluster namespace's ``netns.CONTROL_PLANE_ADDRESS``, which every node reaches
over its veth.

A node's process that exits does not stop the cluster (killing a whole node is a fault the tests
inject); what this does not do yet is bring a killed node back. Volumes are as on kind: a claim of
the default class ``standard`` gets a directory under the node its first pod is scheduled to
(``<workdir>/nodes/<node>/local-path``) and node affinity to it, as a node's own disk, so its pods
stay on that node; a claim of ``shared-path`` (the message-log store) gets a directory under
``<workdir>/shared-path``, which every node mounts (the nodes share the machine's file system, as
nodes share an NFS export), and no node affinity.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import yaml
from kubernetes import client, config

from local_cluster import netns
from local_cluster.cgroups import CgroupRoot
from local_cluster.cluster_services import install_cluster_dns, start_kube_proxy, wait_for_healthz
from local_cluster.containerd_sandbox import start_containerd
from local_cluster.control_plane import ControlPlane, ControlPlaneSettings, start_control_plane
from local_cluster.image_build import IMAGES
from local_cluster.image_seed import IMAGES_FILE, import_images, seeded_images
from local_cluster.kubelet_node import (
    ON_DEMAND_IMAGES,
    KubeletNodeError,
    _capture,
    _node_ready,
    _start_scheduler,
    _tail,
    cgroup_root_name,
    kill_namespace_processes,
    kubelet_config,
)
from local_cluster.local_path_storage import install_local_path_storage
from local_cluster.processes import ManagedProcess

KUBE_PROXY_HEALTHZ_PORT = 10256
KUBELET_FIXED_DIR = Path("/var/lib/kubelet")
DEVICE_PLUGIN_SOCKET = KUBELET_FIXED_DIR / "device-plugins" / "kubelet.sock"


@dataclasses.dataclass
class ClusterNode:
    """One node's directories, cgroup and processes (``ClusterNodes`` starts and stops them)."""

    network: netns.NodeNetwork
    directory: Path  # <workdir>/nodes/<node>: containerd's root, the kubelet's state, logs
    cgroup: str  # "<cluster root>/<node>", without the leading "/"
    containerd: subprocess.Popen[bytes] | None = None
    planted: list[str] = dataclasses.field(default_factory=list)  # images linked in (image_seed)
    kubelet: ManagedProcess | None = None
    kube_proxy: ManagedProcess | None = None

    @property
    def name(self) -> str:
        return self.network.name

    @property
    def run_dir(self) -> Path:
        """Under the cluster's /run: a socket's path has at most 107 bytes."""
        return Path("/run") / self.name

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd" / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.directory / "kubelet" / "pod-logs"

    def runtime_cgroups(self) -> CgroupRoot:
        return CgroupRoot(f"{self.cgroup}/runtime")

    def prefix(self) -> list[str]:
        """Run a command in this node: its process joins the node's runtime cgroup in every
        hierarchy, then enters the node's network namespace; both ``exec``, so the pid is the
        command's."""
        targets = " ".join(shlex.quote(str(d / "cgroup.procs")) for d in self.runtime_cgroups().directories())
        script = f'for f in {targets}; do echo $$ > "$f" || exit 1; done; exec "$@"'
        return ["sh", "-c", script, self.name, "nsenter", f"--net={self.network.namespace}", "--"]

    def start_containerd(self) -> None:
        """The node's containerd, with CRI, in its cgroup and network namespace, over its state."""
        self.containerd = start_containerd(
            self.directory / "containerd",
            cri=True,
            run_dir=self.containerd_socket.parent,
            subnet=self.network.pod_cidr,
            prefix=self.prefix(),
        )

    def describe(self) -> dict[str, object]:
        """The node as the state file names it; pids are the cluster's PID namespace's."""
        pids = {
            name: process.pid
            for name, process in (
                ("containerd", self.containerd),
                ("kubelet", self.kubelet.popen if self.kubelet else None),
                ("kube-proxy", self.kube_proxy.popen if self.kube_proxy else None),
            )
            if process is not None
        }
        return {
            "name": self.name,
            "address": self.network.address,
            "podCIDR": self.network.pod_cidr,
            "networkNamespace": str(self.network.namespace),
            "cgroup": f"/{self.cgroup}",
            "containerdSocket": str(self.containerd_socket),
            "podLogs": str(self.pod_logs),
            "pids": pids,
        }


@dataclasses.dataclass
class ClusterNodes:
    """What ``start_cluster_nodes`` started; ``stop`` ends all of it and removes the cgroups. Has
    what the supervisor uses of a ``KubeletNode`` (control plane, kubeconfig, ``exited``, ``stop``)."""

    workdir: Path
    control_plane: ControlPlane
    cgroups: CgroupRoot
    nodes: list[ClusterNode]
    processes: list[ManagedProcess] = dataclasses.field(default_factory=list)
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)
    importer: threading.Thread | None = None
    ready_seconds: float = 0.0

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.admin_kubeconfig

    @property
    def containerd_socket(self) -> Path:
        """The first node's (``SealedCluster.ctr`` without a node names it)."""
        return self.nodes[0].containerd_socket

    @property
    def pod_logs(self) -> Path:
        return self.nodes[0].pod_logs

    def describe_nodes(self) -> list[dict[str, object]]:
        return [node.describe() for node in self.nodes]

    def exited(self) -> str | None:
        """The cluster's own processes only (kube-scheduler): a node whose kubelet or containerd
        is killed is a node crash, which the cluster outlives as a real one does."""
        return next((p.name for p in self.processes if p.exited()), None)

    def restart_node(self, name: str, tools_dir: Path) -> None:
        """A crashed node boots again (``SealedNode.crash`` killed every process it had): its
        containerd on the state it left, its kubelet, then its kube-proxy. The kubelet finds its
        pods' sandboxes dead and makes them again, as after a reboot."""
        node = next((n for n in self.nodes if n.name == name), None)
        if node is None:
            raise KubeletNodeError(f"no node {name}: {[n.name for n in self.nodes]}")
        node.start_containerd()
        node.kubelet = _start_kubelet(tools_dir, self.control_plane, node)
        node.kube_proxy = _start_node_kube_proxy(self.control_plane, node)

    def stop(self) -> None:
        """Kubelets and kube-proxies first (a kubelet would restart what is killed), then every pod,
        shim and containerd, the control plane, and the cgroups, which are the machine's."""
        self.stopping.set()
        for node in reversed(self.nodes):
            for process in (node.kube_proxy, node.kubelet):
                if process is not None:
                    process.stop()
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        kill_namespace_processes(keep={os.getpid(), *(p.pid for p in self.control_plane.processes)})
        self.control_plane.stop()
        for node in self.nodes:
            if node.containerd is not None:
                node.containerd.wait(timeout=30)
        self.cgroups.remove()


def start_cluster_nodes(
    tools_dir: Path,
    workdir: Path,
    networks: Sequence[netns.NodeNetwork],
    ready_timeout_seconds: float = 180,
    background_images: Sequence[str] = (),
) -> ClusterNodes:
    """Start the nodes and the control plane (module doc); return once every Node is Ready, every
    kube-proxy is healthy, and CoreDNS, the provisioners and their StorageClasses have been created."""
    started = time.monotonic()
    deadline = started + ready_timeout_seconds
    root = CgroupRoot(cgroup_root_name(workdir))
    root.create()
    nodes = [ClusterNode(n, workdir / "nodes" / n.name, f"{root.name}/{n.name}") for n in networks]
    foreground = [spec.name for spec in IMAGES if spec.name not in ON_DEMAND_IMAGES]

    def missing(node: ClusterNode) -> list[str]:
        return [name for name in foreground if name not in node.planted]

    stopping = threading.Event()
    errors: list[BaseException] = []
    importers: list[threading.Thread] = []
    try:
        for node in nodes:
            CgroupRoot(node.cgroup).create()
            node.runtime_cgroups().create()
            node.planted = seeded_images(node.directory / "containerd" / "root")
            node.start_containerd()
            record = node.directory / IMAGES_FILE
            record.write_text(json.dumps(node.planted))
            importers.append(
                threading.Thread(
                    target=_capture(errors, import_images),
                    args=(node.containerd_socket, missing(node), record, stopping, False),
                    daemon=True,
                )
            )
        for importer in importers:  # the control plane starts while the images are imported
            importer.start()
        addresses = (netns.CONTROL_PLANE_ADDRESS, *(node.network.address for node in nodes))
        plane = start_control_plane(
            ControlPlaneSettings(
                tools_dir=tools_dir,
                workdir=workdir,
                ready_timeout_seconds=ready_timeout_seconds,
                address=netns.CONTROL_PLANE_ADDRESS,
                apiserver_port=6443,
                certificate_addresses=addresses,
            )
        )
    except BaseException:
        stopping.set()
        kill_namespace_processes(keep={os.getpid()})
        for node in nodes:
            if node.containerd is not None:
                node.containerd.wait(timeout=30)
        root.remove()
        raise
    cluster = ClusterNodes(workdir, plane, root, nodes, stopping=stopping)
    try:
        cluster.processes.append(_start_scheduler(tools_dir, plane))
        for importer in importers:
            importer.join(timeout=max(1.0, deadline - time.monotonic()))
        if errors:
            raise errors[0]
        if any(importer.is_alive() for importer in importers):
            raise KubeletNodeError(f"importing the images took over {ready_timeout_seconds:.0f}s")
        # What every node has: the foreground images, and what was planted on all of them.
        everywhere = set.intersection(*(set(node.planted) for node in nodes))
        held = [*foreground, *sorted(everywhere - set(foreground))]
        record = workdir / IMAGES_FILE
        record.write_text(json.dumps(held))
        background = [name for name in background_images if name not in held]
        cluster.importer = threading.Thread(
            target=_capture([], _import_on_every_node),
            args=(nodes, background, record, stopping),
            daemon=True,
        )
        cluster.importer.start()
        _start_node_services(cluster, tools_dir, deadline)
    except BaseException:
        cluster.stop()
        raise
    cluster.ready_seconds = time.monotonic() - started
    return cluster


def _import_on_every_node(
    nodes: Sequence[ClusterNode], names: Sequence[str], record: Path, stopping: threading.Event
) -> None:
    """Each image into every node's containerd; named in ``record`` once every node has it."""
    for name in names:
        for node in nodes:
            if name not in node.planted:
                import_images(node.containerd_socket, [name], node.directory / IMAGES_FILE, stopping, False)
        if stopping.is_set():
            return
        staged = record.with_suffix(".tmp")
        staged.write_text(json.dumps([*json.loads(record.read_text()), name]))
        staged.replace(record)


def _start_node_services(cluster: ClusterNodes, tools_dir: Path, deadline: float) -> None:
    """Every kubelet (until every Node is Ready), every kube-proxy, CoreDNS and the provisioners."""
    plane = cluster.control_plane
    KUBELET_FIXED_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(KUBELET_FIXED_DIR)], check=True, timeout=30
    )
    for node in cluster.nodes:
        previous = _file_identity(DEVICE_PLUGIN_SOCKET)
        kubelet = node.kubelet = _start_kubelet(tools_dir, plane, node)
        while _file_identity(DEVICE_PLUGIN_SOCKET) in (None, previous):
            if kubelet.exited() or time.monotonic() > deadline:
                raise KubeletNodeError(f"kubelet of {node.name} did not start:\n{_tail(kubelet.log_path)}")
            time.sleep(0.05)
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(plane.admin_kubeconfig)))
    for node in cluster.nodes:
        while not _node_ready(api, node.name):
            assert node.kubelet is not None
            if node.kubelet.exited() or time.monotonic() > deadline:
                log = _tail(node.kubelet.log_path)
                raise KubeletNodeError(f"node {node.name} did not become Ready:\n{log}")
            time.sleep(0.2)
    for node in cluster.nodes:
        node.kube_proxy = _start_node_kube_proxy(plane, node)
    for node in cluster.nodes:
        assert node.kube_proxy is not None
        wait_for_healthz(f"{node.network.address}:{KUBE_PROXY_HEALTHZ_PORT}", deadline, node.kube_proxy)
    install_cluster_dns(plane.admin_kubeconfig)
    install_local_path_storage(
        plane.admin_kubeconfig,
        {node.name: node.directory / "local-path" for node in cluster.nodes},
        cluster.workdir / "shared-path",
    )


def _start_node_kube_proxy(plane: ControlPlane, node: ClusterNode) -> ManagedProcess:
    return start_kube_proxy(
        plane,
        node.name,
        directory=node.directory,
        cluster_cidr=netns.CLUSTER_POD_CIDR,
        healthz=f"{node.network.address}:{KUBE_PROXY_HEALTHZ_PORT}",
        prefix=tuple(node.prefix()),
    )


def _file_identity(path: Path) -> tuple[int, int] | None:
    """Inode and change time: a socket removed and bound again is another file."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_ctime_ns)


def _start_kubelet(tools_dir: Path, plane: ControlPlane, node: ClusterNode) -> ManagedProcess:
    binary = tools_dir / "kubelet"
    if not binary.is_file():
        raise KubeletNodeError(f"no kubelet in {tools_dir}: run `make tools`")
    root = node.directory / "kubelet"
    (root / "state").mkdir(parents=True, exist_ok=True)
    kubelet_root = node.run_dir / "kubelet"
    kubelet_root.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(kubelet_root):
        # A node booting again after a crash: a reboot would have cleared the previous kubelet's
        # mounts, its pods' secret and token tmpfs among them. Left under the new bind, they keep
        # their directories busy, and every pod of the node would hang in termination (its
        # volumes' teardown fails with EBUSY).
        subprocess.run(["umount", "--recursive", "--lazy", str(kubelet_root)], check=True, timeout=30)
    subprocess.run(["mount", "--bind", str(root / "state"), str(kubelet_root)], check=True, timeout=30)
    config_file = root / "config.yaml"
    settings = kubelet_config(root, plane.pki, node.containerd_socket, node.cgroup, node.network.address)
    config_file.write_text(yaml.safe_dump(settings))
    return ManagedProcess(
        f"kubelet-{node.name}",
        [
            *node.prefix(),
            str(binary),
            f"--config={config_file}",
            f"--kubeconfig={plane.admin_kubeconfig}",
            f"--root-dir={kubelet_root}",
            f"--hostname-override={node.name}",
            f"--node-ip={node.network.address}",
            "--v=1",
        ],
        log_path=node.directory / "logs" / "kubelet.log",
    )
