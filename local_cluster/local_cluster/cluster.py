"""A whole local cluster (real control plane + node agent), and the ``make cluster-up/down`` CLI.

``start_local_cluster`` is what the e2e fixture uses: it starts the control plane
(``control_plane``), then the node agent as a child process, waits until the Node is
registered, prints the time to ready, and returns a ``LocalCluster`` with the
kubeconfig, an env for subprocesses and a ``kubectl`` runner. ``stop`` stops the agent
first (it kills its pods), sweeps any pod process group it left behind, then stops
controller-manager, apiserver and etcd.

The CLI gives developers a ``kind create cluster`` experience:
``python -m local_cluster.cluster up --workdir W --tools-dir T`` starts a detached
supervisor (``run``) that owns the cluster, waits for it, and prints the
``export KUBECONFIG=...`` line; ``down --workdir W`` stops it and everything it started.

What it does not do: more than one node, persistence across ``down`` (the workdir is
recreated by the next ``up``), or any network beyond loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
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
from local_cluster.node_agent import random_pod_subnet
from local_cluster.processes import (
    ManagedProcess,
    kill_process_group,
    process_group_alive,
    reap_on_exit,
    wait_group_gone,
)
from local_cluster.provisioner import DEFAULT_CLASS

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("kube-apiserver", "kube-controller-manager", "etcd", "helm", "kube-proxy", "coredns")
STATE_FILE = "cluster.json"


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


# ---- the CLI (make cluster-up / cluster-down) ------------------------------------------


def read_state(workdir: Path) -> dict[str, object] | None:
    """The running cluster's state file (supervisor pid, its children, kubeconfigs), if any."""
    try:
        state = json.loads((workdir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def stop_supervisor(
    workdir: Path, state: dict[str, object], popen: subprocess.Popen[bytes] | None = None
) -> list[int]:
    """SIGTERM the supervisor, SIGKILL what is left of it and its children; the groups still alive.

    ``popen``: the supervisor when this process started it; it must be reaped here, or its
    zombie keeps the process group alive in the eyes of ``wait_group_gone``.
    """
    supervisor = int(str(state["supervisor"]))
    kill_process_group(supervisor, signal.SIGTERM)
    if popen is not None:
        try:
            popen.wait(timeout=45)
        except subprocess.TimeoutExpired:
            kill_process_group(supervisor, signal.SIGKILL)
            popen.wait(timeout=30)
    elif not wait_group_gone(supervisor, 45):
        kill_process_group(supervisor, signal.SIGKILL)
    # If the supervisor died without tearing down, its children are still ours to stop.
    pids = state.get("pids")
    groups = [int(pid) for pid in pids] if isinstance(pids, list) else []
    for pid in groups:
        kill_process_group(pid, signal.SIGKILL)
    groups += sweep_pod_process_groups(workdir / "node")
    (workdir / STATE_FILE).unlink(missing_ok=True)
    # SIGKILL is not instant on a loaded machine: the groups still there after a grace.
    return [pid for pid in [supervisor, *groups] if not wait_group_gone(pid, 15)]


def _run_supervisor(workdir: Path, tools_dir: Path) -> int:
    """Own the cluster until SIGTERM; ``up`` starts this detached."""
    reap_on_exit()
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop_requested.set())
    cluster = start_local_cluster(LocalClusterSettings(tools_dir=tools_dir, workdir=workdir))
    try:
        state = {
            "supervisor": os.getpid(),
            "pids": cluster.pids(),
            "kubeconfig": str(cluster.kubeconfig),
            "readySeconds": round(cluster.ready_seconds, 1),
            "podSubnet": cluster.settings.pod_subnet,
        }
        (workdir / STATE_FILE).write_text(json.dumps(state))
        while not stop_requested.wait(1.0):
            if cluster.node_agent.exited():
                print(f"node agent exited; log {cluster.node_agent.log_path}", file=sys.stderr)
                break
    finally:
        cluster.stop()
        (workdir / STATE_FILE).unlink(missing_ok=True)
    return 0


def _up(workdir: Path, tools_dir: Path, pod_network: bool) -> int:
    workdir = workdir.resolve()
    state = read_state(workdir)
    if state and process_group_alive(int(str(state["supervisor"]))):
        print(f"cluster already running (supervisor pid {state['supervisor']})", file=sys.stderr)
        print(f"export KUBECONFIG={state['kubeconfig']}")
        return 0
    if workdir.exists():
        shutil.rmtree(workdir)  # a stopped cluster's leftovers: certificates, etcd data, pod dirs
    workdir.mkdir(parents=True)
    if pod_network:
        from local_cluster.sealed_cluster import start_sealed_cluster  # imports this module

        try:
            sealed = start_sealed_cluster(LocalClusterSettings(tools_dir=tools_dir, workdir=workdir))
        except ControlPlaneStartError as error:
            print(error, file=sys.stderr)
            return 1
        print(
            f"local cluster ready in {sealed.ready_seconds}s, pods on {netns.POD_CIDR} in a sealed "
            "namespace; `make shell` enters it; stop it with `make cluster-down`",
            file=sys.stderr,
        )
        print(f"export KUBECONFIG={sealed.kubeconfig}")
        return 0
    with (workdir / "supervisor.log").open("ab") as log:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "local_cluster.cluster",
                "run",
                f"--workdir={workdir}",
                f"--tools-dir={tools_dir}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while (state := read_state(workdir)) is None:
        if supervisor.poll() is not None or time.monotonic() > deadline:
            print(f"cluster did not start; see {workdir / 'supervisor.log'}:", file=sys.stderr)
            print((workdir / "supervisor.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            kill_process_group(supervisor.pid, signal.SIGTERM)
            return 1
        time.sleep(0.2)
    print(
        f"local cluster ready in {state['readySeconds']}s; stop it with `make cluster-down`", file=sys.stderr
    )
    print(f"export KUBECONFIG={state['kubeconfig']}")
    return 0


def _down(workdir: Path) -> int:
    workdir = workdir.resolve()
    state = read_state(workdir)
    if state is None:
        print(f"no cluster running in {workdir}", file=sys.stderr)
        sweep_pod_process_groups(workdir / "node")
        return 0
    lingering = stop_supervisor(workdir, state)
    if lingering:
        print(f"process groups still alive after SIGKILL: {lingering}", file=sys.stderr)
        return 1
    print("local cluster stopped", file=sys.stderr)
    return 0


def _shell(workdir: Path, argv: Sequence[str]) -> int:
    """Run ``argv`` (default: an interactive shell) in the sealed cluster's network and mounts."""
    state = read_state(workdir.resolve())
    if state is None or "nodeKubeconfig" not in state:
        print(f"no pod-network cluster running in {workdir}: run `make cluster-up`", file=sys.stderr)
        return 1
    pid = int(str(state["supervisor"]))
    command = list(argv) or [os.environ.get("SHELL", "/bin/bash")]
    env = {**os.environ, "KUBECONFIG": str(state["nodeKubeconfig"]), "PS1": "(local-cluster) \\w\\$ "}
    nsenter = ["nsenter", f"--net=/proc/{pid}/ns/net", f"--mount=/proc/{pid}/ns/mnt", "--", *command]
    return subprocess.run(nsenter, env=env, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local Kubernetes cluster for broker-failover (see docs)")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "run"):
        command = commands.add_parser(name)
        command.add_argument("--workdir", type=Path, required=True)
        command.add_argument("--tools-dir", type=Path, default=None)
    commands.choices["up"].add_argument(
        "--pod-network",
        action="store_true",
        help="real pod network (kube-proxy, CoreDNS) in a sealed namespace",
    )
    commands.add_parser("down").add_argument("--workdir", type=Path, required=True)
    shell = commands.add_parser("shell", help="a shell (or COMMAND) inside the pod-network cluster")
    shell.add_argument("--workdir", type=Path, required=True)
    shell.add_argument("command_args", nargs=argparse.REMAINDER, metavar="COMMAND")
    options = parser.parse_args(argv)
    if options.command == "down":
        return _down(options.workdir)
    if options.command == "shell":
        return _shell(options.workdir, [arg for arg in options.command_args if arg != "--"])
    tools_dir = options.tools_dir or built_tools_dir()
    if options.command == "up":
        return _up(options.workdir, tools_dir, options.pod_network)
    return _run_supervisor(options.workdir.resolve(), tools_dir)


if __name__ == "__main__":
    sys.exit(main())
