"""A real node: the kubelet (built with the other tools) on containerd's CRI, in a sealed namespace.

The first step of replacing the node agent (docs/local-cluster.md): ``KubeletNode`` starts, in the
namespaces of a ``SealedContainerd(cri=True)``,

* the control plane (etcd, kube-apiserver, kube-controller-manager) on the bridge address, as
  ``start_local_cluster`` does for the node agent's cluster;
* the kubelet, registered as a Node, on containerd with runc and the CNI bridge plugin, running
  pods from the images ``make images`` built (imported beforehand; nothing is pulled).

The settings are the ones ``../shared/design/REAL_NODE.md`` records as working on this machine
kind: cgroupfs under a cgroup root of the node's own (made in every v1 hierarchy first, and
removed bottom-up at the end, since those are the machine's cgroups), no swap check, no node
allocatable enforcement, no local-storage isolation (the kubelet cannot size this VM's disk),
the kubelet's state and pod logs under the node's directory.

What it does not do yet: schedule (no kube-scheduler; pods name their ``nodeName``), kube-proxy,
CoreDNS or volumes beyond the kubelet's own (emptyDir, Secret, ConfigMap, hostPath); the demo,
the soak and the e2e tests still run on the node agent.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from local_cluster import netns
from local_cluster.containerd_sandbox import CgroupRoot, ContainerdError, SealedContainerd
from local_cluster.processes import ManagedProcess
from local_cluster.sandbox_control_plane import SandboxControlPlane

KUBELET_PORT = 10250


class KubeletNodeError(RuntimeError):
    """The kubelet did not come up; the message carries its log's tail."""


def _tail(path: Path, size: int = 3000) -> str:
    return path.read_text(errors="replace")[-size:] if path.exists() else "(no log)"


class KubeletNode:
    """Control plane and one kubelet inside ``sandbox`` (which must have been started with CRI)."""

    def __init__(self, sandbox: SealedContainerd, tools_dir: Path, workdir: Path, name: str) -> None:
        if not sandbox.cri:
            raise ValueError("a kubelet needs containerd's CRI: SealedContainerd(cri=True)")
        self.sandbox = sandbox
        self.tools_dir = tools_dir
        self.workdir = workdir
        self.name = name
        self.cgroups = CgroupRoot(f"broker-failover-{name}")
        self.plane = SandboxControlPlane(sandbox, tools_dir, workdir / "control-plane")
        self.kubelet: ManagedProcess | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self.plane.kubectl(*args, stdin=stdin, check=check, timeout=timeout)

    def start(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        try:
            self.plane.start(timeout)
            self._start_kubelet(deadline)
        except BaseException:
            self.stop()
            self.sandbox.stop()
            self.cgroups.remove()
            raise

    def _start_kubelet(self, deadline: float) -> None:
        kubelet = self.tools_dir / "kubelet"
        if not kubelet.exists():
            raise KubeletNodeError(f"no kubelet in {self.tools_dir}: run `make tools`")
        pki = self.workdir / "control-plane" / "pki"
        root = self.workdir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": netns.NODE_ADDRESS,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            # The API server's client certificate (kubectl logs, exec) is signed by the cluster CA;
            # the kubelet serves with the node certificate the same CA signed.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "tlsCertFile": str(pki / "kubelet.crt"),
            "tlsPrivateKeyFile": str(pki / "kubelet.key"),
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroups.name}",
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.sandbox.socket}",
            "enforceNodeAllocatable": [],
            "localStorageCapacityIsolation": False,
            "podLogsDir": str(root / "pod-logs"),
            "clusterDNS": [netns.CLUSTER_DNS_IP],
            "clusterDomain": netns.CLUSTER_DOMAIN,
            "serializeImagePulls": False,
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "2s",
        }
        config_file = root / "config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.cgroups.create()
        argv = [
            str(kubelet),
            f"--config={config_file}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={root / 'state'}",
            f"--hostname-override={self.name}",
            f"--node-ip={netns.NODE_ADDRESS}",
            "--v=1",
        ]
        self.kubelet = ManagedProcess(
            "kubelet", self.sandbox.inside(argv), log_path=self.workdir / "kubelet.log"
        )
        while not self.node_ready():
            if self.kubelet.exited() or time.monotonic() > deadline:
                raise KubeletNodeError(
                    f"node {self.name} did not become Ready:\n{_tail(self.kubelet.log_path)}"
                )
            time.sleep(0.5)

    def node_ready(self) -> bool:
        try:
            result = self.kubectl("get", "node", self.name, "-o", "json", check=False, timeout=20)
        except (ContainerdError, subprocess.TimeoutExpired):
            return False
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        """Stop the kubelet and the control plane. The pods' processes end with the sandbox (PID 1
        of their namespace); then ``cgroups.remove()`` clears the node's cgroups, which are the
        machine's and stay until removed."""
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None
        self.plane.stop()
