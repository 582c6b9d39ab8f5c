"""The local cluster: a real node in a sealed namespace, reached through one loopback port.

``start_sealed_cluster`` (called from an ordinary process: a test, the demo, ``cluster up``)
opens a listening socket on the machine's loopback, then starts the supervisor under
``unshare`` (``containerd_sandbox.SEALED_COMMAND``: new network, mount and PID namespaces) with
that socket inherited. Inside, the supervisor (``sealed_supervisor``), PID 1 of its namespace,
turns the empty network into the node's (bridge, routes, sysctls), starts the node
(``kubelet_node``: containerd, the images, the control plane on the bridge address,
kube-scheduler, the kubelet, kube-proxy, CoreDNS and kind's local-path-provisioner) and splices
connections from the inherited socket to the API server. The caller gets a kubeconfig for
``https://127.0.0.1:<port>``, so kubectl, helm and Python clients work from the machine as they
would against kind.

Everything else stays inside: pod IPs, ClusterIPs and DNS names resolve only in the cluster's
namespace. ``SealedCluster.call_in_network`` runs a function on a thread that joined it (a test's
client), ``node_command`` prefixes a command to run there (``make shell``). The namespace has no
route out (``netns``), and it ends with the supervisor: when PID 1 of a namespace exits, the
kernel kills every process left in it, and the mounts and network go with the last of them.

Faults a test injects go through the real runtime: ``signal_container`` is ``ctr task kill`` of a
pod's container (SIGKILL, SIGSTOP, SIGCONT to all its processes), ``partition_pod`` drops the
pod's traffic with nftables in the pod's own network namespace.

With ``settings.nodes`` above 1 the supervisor starts several nodes instead (``cluster_nodes``:
``node-1`` ... ``node-N``, each a kubelet, containerd and kube-proxy in a network namespace and a
cgroup of its own). ``SealedCluster.nodes`` names them as a test needs them (``sealed_node``):
address, pod CIDR, a command or a call in the node's network namespace, the machine's pids of its
kubelet, containerd and kube-proxy, and the cgroup under which every process of the node runs.

The supervisor restarts kube-apiserver when it exits, with the same flags, etcd data and
certificates, as a static pod's kubelet does (``restarts``; bounded backoff, and it gives up,
stopping the cluster, after repeated failed starts). ``SealedCluster.kill_apiserver`` is the
fault (``kill -9``), ``wait_apiserver_ready`` waits until the restarted one answers ``/readyz``
through the loopback port; the state file names the current pid (in the cluster's PID namespace)
and counts the restarts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from local_cluster import netns, processes
from local_cluster.cgroups import CgroupRoot
from local_cluster.cluster import REPO_ROOT, ClusterAccess, LocalClusterSettings
from local_cluster.cluster_state import (
    PIDS_FILE,
    RESTART_NODE_FAILED,
    RESTART_NODE_REQUEST,
    STATE_FILE,
    read_state,
)
from local_cluster.containerd_sandbox import NAMESPACE, SEALED_COMMAND
from local_cluster.control_plane import ControlPlaneStartError
from local_cluster.image_archives import archive_for
from local_cluster.image_seed import IMAGES_FILE
from local_cluster.kubelet_node import cgroup_root_name
from local_cluster.processes import (
    cancel_on_exit,
    kill_process_group,
    on_exit,
    wait_group_gone,
)
from local_cluster.sealed_node import SealedClusterError, SealedNode

T = TypeVar("T")


@dataclasses.dataclass
class SealedCluster(ClusterAccess):
    settings: LocalClusterSettings
    supervisor: subprocess.Popen[bytes] | None
    state: dict[str, object]
    _stop_on_exit: Callable[[], None] = lambda: None

    @property
    def kubeconfig(self) -> Path:
        return Path(str(self.state["kubeconfig"]))

    @property
    def node_kubeconfig(self) -> Path:
        """The admin kubeconfig as seen inside the cluster (server on the bridge address)."""
        return Path(str(self.state["nodeKubeconfig"]))

    @property
    def supervisor_pid(self) -> int:
        """The supervisor (PID 1 of the cluster's namespaces) as the machine sees it."""
        return int(str(self.state["namespacePid"]))

    @property
    def ready_seconds(self) -> float:
        return float(str(self.state["readySeconds"]))

    @property
    def network_namespace(self) -> Path:
        return Path(f"/proc/{self.supervisor_pid}/ns/net")

    @property
    def host_address(self) -> str:
        """The cluster namespace's own address, where the API server listens and where a test's
        server (a simulator) is reached from pods: the bridge's with one node, ``nodes0``'s with
        several."""
        return netns.NODE_ADDRESS if self.settings.nodes == 1 else netns.CONTROL_PLANE_ADDRESS

    @property
    def nodes(self) -> list[SealedNode]:
        """The cluster's nodes, in order (``local-node``; or ``node-1`` ... ``node-N``)."""
        described = self.state.get("nodes")
        return [
            SealedNode(
                name=str(node["name"]),
                address=str(node["address"]),
                pod_cidr=str(node["podCIDR"]),
                cgroup=str(node["cgroup"]),
                containerd_socket=str(node["containerdSocket"]),
                pod_logs=Path(str(node["podLogs"])),
                supervisor_pid=self.supervisor_pid,
                namespace_path=None if node["networkNamespace"] is None else str(node["networkNamespace"]),
                namespace_pids={str(k): int(v) for k, v in node["pids"].items()},
            )
            for node in (described if isinstance(described, list) else [])
        ]

    def node(self, name: str) -> SealedNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise SealedClusterError(f"no node {name} in this cluster: {[n.name for n in self.nodes]}")

    @property
    def pod_logs(self) -> Path:
        """The kubelet's pod logs: ``<namespace>_<pod>_<uid>/<container>/<restart>.log``."""
        return Path(str(self.state["podLogs"]))

    def refresh_state(self) -> dict[str, object]:
        """Re-read the state file: the supervisor rewrites it when it restarts the API server."""
        state = read_state(self.settings.workdir)
        if state is not None:
            self.state = state
        return self.state

    @property
    def apiserver_pid(self) -> int:
        """kube-apiserver's pid in the cluster's PID namespace."""
        return int(str(self.refresh_state()["apiserver"]))

    @property
    def apiserver_restarts(self) -> int:
        return int(str(self.refresh_state().get("apiserverRestarts", 0)))

    def kill_apiserver(self) -> int:
        """``kill -9`` of kube-apiserver (a crash); the supervisor starts it again. Returns the pid."""
        pid = self.apiserver_pid
        # Its own process group (ManagedProcess), named by its pid in the cluster's PID namespace.
        subprocess.run(self.node_command(["kill", "-9", "--", f"-{pid}"]), check=True, timeout=30)
        return pid

    def restart_node(self, name: str, timeout: float = 180) -> None:
        """Boot a node again after ``SealedNode.crash``: its containerd, kubelet and kube-proxy,
        started by the supervisor as at first; returns once the restarted kubelet has reported the
        Node Ready (a heartbeat after the request: until the controller-manager's grace period
        runs out, the API server still shows the crashed node Ready)."""
        workdir = self.settings.workdir
        asked = time.time()
        (workdir / f"{RESTART_NODE_FAILED}{name}").unlink(missing_ok=True)
        staged = workdir / f".{RESTART_NODE_REQUEST}{name}"
        staged.write_text(str(self.settings.tools_dir))
        staged.replace(workdir / f"{RESTART_NODE_REQUEST}{name}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            failed = workdir / f"{RESTART_NODE_FAILED}{name}"
            if failed.exists():
                raise SealedClusterError(f"restarting {name} failed: {failed.read_text()}")
            if not (workdir / f"{RESTART_NODE_REQUEST}{name}").exists() and self.node_ready(
                name, since=asked
            ):
                return
            time.sleep(0.5)
        raise SealedClusterError(f"{name} not Ready {timeout:.0f}s after its restart was asked for")

    def node_ready(self, name: str, since: float | None = None) -> bool:
        """Whether the API server shows Node ``name`` with condition Ready True (and, with
        ``since``, a wall-clock time, whether its kubelet has renewed the node's Lease after it)."""
        found = self.kubectl("get", "node", name, "-o", "json", check=False)
        node = json.loads(found.stdout) if found.returncode == 0 else {}
        conditions = (node.get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return False
        if since is None:
            return True
        lease = self.get_json("kube-node-lease", "lease", name) or {}
        renewed = (lease.get("spec") or {}).get("renewTime")
        return (
            renewed is not None
            and datetime.datetime.fromisoformat(renewed.replace("Z", "+00:00")).timestamp() > since
        )

    def signal_controller_manager(self, signal_name: str) -> None:
        """``kill -STOP`` (or ``-CONT``, ...) kube-controller-manager: with it stopped, nothing but
        the operator writes the ``-active`` Service's endpoints (issue 23)."""
        pid = self.refresh_state().get("controllerManager")
        if pid is None:
            raise SealedClusterError("the cluster's state names no kube-controller-manager")
        subprocess.run(
            self.node_command(["kill", f"-{signal_name}", "--", f"-{pid}"]), check=True, timeout=30
        )

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

    def call_in_network(self, function: Callable[[], T], timeout: float = 60) -> T:
        """Run ``function`` where pod IPs, ClusterIPs and the node address are reachable."""
        return netns.call_in_network_namespace(self.network_namespace, function, timeout)

    def node_command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the cluster's network, mount and PID namespaces (pod IPs, ClusterIPs,
        the node's /run and /proc)."""
        return ["nsenter", "-t", str(self.supervisor_pid), "--net", "--mount", "--pid", "--", *argv]

    # --- the images the node has -----------------------------------------------------------

    def imported_images(self) -> list[str]:
        """The images (``broker-failover/broker``, ...) imported into the node's containerd so far."""
        try:
            loaded = json.loads((self.settings.workdir / IMAGES_FILE).read_text())
        except (OSError, ValueError):
            return []
        return [str(name) for name in loaded] if isinstance(loaded, list) else []

    def ensure_images(self, names: Sequence[str], timeout: float = 600) -> None:
        """Make sure ``names`` are in the node's containerd: wait for those the node imports in the
        background (``background_images``), import the others now (the validator's, on demand)."""
        deadline = time.monotonic() + timeout
        pending = set(self.settings.background_images)
        for name in sorted(set(names) - set(self.imported_images()) - pending):
            archive = archive_for(name)
            for node in self._every_node():
                timeout_left = max(1.0, deadline - time.monotonic())
                self.ctr("images", "import", str(archive), timeout=timeout_left, node=node)
            record = self.settings.workdir / IMAGES_FILE
            record.write_text(json.dumps([*self.imported_images(), name]))
        while missing := sorted(set(names) - set(self.imported_images())):
            if time.monotonic() > deadline:
                raise ControlPlaneStartError(f"images {missing} not imported after {timeout:.0f}s")
            time.sleep(0.5)

    def tag_image(self, source: str, target: str) -> None:
        """Give an imported image another name in every node's containerd (``ctr images tag``)."""
        for node in self._every_node():
            self.ctr("images", "tag", "--force", source, target, node=node)

    # --- faults, through the container runtime ------------------------------------------------

    def ctr(self, *args: str, timeout: float = 60, node: str | None = None) -> str:
        """``ctr`` against a node's containerd (its socket is in the cluster's /run), in the CRI's
        namespace; ``node`` None: the first node's."""
        socket_path = self.node(node).containerd_socket if node else str(self.state["containerdSocket"])
        command = self.node_command(["ctr", "--address", socket_path, "-n", NAMESPACE, *args])
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise SealedClusterError(f"{' '.join(command)} failed: {result.stderr.strip()}")
        return result.stdout

    @staticmethod
    def container_id(pod: dict[str, Any], container: str | None = None) -> str:
        """The running container's id (the first container's when ``container`` is None)."""
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for status in statuses:
            if (container is None or status["name"] == container) and status.get("containerID"):
                return str(status["containerID"]).split("://", 1)[1]
        name = pod["metadata"]["name"]
        raise SealedClusterError(f"pod {name} has no started container {container or ''}".rstrip())

    def signal_container(self, pod: dict[str, Any], signal_name: str, container: str | None = None) -> None:
        """Send ``signal_name`` (``SIGKILL``, ``SIGSTOP``, ``SIGCONT``) to every process of the pod's
        container, as the runtime does: a kill -9 of the container, or a freeze."""
        container_id = self.container_id(pod, container)
        self.ctr("task", "kill", "--all", "--signal", signal_name, container_id, node=self._node_of(pod))

    def container_pid(self, pod: dict[str, Any], container: str | None = None) -> int:
        """The container's main process, by its pid in the cluster's PID namespace."""
        wanted = self.container_id(pod, container)
        for line in self.ctr("task", "list", node=self._node_of(pod)).splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 2 and fields[0] == wanted:
                return int(fields[1])
        raise SealedClusterError(f"container {wanted} of pod {pod['metadata']['name']} has no task")

    def _every_node(self) -> list[str | None]:
        """``ctr``'s ``node`` for each node (None: the single node's containerd, as before)."""
        return [None] if self.settings.nodes == 1 else [node.name for node in self.nodes]

    def _node_of(self, pod: dict[str, Any]) -> str | None:
        """The pod's node when the cluster has several (its containers are in that containerd)."""
        return str(pod["spec"]["nodeName"]) if self.settings.nodes > 1 else None

    def host_pid(self, pid: int) -> int:
        """The machine's pid of the process that has ``pid`` in the cluster's PID namespace: for a
        fault that must land at a known instant (``os.kill`` from here, no ``ctr`` to start)."""
        return processes.host_pid_of(self.supervisor_pid, pid)

    def partition_pod(self, pod: dict[str, Any], direction: str = "both") -> None:
        """A real partition of one pod: nftables drops on its eth0, in its own network namespace
        (``netns.partition_network``); it outlives container restarts, as the pod's sandbox does."""
        pid = self.container_pid(pod)
        self._in_node_python(f"netns.partition_network('/proc/{pid}/ns/net', {direction!r})")

    def heal_pod(self, pod: dict[str, Any]) -> None:
        pid = self.container_pid(pod)
        self._in_node_python(f"netns.heal_network('/proc/{pid}/ns/net')")

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
        cancel_on_exit(self._stop_on_exit)
        lingering = stop_sealed_cluster(self.settings.workdir, self.refresh_state(), self.supervisor)
        if lingering:
            raise RuntimeError(f"the sealed cluster left behind: {lingering}")


def stop_sealed_cluster(
    workdir: Path, state: dict[str, object], popen: subprocess.Popen[bytes] | None = None, grace: float = 90
) -> list[str]:
    """SIGTERM the supervisor (it stops the node, pods first); SIGKILL it after ``grace`` (the kernel
    then kills everything in its namespace); remove the node's cgroups if it could not. Returns
    what is left: a process group still alive, cgroups that could not be removed."""
    supervisor = int(str(state["supervisor"]))
    inside = int(str(state.get("namespacePid", supervisor)))
    with contextlib.suppress(ProcessLookupError):
        os.kill(inside, signal.SIGTERM)
    if popen is not None:  # our child: until reaped, its zombie keeps the group alive
        try:
            popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            kill_process_group(supervisor, signal.SIGKILL)
            popen.wait(timeout=30)
    elif not wait_group_gone(supervisor, grace):
        kill_process_group(supervisor, signal.SIGKILL)
    left = [f"process group {supervisor}"] if not wait_group_gone(supervisor, 15) else []
    left += [str(path) for path in CgroupRoot(cgroup_root_name(workdir)).remove()]
    (workdir / STATE_FILE).unlink(missing_ok=True)
    return left


def start_sealed_cluster(settings: LocalClusterSettings) -> SealedCluster:
    """Start the supervisor in a sealed namespace; return once the cluster (DNS included) is ready."""
    settings.workdir.mkdir(parents=True, exist_ok=True)
    for name in (STATE_FILE, PIDS_FILE):
        (settings.workdir / name).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    log_path = settings.workdir / "supervisor.log"
    command = [
        *SEALED_COMMAND,
        sys.executable,
        "-m",
        "local_cluster.sealed_supervisor",
        f"--workdir={settings.workdir}",
        f"--tools-dir={settings.tools_dir}",
        f"--node-name={settings.node_name}",
        f"--nodes={settings.nodes}",
        f"--ready-timeout={settings.ready_timeout_seconds}",
        f"--api-listen-fd={listener.fileno()}",
        f"--background-images={','.join(settings.background_images)}",
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
    deadline = time.monotonic() + settings.ready_timeout_seconds + 90

    def failed(why: str) -> ControlPlaneStartError:
        if supervisor.poll() is None:
            kill_process_group(supervisor.pid, signal.SIGKILL)
            supervisor.wait(timeout=30)
        CgroupRoot(cgroup_root_name(settings.workdir)).remove()
        tail = log_path.read_text(errors="replace")[-6000:]
        return ControlPlaneStartError(f"sealed cluster did not start ({why}); {log_path}:\n{tail}")

    # `unshare --fork` stays in the machine's PID namespace; its child, the supervisor, is PID 1 of
    # the sealed one and the process whose namespaces `nsenter` joins.
    children: list[str] = []
    while not children:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children").read_text().split()
        if supervisor.poll() is not None or time.monotonic() > deadline:
            raise failed("unshare exited")
        time.sleep(0.01)
    pids = {"supervisor": supervisor.pid, "namespacePid": int(children[0])}
    (settings.workdir / PIDS_FILE).write_text(json.dumps(pids))
    while (state := read_state(settings.workdir)) is None or "kubeconfig" not in state:
        if supervisor.poll() is not None or time.monotonic() > deadline:
            raise failed("the supervisor exited" if supervisor.poll() is not None else "timed out")
        time.sleep(0.1)
    cluster = SealedCluster(settings=settings, supervisor=supervisor, state=state)
    # An interrupted test run or demo (SIGTERM, Ctrl-C) still stops the cluster (reap_on_exit).
    cluster._stop_on_exit = on_exit(cluster.stop)
    return cluster
