"""Services and DNS for the local cluster in pod-network mode: the real kube-proxy and CoreDNS.

kube-proxy runs on the node (in the cluster's sealed namespace) as a DaemonSet pod with
hostNetwork would: nftables mode, authenticated as ``system:kube-proxy`` (the bootstrap
RBAC policy's node-proxier), told the node's name so it finds the Node's InternalIP.
CoreDNS runs as a pod behind the ``kube-dns`` Service (``cluster_dns.yaml``).

Settings that differ from kube-proxy's defaults, and why:

- ``conntrack.maxPerCore: 0``: do not touch ``nf_conntrack_max`` (refused in this sandbox;
  a production node keeps the default).
- ``nftables.minSyncPeriod: 100ms``: with the default 1 s, back-to-back EndpointSlice
  changes (a failover blanks the ``-active`` slice, then points it at the new pod) wait
  up to a second for the second sync; 100 ms keeps a failover's rule update at tens of
  milliseconds. A production cluster that wants the same failover latency sets the same.

``LoopbackForwarder`` makes the API server, which listens on the node's bridge address
inside the sealed namespace, reachable from the machine's loopback: the listening socket
is made before the namespace is, so it stays on the machine's loopback, and each accepted
connection is spliced to a connection opened inside.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from pathlib import Path

import yaml

from local_cluster import netns
from local_cluster.control_plane import ControlPlane, ControlPlaneStartError
from local_cluster.pki import write_kubeconfig
from local_cluster.processes import ManagedProcess

CLUSTER_DNS_MANIFEST = Path(__file__).with_name("cluster_dns.yaml")
KUBE_PROXY_HEALTHZ = f"{netns.NODE_ADDRESS}:10256"


def kube_proxy_config(
    kubeconfig: Path,
    node_name: str,
    cluster_cidr: str = netns.POD_CIDR,
    healthz: str = KUBE_PROXY_HEALTHZ,
) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "hostnameOverride": node_name,
        # Traffic to a ClusterIP from outside these pods (a node, the control plane's side) is
        # masqueraded, so its replies come back through the node that translated it.
        "clusterCIDR": cluster_cidr,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "conntrack": {"maxPerCore": 0},
        "nftables": {"minSyncPeriod": "100ms", "syncPeriod": "30s"},
        "healthzBindAddress": healthz,
        "metricsBindAddress": "127.0.0.1:10249",
    }


def start_kube_proxy(
    plane: ControlPlane,
    node_name: str,
    *,
    directory: Path | None = None,
    cluster_cidr: str = netns.POD_CIDR,
    healthz: str = KUBE_PROXY_HEALTHZ,
    prefix: tuple[str, ...] = (),
) -> ManagedProcess:
    """Start kube-proxy once the Node is registered (it reads the Node's address at startup).

    With several nodes, each node's runs in its namespace (``prefix``), its files in ``directory``.
    """
    workdir = directory or plane.settings.workdir
    binary = plane.settings.tools_dir / "kube-proxy"
    if not binary.is_file():
        raise ControlPlaneStartError(f"kube-proxy not found in {plane.settings.tools_dir}: run `make tools`")
    kubeconfig = write_kubeconfig(
        workdir / "kube-proxy.kubeconfig",
        server=plane.server,
        ca_cert=plane.pki.ca_cert,
        user="system:kube-proxy",
        client=plane.pki.kube_proxy,
    )
    config_path = workdir / "kube-proxy.yaml"
    settings = kube_proxy_config(kubeconfig, node_name, cluster_cidr, healthz)
    config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return ManagedProcess(
        "kube-proxy",
        [*prefix, str(binary), f"--config={config_path}", "--v=1"],
        log_path=workdir / "logs" / "kube-proxy.log",
    )


def apply_cluster_manifest(kubeconfig: Path, what: str, *, path: Path | None = None, text: str = "") -> None:
    """``kubectl apply --server-side`` of the cluster's own objects (a file, or ``text``): safe to
    repeat; a refusal raises ``ControlPlaneStartError`` naming ``what`` with kubectl's words."""
    result = subprocess.run(
        [
            "kubectl",
            f"--kubeconfig={kubeconfig}",
            "apply",
            "--server-side",
            "--field-manager=local-cluster",
            "-f",
            str(path) if path is not None else "-",
        ],
        input=text if path is None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise ControlPlaneStartError(f"installing {what} failed: {result.stderr.strip()}")


def install_cluster_dns(kubeconfig: Path) -> None:
    """Create CoreDNS and the kube-dns Service (server-side apply: safe to repeat)."""
    apply_cluster_manifest(kubeconfig, "cluster DNS", path=CLUSTER_DNS_MANIFEST)


class LoopbackForwarder:
    """Splice connections accepted on ``listener`` to ``target`` (opened in this process's namespace)."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]) -> None:
        self.listener = listener
        self.target = target
        self.stopping = threading.Event()
        self.sockets: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, name="loopback-forwarder", daemon=True)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> LoopbackForwarder:
        self.listener.settimeout(0.5)
        self.thread.start()
        return self

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                accepted, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                accepted.close()
                continue
            for sock in (accepted, upstream):
                sock.settimeout(None)
            with self.lock:
                self.sockets.update((accepted, upstream))
            for source, sink in ((accepted, upstream), (upstream, accepted)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            # The other direction may still be flowing; close both only once both are done.
            with self.lock:
                self.sockets.discard(source)
                done = sink not in self.sockets
            if done:
                source.close()
                sink.close()

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        with self.lock:
            open_sockets = list(self.sockets)
            self.sockets.clear()
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self.thread.join(timeout=2)


def wait_for_healthz(address: str, deadline: float, process: ManagedProcess) -> None:
    """Wait until kube-proxy answers its healthz (its first full sync is done)."""
    host, port = address.rsplit(":", 1)
    while time.monotonic() < deadline:
        if process.exited():
            raise ControlPlaneStartError(f"kube-proxy exited; log {process.log_path}:\n{process.log_tail()}")
        try:
            with socket.create_connection((host, int(port)), timeout=1) as sock:
                sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                if b" 200 " in sock.recv(256):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise ControlPlaneStartError(f"kube-proxy not healthy; log {process.log_path}:\n{process.log_tail()}")
