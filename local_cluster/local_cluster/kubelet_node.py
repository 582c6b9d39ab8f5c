"""The local cluster's node: a real kubelet on containerd's CRI and runc, inside the sealed namespace.

``start_kubelet_node`` runs in the sealed cluster's supervisor (``sealed_cluster``), which is PID 1
of fresh network, mount and PID namespaces whose network ``netns.set_up_node_network`` made. It
starts, in order:

* containerd with its CRI (``containerd_sandbox.start_containerd``), state under the cluster's
  directory, pods on the CNI bridge plugin, the sandbox ("pause") image ``make images`` built;
* the images ``make images`` wrote as OCI archives, linked into containerd's root before it starts
  from a copy imported once (``image_seed``; nothing is ever pulled: a pod naming an image that
  was not built waits with the kubelet's ``ErrImageNeverPull``). Where linking is not possible
  they are imported instead, the validator's (1.3 GB unpacked, half a minute) only when asked
  for: in the background once the node is ready (``background_images``), or later
  (``SealedCluster.ensure_images``); ``images.json`` in the cluster's directory names the images
  the node has so far;
* the control plane (``control_plane``) on the bridge address, and kube-scheduler;
* the kubelet (built with the other tools from the same pin), registered as the Node;
* kube-proxy (nftables) and CoreDNS, a pod from its image (``cluster_dns.yaml``);
* kind's local-path-provisioner, pods from its image (``local_path_storage``): the default
  StorageClass ``standard`` with the node's volumes under ``<workdir>/local-path``, and the
  ReadWriteMany class ``shared-path`` under ``<workdir>/shared-path``.

The kubelet's settings are the ones ``../shared/design/REAL_NODE.md`` records as working on this
machine kind: cgroupfs under a cgroup root of the node's own (made in every hierarchy first, and
removed bottom-up at the end, since those are the machine's cgroups), no swap check, no node
allocatable enforcement, no local-storage isolation (the kubelet cannot size this VM's disk). Image
garbage collection is off: what the kubelet deleted could not be pulled back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from kubernetes import client, config

from local_cluster import netns
from local_cluster.cgroups import CgroupRoot
from local_cluster.cluster_services import (
    KUBE_PROXY_HEALTHZ,
    install_cluster_dns,
    start_kube_proxy,
    wait_for_healthz,
)
from local_cluster.containerd_sandbox import start_containerd
from local_cluster.control_plane import (
    ControlPlane,
    ControlPlaneSettings,
    ControlPlaneStartError,
    start_control_plane,
)
from local_cluster.image_build import IMAGES
from local_cluster.image_seed import IMAGES_FILE, import_images, seeded_images
from local_cluster.local_path_storage import install_local_path_storage
from local_cluster.pki import ClusterPki
from local_cluster.processes import ManagedProcess

KUBELET_PORT = 10250
# Imported only when asked for: the validator's image is 1.3 GB unpacked and only its CronJob
# (and Spark's executor pods) use it.
ON_DEMAND_IMAGES = ("broker-failover/validator",)
# Sockets live under the node's own /run (a tmpfs of the sealed mount namespace): a socket's path
# has at most 107 bytes, and a test's directory can be longer than that leaves. The kubelet's state
# stays under the cluster's directory, bind-mounted at a short path.
CONTAINERD_RUN = Path("/run/containerd")
KUBELET_ROOT = Path("/run/kubelet")


class KubeletNodeError(ControlPlaneStartError):
    """A part of the node did not come up; the message carries its log's tail."""


def _tail(path: Path, size: int = 3000) -> str:
    return path.read_text(errors="replace")[-size:] if path.exists() else "(no log)"


def cgroup_root_name(workdir: Path) -> str:
    """The node's cgroup root, one per cluster directory (inside its PID namespace, every
    supervisor is PID 1, so the pid cannot tell two clusters apart)."""
    return f"broker-failover-{hashlib.sha256(str(workdir).encode()).hexdigest()[:10]}"


def kubelet_config(
    root: Path, pki: ClusterPki, containerd_socket: Path, cgroup_root: str, address: str = netns.NODE_ADDRESS
) -> dict[str, object]:
    """``cgroup_root`` without its leading ``/``; ``address``: the node's InternalIP."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        # The API server's client certificate (kubectl logs, exec) is signed by the cluster CA; the
        # kubelet serves with the node certificate the same CA signed.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki.ca_cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(pki.kubelet_serving_cert),
        "tlsPrivateKeyFile": str(pki.kubelet_serving_key),
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_root}",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "podLogsDir": str(root / "pod-logs"),
        "clusterDNS": [netns.CLUSTER_DNS_IP],
        "clusterDomain": netns.CLUSTER_DOMAIN,
        # Pods get the cluster's search path only, never this machine's resolvers.
        "resolvConf": "",
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "2s",
        # Nothing can be pulled again, so nothing may be collected; the machine's disk is not the
        # node's to guard (evictionHard names memory alone, which turns the disk signals off).
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi"},
        # Restart a crashed container within 4 s, not after the default 10 s doubling to 5 min
        # (KEP-4603, alpha in 1.33): the soak kills the same brokers every few seconds, and a
        # backoff of minutes would measure the backoff, not the recovery. A production node keeps
        # the default; failover does not wait for the restart.
        "featureGates": {"KubeletCrashLoopBackOffMax": True},
        "crashLoopBackOff": {"maxContainerRestartPeriod": "4s"},
    }


@dataclasses.dataclass
class KubeletNode:
    """What ``start_kubelet_node`` started; ``stop`` ends all of it and removes the cgroups."""

    workdir: Path
    node_name: str
    control_plane: ControlPlane
    cgroups: CgroupRoot
    containerd: subprocess.Popen[bytes]
    processes: list[ManagedProcess] = dataclasses.field(default_factory=list)
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)
    importer: threading.Thread | None = None
    ready_seconds: float = 0.0

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.admin_kubeconfig

    @property
    def containerd_socket(self) -> Path:
        return CONTAINERD_RUN / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "kubelet" / "pod-logs"

    @property
    def local_path_dir(self) -> Path:
        """The node's volumes (the default class's ``nodePathMap``)."""
        return self.workdir / "local-path"

    def pids(self) -> list[int]:
        return [self.containerd.pid, *(p.pid for p in [*self.control_plane.processes, *self.processes])]

    def exited(self) -> str | None:
        """The name of a node process that exited on its own, if one did."""
        if self.containerd.poll() is not None:
            return "containerd"
        return next((p.name for p in self.processes if p.exited()), None)

    def stop(self) -> None:
        """Kubelet first (it would restart what is killed), then every pod, containerd and the
        control plane; then the node's cgroups, which are the machine's and stay until removed."""
        self.stopping.set()
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        kill_namespace_processes(keep={os.getpid(), *self.control_plane_pids()})
        self.control_plane.stop()
        self.containerd.wait(timeout=30)
        self.cgroups.remove()

    def describe_nodes(self) -> list[dict[str, object]]:
        """The node as the state file names it (``cluster_nodes.ClusterNode.describe`` for several);
        pids are the cluster's PID namespace's. Its network namespace is the cluster's own, and
        its cgroup holds its pods (containerd and the kubelet run in the supervisor's)."""
        named = ("kubelet", "kube-proxy")
        pids = {p.name: p.pid for p in self.processes if p.name in named}
        pids["containerd"] = self.containerd.pid
        return [
            {
                "name": self.node_name,
                "address": netns.NODE_ADDRESS,
                "podCIDR": netns.POD_CIDR,
                "networkNamespace": None,
                "cgroup": f"/{self.cgroups.name}",
                "containerdSocket": str(self.containerd_socket),
                "podLogs": str(self.pod_logs),
                "pids": pids,
            }
        ]

    def control_plane_pids(self) -> set[int]:
        return {p.pid for p in self.control_plane.processes}


def kill_namespace_processes(keep: set[int], within: float = 20) -> None:
    """SIGKILL every process of this PID namespace but ``keep`` (and their parent, this supervisor):
    containerd, its shims and every container. Waits until they are gone and reaped."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        others = [
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and int(entry.name) not in keep and _alive(int(entry.name))
        ]
        if not others:
            return
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Not a zombie (a zombie of ours is reaped by the supervisor's SIGCHLD handling)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start_kubelet_node(
    tools_dir: Path,
    workdir: Path,
    node_name: str,
    ready_timeout_seconds: float = 180,
    background_images: Sequence[str] = (),
) -> KubeletNode:
    """Start the node (see the module doc); return once the Node is Ready, kube-proxy is healthy,
    and CoreDNS, the provisioners and their StorageClasses have been created."""
    started = time.monotonic()
    deadline = started + ready_timeout_seconds
    cgroups = CgroupRoot(cgroup_root_name(workdir))
    cgroups.create()
    planted = seeded_images(workdir / "containerd" / "root")
    containerd = start_containerd(workdir / "containerd", cri=True, run_dir=CONTAINERD_RUN)
    socket = CONTAINERD_RUN / "containerd.sock"
    record = workdir / IMAGES_FILE
    record.write_text(json.dumps(planted))
    foreground = [spec.name for spec in IMAGES if spec.name not in (*ON_DEMAND_IMAGES, *planted)]
    stopping = threading.Event()
    try:
        # The control plane starts while the images are imported (both take seconds).
        errors: list[BaseException] = []
        importer = threading.Thread(
            target=_capture(errors, import_images), args=(socket, foreground, record, stopping), daemon=True
        )
        importer.start()
        plane = start_control_plane(
            ControlPlaneSettings(
                tools_dir=tools_dir,
                workdir=workdir,
                ready_timeout_seconds=ready_timeout_seconds,
                address=netns.NODE_ADDRESS,
                apiserver_port=6443,
            )
        )
    except BaseException:
        stopping.set()
        containerd.kill()
        containerd.wait(timeout=30)
        cgroups.remove()
        raise
    node = KubeletNode(workdir, node_name, plane, cgroups, containerd, stopping=stopping)
    try:
        node.processes.append(_start_scheduler(tools_dir, plane))
        importer.join(timeout=max(1.0, deadline - time.monotonic()))
        if errors:
            raise errors[0]
        if importer.is_alive():
            raise KubeletNodeError(f"importing the images took over {ready_timeout_seconds:.0f}s")
        background = [name for name in background_images if name not in (*foreground, *planted)]
        node.importer = threading.Thread(
            target=_capture([], import_images), args=(socket, background, record, stopping), daemon=True
        )
        node.importer.start()
        _start_node_services(node, tools_dir, deadline)
    except BaseException:
        node.stop()
        raise
    node.ready_seconds = time.monotonic() - started
    return node


def _start_node_services(node: KubeletNode, tools_dir: Path, deadline: float) -> None:
    """The kubelet (until the Node is Ready), kube-proxy, CoreDNS and the provisioners."""
    plane = node.control_plane
    kubelet = _start_kubelet(tools_dir, node)
    node.processes.append(kubelet)
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(plane.admin_kubeconfig)))
    while not _node_ready(api, node.node_name):
        if kubelet.exited() or time.monotonic() > deadline:
            raise KubeletNodeError(f"node {node.node_name} did not become Ready:\n{_tail(kubelet.log_path)}")
        time.sleep(0.2)
    proxy = start_kube_proxy(plane, node.node_name)
    node.processes.append(proxy)
    wait_for_healthz(KUBE_PROXY_HEALTHZ, deadline, proxy)
    install_cluster_dns(plane.admin_kubeconfig)
    install_local_path_storage(
        plane.admin_kubeconfig, {node.node_name: node.local_path_dir}, node.workdir / "shared-path"
    )


def _capture(errors: list[BaseException], function: Callable[..., None]) -> Callable[..., None]:
    """``function`` for a thread: an exception is kept in ``errors`` and printed, not lost."""

    def run(*args: object) -> None:
        try:
            function(*args)
        except BaseException as error:  # reported by the thread that waits, or in the log
            errors.append(error)
            print(f"image import failed: {error}", file=sys.stderr, flush=True)

    return run


def _node_ready(api: client.CoreV1Api, name: str) -> bool:
    try:
        node = api.read_node(name)
    except client.ApiException:
        return False
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _start_scheduler(tools_dir: Path, plane: ControlPlane) -> ManagedProcess:
    binary = tools_dir / "kube-scheduler"
    if not binary.is_file():
        raise KubeletNodeError(f"kube-scheduler not found in {tools_dir}: run `make tools`")
    return ManagedProcess(
        "kube-scheduler",
        [
            str(binary),
            f"--kubeconfig={plane.admin_kubeconfig}",
            f"--authentication-kubeconfig={plane.admin_kubeconfig}",
            f"--authorization-kubeconfig={plane.admin_kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--v=1",
        ],
        log_path=plane.settings.workdir / "logs" / "kube-scheduler.log",
    )


def _start_kubelet(tools_dir: Path, node: KubeletNode) -> ManagedProcess:
    workdir, plane = node.workdir, node.control_plane
    binary = tools_dir / "kubelet"
    if not binary.is_file():
        raise KubeletNodeError(f"no kubelet in {tools_dir}: run `make tools`")
    root = workdir / "kubelet"
    (root / "state").mkdir(parents=True, exist_ok=True)
    KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(root / "state"), str(KUBELET_ROOT)], check=True, timeout=30)
    config_file = root / "config.yaml"
    settings = kubelet_config(root, plane.pki, node.containerd_socket, node.cgroups.name)
    config_file.write_text(yaml.safe_dump(settings))
    return ManagedProcess(
        "kubelet",
        [
            str(binary),
            f"--config={config_file}",
            f"--kubeconfig={plane.admin_kubeconfig}",
            f"--root-dir={KUBELET_ROOT}",
            f"--hostname-override={node.node_name}",
            f"--node-ip={netns.NODE_ADDRESS}",
            "--v=1",
        ],
        log_path=workdir / "logs" / "kubelet.log",
    )
