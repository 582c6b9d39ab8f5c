"""A whole local cluster (real control plane + node agent), as a library.

``start_local_cluster`` is what the e2e fixture uses: it starts the control plane
(``control_plane``), then the node agent as a child process, waits until the Node is
registered, prints the time to ready, and returns a ``LocalCluster`` with the
kubeconfig, an env for subprocesses and a ``kubectl`` runner. ``stop`` stops the agent
first (it kills its pods), sweeps any pod process group it left behind, then stops
controller-manager, apiserver and etcd.

The ``make cluster-up/down`` CLI is ``cluster_cli``; ``python -m local_cluster.cluster``
runs it, as it always has.

What it does not do: more than one node, or any network beyond loopback (pod-network mode,
``pod_network``, runs only inside the sealed namespace ``sealed_cluster`` makes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config

from local_cluster import netns
from local_cluster.cluster_services import (
    KUBE_PROXY_HEALTHZ,
    install_cluster_dns,
    start_kube_proxy,
    wait_for_healthz,
)
from local_cluster.control_plane import (
    ApiProbe,
    ControlPlane,
    ControlPlaneSettings,
    ControlPlaneStartError,
    start_control_plane,
)
from local_cluster.images import DEFAULT_IMAGES_FILE
from local_cluster.node_settings import random_pod_subnet
from local_cluster.processes import ManagedProcess, kill_process_group
from local_cluster.provisioner import DEFAULT_CLASS

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "etcd",
    "helm",
    "kube-proxy",
    "coredns",
)


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.output}\nstderr: {self.stderr}"


def built_tools_dir() -> Path:
    """The bin directory ``make tools`` fills for the current pins; fails clearly if not built."""
    result = subprocess.run(
        [str(REPO_ROOT / "hack/tools/build.sh"), "--print"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    tools_dir = Path(result.stdout.strip())
    missing = [tool for tool in TOOLS if not (tools_dir / tool).is_file()]
    if missing:
        raise ControlPlaneStartError(
            f"{', '.join(missing)} not built in {tools_dir} for the current pins: "
            "run `make tools` (takes minutes, once)"
        )
    return tools_dir


@dataclass(frozen=True)
class LocalClusterSettings:
    tools_dir: Path
    workdir: Path
    node_name: str = "local-node"
    pod_subnet: str = field(default_factory=random_pod_subnet)
    images_file: Path = DEFAULT_IMAGES_FILE
    ready_timeout_seconds: float = 90.0
    # A real pod network (netns.py): only inside the cluster's sealed namespace, which
    # ``sealed_cluster.start_sealed_cluster`` makes. Loopback mode otherwise.
    pod_network: bool = False
    # The sealed cluster's node: images imported in the background once it is ready, beyond those
    # it always imports (``kubelet_node.ON_DEMAND_IMAGES``: the validator's).
    background_images: tuple[str, ...] = ()


class ClusterAccess:
    """kubectl, helm and API clients for a cluster, given its kubeconfig and tools."""

    settings: LocalClusterSettings

    @property
    def kubeconfig(self) -> Path:
        raise NotImplementedError

    @property
    def workdir(self) -> Path:
        return self.settings.workdir

    @property
    def tools_dir(self) -> Path:
        return self.settings.tools_dir

    @property
    def state_dir(self) -> Path:
        """The node agent's directory: pods/<ns>_<name>_<uid>/logs, and claims/<ns>/<claim>: the
        directory of the volume provisioned for that claim (``provisioner``), gone with the claim."""
        return self.settings.workdir / "node"

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG, with the tools (helm) first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.tools_dir}:{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        command = ["kubectl", f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, command, result.stdout, result.stderr)
        return result

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [str(self.tools_dir / "helm"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, env=self.env
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, command, result.stdout, result.stderr)
        return result

    def api_client(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))


@dataclass
class LocalCluster(ClusterAccess):
    settings: LocalClusterSettings
    control_plane: ControlPlane
    node_agent: ManagedProcess
    ready_seconds: float
    # Pod-network mode: kube-proxy (stopped before the node agent, started after it).
    node_services: list[ManagedProcess] = field(default_factory=list)

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.admin_kubeconfig

    def pids(self) -> list[int]:
        return [p.pid for p in [*self.control_plane.processes, self.node_agent, *self.node_services]]

    def stop(self) -> None:
        for service in reversed(self.node_services):
            service.stop()
        self.node_agent.stop(grace_seconds=10)
        sweep_pod_process_groups(self.state_dir)
        self.control_plane.stop()


def sweep_pod_process_groups(state_dir: Path) -> list[int]:
    """SIGKILL any pod process group the node agent recorded and did not reap (agent killed -9)."""
    killed = []
    pgid_dir = state_dir / "pgids"
    for entry in pgid_dir.glob("*") if pgid_dir.is_dir() else []:
        if entry.name.isdigit() and kill_process_group(int(entry.name), signal.SIGKILL):
            killed.append(int(entry.name))
        entry.unlink(missing_ok=True)
    return killed


def start_local_cluster(settings: LocalClusterSettings) -> LocalCluster:
    started = time.monotonic()
    settings.workdir.mkdir(parents=True, exist_ok=True)
    plane = start_control_plane(
        ControlPlaneSettings(
            tools_dir=settings.tools_dir,
            workdir=settings.workdir,
            ready_timeout_seconds=settings.ready_timeout_seconds,
            address=netns.NODE_ADDRESS if settings.pod_network else "127.0.0.1",
            apiserver_port=6443 if settings.pod_network else None,
        )
    )
    try:
        agent = ManagedProcess(
            "node-agent",
            [
                sys.executable,
                "-m",
                "local_cluster.node_agent",
                f"--kubeconfig={plane.admin_kubeconfig}",
                f"--state-dir={settings.workdir / 'node'}",
                f"--node-name={settings.node_name}",
                f"--pod-subnet={settings.pod_subnet}",
                f"--images={settings.images_file}",
                *(["--pod-network"] if settings.pod_network else []),
            ],
            log_path=settings.workdir / "logs" / "node-agent.log",
            cwd=REPO_ROOT,
            # The tools directory on PATH: images.yaml maps the cluster DNS image to coredns.
            env={
                **os.environ,
                "PYTHONPATH": str(REPO_ROOT),
                "PATH": f"{settings.tools_dir}:{os.environ.get('PATH', '')}",
            },
        )
    except BaseException:
        plane.stop()
        raise
    cluster = LocalCluster(settings=settings, control_plane=plane, node_agent=agent, ready_seconds=0.0)
    probe = ApiProbe(plane.server, plane.pki)
    deadline = started + settings.ready_timeout_seconds
    try:
        while probe.status(f"/api/v1/nodes/{settings.node_name}") != 200:
            if agent.exited() or time.monotonic() > deadline:
                raise ControlPlaneStartError(
                    f"node agent did not register node {settings.node_name}; "
                    f"log {agent.log_path}:\n{agent.log_tail()}"
                )
            time.sleep(0.1)
        # The node agent's provisioner creates the default StorageClass: claims made from now on get it.
        while probe.status(f"/apis/storage.k8s.io/v1/storageclasses/{DEFAULT_CLASS}") != 200:
            if agent.exited() or time.monotonic() > deadline:
                raise ControlPlaneStartError(
                    f"node agent did not create the StorageClass {DEFAULT_CLASS}; "
                    f"log {agent.log_path}:\n{agent.log_tail()}"
                )
            time.sleep(0.1)
        if settings.pod_network:
            proxy = start_kube_proxy(plane, settings.node_name)
            cluster.node_services.append(proxy)
            wait_for_healthz(KUBE_PROXY_HEALTHZ, deadline, proxy)
            install_cluster_dns(plane.admin_kubeconfig)
    except BaseException:
        cluster.stop()
        raise
    cluster.ready_seconds = time.monotonic() - started
    network = (
        f"pods on {netns.POD_CIDR}, kube-proxy, CoreDNS"
        if settings.pod_network
        else f"pods on {settings.pod_subnet}.0/24"
    )
    print(
        f"local cluster ready in {cluster.ready_seconds:.1f}s "
        f"(etcd, kube-apiserver, kube-controller-manager, node agent; {network})",
        file=sys.stderr,
        flush=True,
    )
    return cluster


if __name__ == "__main__":
    # `python -m local_cluster.cluster up|run|down|shell`: the Makefile's entry point.
    from local_cluster.cluster_cli import main

    sys.exit(main())
