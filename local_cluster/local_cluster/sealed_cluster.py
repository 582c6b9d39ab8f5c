"""The local cluster with a real pod network, in a sealed namespace, reached through one loopback port.

``start_sealed_cluster`` (called from an ordinary process: a test, the demo, ``cluster up``)
opens a listening socket on the machine's loopback, then starts the supervisor under
``unshare`` (``netns.SEALED_COMMAND``) with that socket inherited. Inside, the supervisor
(``main``) turns its empty namespace into the node's network (bridge, routes, sysctls),
starts the control plane on the bridge address, the node agent with a network namespace
per pod, kube-proxy and CoreDNS, and splices connections from the inherited socket to the
API server. The caller gets a kubeconfig for ``https://127.0.0.1:<port>``, so kubectl,
helm and Python clients work from the machine as they would against kind.

Everything else stays inside: pod IPs, ClusterIPs and DNS names resolve only in the
cluster's namespace. ``SealedCluster.call_in_network`` runs a function on a thread that
joined it (a test's client), ``node_command`` prefixes a command to run there
(``make shell``). The namespace has no route out (``netns``), and it disappears with the
supervisor's last process.

Pids are the machine's (no PID namespace), so ``kill -9`` of a container's process group
from a test works as with loopback mode.

The supervisor restarts kube-apiserver when it exits, with the same flags, etcd data and
certificates, as a static pod's kubelet does (``restarts``; bounded backoff, and it gives up,
stopping the cluster, after repeated failed starts). ``SealedCluster.kill_apiserver`` is the
fault (``kill -9``), ``wait_apiserver_ready`` waits until the restarted one answers ``/readyz``
through the loopback port; the state file names the current pid and counts the restarts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from local_cluster import netns
from local_cluster.cluster import REPO_ROOT, ClusterAccess, LocalClusterSettings, start_local_cluster
from local_cluster.cluster_services import LoopbackForwarder
from local_cluster.cluster_state import STATE_FILE, read_state, stop_supervisor
from local_cluster.control_plane import ControlPlaneStartError
from local_cluster.pki import ClientCertificate, write_kubeconfig
from local_cluster.processes import ManagedProcess, kill_process_group, reap_on_exit
from local_cluster.restarts import ProcessKeeper, keep_apiserver

T = TypeVar("T")
HOST_KUBECONFIG = "admin.kubeconfig.host"


@dataclasses.dataclass
class SealedCluster(ClusterAccess):
    settings: LocalClusterSettings
    supervisor: subprocess.Popen[bytes] | None
    state: dict[str, object]

    @property
    def kubeconfig(self) -> Path:
        return Path(str(self.state["kubeconfig"]))

    @property
    def node_kubeconfig(self) -> Path:
        """The admin kubeconfig as seen inside the cluster (server on the bridge address)."""
        return Path(str(self.state["nodeKubeconfig"]))

    @property
    def supervisor_pid(self) -> int:
        return int(str(self.state["supervisor"]))

    @property
    def ready_seconds(self) -> float:
        return float(str(self.state["readySeconds"]))

    @property
    def network_namespace(self) -> Path:
        return Path(f"/proc/{self.supervisor_pid}/ns/net")

    def refresh_state(self) -> dict[str, object]:
        """Re-read the state file: the supervisor rewrites it when it restarts the API server."""
        state = read_state(self.settings.workdir)
        if state is not None:
            self.state = state
        return self.state

    @property
    def apiserver_pid(self) -> int:
        return int(str(self.refresh_state()["apiserver"]))

    @property
    def apiserver_restarts(self) -> int:
        return int(str(self.refresh_state().get("apiserverRestarts", 0)))

    def kill_apiserver(self) -> int:
        """``kill -9`` of kube-apiserver (a crash); the supervisor starts it again. Returns the pid."""
        pid = self.apiserver_pid
        os.killpg(pid, signal.SIGKILL)  # its own process group (ManagedProcess)
        return pid

    def wait_apiserver_ready(self, killed_pid: int | None = None, timeout: float = 120) -> float:
        """Wait until the API server (another one than ``killed_pid``) answers ``/readyz`` through
        the loopback port; the seconds waited. Fails with the supervisor's log if it gave up."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            supervisor_gone = self.supervisor is not None and self.supervisor.poll() is not None
            if supervisor_gone or not (self.settings.workdir / STATE_FILE).exists():
                log = (self.settings.workdir / "supervisor.log").read_text(errors="replace")[-4000:]
                raise ControlPlaneStartError(
                    f"the sealed cluster's supervisor stopped; supervisor.log:\n{log}"
                )
            if killed_pid is None or self.apiserver_pid != killed_pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    readyz = self.kubectl("get", "--raw=/readyz", "--request-timeout=2s", check=False)
                    if readyz.returncode == 0 and readyz.stdout.strip() == "ok":
                        return time.monotonic() - started
            time.sleep(0.25)
        log = (self.settings.workdir / "logs" / "kube-apiserver.log").read_text(errors="replace")[-3000:]
        raise ControlPlaneStartError(
            f"kube-apiserver not ready {timeout:.0f}s after the restart; its log:\n{log}"
        )

    def pids(self) -> list[int]:
        pids = self.state.get("pids")
        return [self.supervisor_pid, *(int(pid) for pid in pids)] if isinstance(pids, list) else []

    def call_in_network(self, function: Callable[[], T], timeout: float = 60) -> T:
        """Run ``function`` where pod IPs, ClusterIPs and the node address are reachable."""
        return netns.call_in_network_namespace(self.network_namespace, function, timeout)

    def node_command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the cluster's network and mount namespaces (pod IPs, ClusterIPs, /run/netns)."""
        pid = self.supervisor_pid
        return ["nsenter", f"--net=/proc/{pid}/ns/net", f"--mount=/proc/{pid}/ns/mnt", "--", *argv]

    def partition_pod(self, uid: str, direction: str = "both") -> None:
        """A real partition of one pod (nftables drop on its eth0); see ``netns.partition_pod``."""
        self._in_node_python(f"netns.partition_pod({uid!r}, {direction!r})")

    def heal_pod(self, uid: str) -> None:
        self._in_node_python(f"netns.heal_pod({uid!r})")

    def _in_node_python(self, statement: str) -> None:
        script = f"from local_cluster import netns; {statement}"
        result = subprocess.run(
            self.node_command([sys.executable, "-c", script]),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        if result.returncode != 0:
            raise netns.PodNetworkError(
                f"{statement} in the cluster's namespace failed: {result.stderr.strip()}"
            )

    def stop(self) -> None:
        lingering = stop_supervisor(self.settings.workdir, self.refresh_state(), self.supervisor)
        if lingering:
            raise RuntimeError(f"process groups of the sealed cluster still alive after SIGKILL: {lingering}")


def start_sealed_cluster(settings: LocalClusterSettings) -> SealedCluster:
    """Start the supervisor in a sealed namespace; return once the cluster (DNS included) is ready."""
    settings.workdir.mkdir(parents=True, exist_ok=True)
    (settings.workdir / STATE_FILE).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    log_path = settings.workdir / "supervisor.log"
    command = [
        *netns.SEALED_COMMAND,
        sys.executable,
        "-m",
        "local_cluster.sealed_cluster",
        f"--workdir={settings.workdir}",
        f"--tools-dir={settings.tools_dir}",
        f"--node-name={settings.node_name}",
        f"--images={settings.images_file}",
        f"--api-listen-fd={listener.fileno()}",
    ]
    with listener, log_path.open("ab") as log:
        supervisor = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            pass_fds=(listener.fileno(),),
            start_new_session=True,
        )
    deadline = time.monotonic() + settings.ready_timeout_seconds + 30
    while (state := read_state(settings.workdir)) is None:
        if supervisor.poll() is not None or time.monotonic() > deadline:
            if supervisor.poll() is None:
                kill_process_group(supervisor.pid, signal.SIGKILL)
                supervisor.wait(timeout=30)
            tail = log_path.read_text(errors="replace")[-6000:]
            raise ControlPlaneStartError(f"sealed cluster did not start; {log_path}:\n{tail}")
        time.sleep(0.1)
    return SealedCluster(settings=settings, supervisor=supervisor, state=state)


# ---- inside the sealed namespace -----------------------------------------------------------


def _serve(settings: LocalClusterSettings, listener: socket.socket) -> int:
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop_requested.set())
    netns.set_up_node_network()
    cluster = start_local_cluster(dataclasses.replace(settings, pod_network=True))
    forwarder = LoopbackForwarder(listener, (netns.NODE_ADDRESS, cluster.control_plane.apiserver_port))
    keeper: ProcessKeeper | None = None
    try:
        forwarder.start()
        pki = cluster.control_plane.pki
        host_kubeconfig = write_kubeconfig(
            settings.workdir / HOST_KUBECONFIG,
            server=f"https://127.0.0.1:{forwarder.port}",
            ca_cert=pki.ca_cert,
            user="admin",
            client=ClientCertificate(cert=pki.admin.cert, key=pki.admin.key),
        )
        restarts = 0

        def write_state(apiserver: ManagedProcess) -> None:
            state = {
                "supervisor": os.getpid(),
                "pids": cluster.pids(),
                "apiserver": apiserver.pid,
                "apiserverRestarts": restarts,
                "kubeconfig": str(host_kubeconfig),
                "nodeKubeconfig": str(cluster.kubeconfig),
                "readySeconds": round(cluster.ready_seconds, 1),
                "podNetwork": netns.POD_CIDR,
            }
            staged = settings.workdir / f"{STATE_FILE}.tmp"
            staged.write_text(json.dumps(state))
            staged.replace(settings.workdir / STATE_FILE)  # readers never see half a state file

        def restarted(apiserver: ManagedProcess) -> None:
            nonlocal restarts
            restarts += 1
            write_state(apiserver)

        keeper = keep_apiserver(cluster.control_plane, restarted)
        write_state(keeper.process)
        keeper.start()
        while not stop_requested.wait(0.5):
            if cluster.node_agent.exited():
                print(f"node agent exited; log {cluster.node_agent.log_path}", file=sys.stderr, flush=True)
                break
            if keeper.failure is not None:
                print("giving up on kube-apiserver; stopping the cluster", file=sys.stderr, flush=True)
                break
    finally:
        if keeper is not None:
            keeper.stop()  # before the control plane stops, or it would restart the API server
        forwarder.stop()
        cluster.stop()
        (settings.workdir / STATE_FILE).unlink(missing_ok=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Supervisor of the sealed local cluster (see module doc)")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--tools-dir", type=Path, required=True)
    parser.add_argument("--node-name", default="local-node")
    parser.add_argument("--images", type=Path, required=True)
    parser.add_argument("--api-listen-fd", type=int, required=True)
    options = parser.parse_args(argv)
    reap_on_exit()
    listener = socket.socket(fileno=options.api_listen_fd)
    settings = LocalClusterSettings(
        tools_dir=options.tools_dir,
        workdir=options.workdir,
        node_name=options.node_name,
        images_file=options.images,
        pod_network=True,
    )
    return _serve(settings, listener)


if __name__ == "__main__":
    sys.exit(main())
