"""The control plane inside a ``SealedContainerd``'s namespaces, on the bridge address.

``start_control_plane`` (etcd, kube-apiserver, kube-controller-manager) run by a small process
that ``nsenter`` puts in the sandbox's network, mount and PID namespaces, so containers and a
kubelet there reach the API server at the node address its certificate names. kubectl runs there
too (``kubectl``), with the admin kubeconfig. The process (and the control plane with it, which it
stops on SIGTERM) ends with ``stop`` or with the sandbox.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from local_cluster import netns
from local_cluster.containerd_sandbox import SealedContainerd
from local_cluster.processes import ManagedProcess


class SandboxControlPlaneError(RuntimeError):
    """The control plane did not start; the message carries its log's tail."""


class SandboxControlPlane:
    def __init__(self, sandbox: SealedContainerd, tools_dir: Path, workdir: Path) -> None:
        self.sandbox = sandbox
        self.tools_dir = tools_dir
        self.workdir = workdir
        self.process: ManagedProcess | None = None

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig; its server is the bridge address, reached inside the sandbox."""
        return self.workdir / "admin.kubeconfig"

    def start(self, timeout: float = 120) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ready = self.workdir / "ready"
        starter = (
            "import time\n"
            "from pathlib import Path\n"
            "from local_cluster.control_plane import ControlPlaneSettings, start_control_plane\n"
            "from local_cluster.processes import reap_on_exit\n"
            "reap_on_exit()\n"
            f"plane = start_control_plane(ControlPlaneSettings(Path({str(self.tools_dir)!r}),"
            f" Path({str(self.workdir)!r}), address={netns.NODE_ADDRESS!r}, apiserver_port=6443))\n"
            f"Path({str(ready)!r}).write_text(plane.server)\n"
            "while True:\n"
            "    time.sleep(3600)\n"
        )
        self.process = ManagedProcess(
            "control-plane",
            self.sandbox.inside([sys.executable, "-c", starter]),
            log_path=self.workdir.parent / f"{self.workdir.name}.log",
        )
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.process.exited() or time.monotonic() > deadline:
                log = self.process.log_path.read_text(errors="replace")[-3000:]
                self.stop()
                raise SandboxControlPlaneError(f"the control plane did not start:\n{log}")
            time.sleep(0.2)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """kubectl inside the sealed network, as the cluster's admin."""
        argv = ["kubectl", "--kubeconfig", str(self.kubeconfig), *args]
        return self.sandbox.run_inside(argv, input_text=stdin, check=check, timeout=timeout)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
