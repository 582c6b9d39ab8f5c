"""The sealed cluster's supervisor: PID 1 of the cluster's network, mount and PID namespaces.

``sealed_cluster.start_sealed_cluster`` starts it under ``unshare``
(``containerd_sandbox.SEALED_COMMAND``) with a listening loopback socket inherited. Here it turns
the empty network into the node's (bridge, routes, sysctls), starts the node (``kubelet_node``:
containerd, the images, the control plane on the bridge address, kube-scheduler, the kubelet,
kube-proxy, CoreDNS and kind's local-path-provisioner), or several (``cluster_nodes``), and splices
connections from the inherited socket to the API server. It writes the state file
(``cluster_state``) that the caller's ``SealedCluster`` reads, restarts kube-apiserver when it exits
(``restarts``), boots a crashed node again when a request file asks, and stops everything on
SIGTERM. When it exits, the kernel kills every process left in its namespace.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from local_cluster import netns
from local_cluster.cluster import LocalClusterSettings
from local_cluster.cluster_nodes import ClusterNodes, start_cluster_nodes
from local_cluster.cluster_services import LoopbackForwarder
from local_cluster.cluster_state import RESTART_NODE_FAILED, RESTART_NODE_REQUEST, STATE_FILE
from local_cluster.kubelet_node import KubeletNode, start_kubelet_node
from local_cluster.pki import ClientCertificate, write_kubeconfig
from local_cluster.processes import ManagedProcess, reap_on_exit
from local_cluster.restarts import ProcessKeeper, keep_apiserver

HOST_KUBECONFIG = "admin.kubeconfig.host"


def serve(settings: LocalClusterSettings, listener: socket.socket) -> int:
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop_requested.set())
    node: KubeletNode | ClusterNodes
    if settings.nodes == 1:
        netns.set_up_node_network()
        node = start_kubelet_node(
            settings.tools_dir,
            settings.workdir,
            settings.node_name,
            settings.ready_timeout_seconds,
            settings.background_images,
        )
    else:
        networks = netns.node_networks(settings.nodes)
        netns.set_up_cluster_network(networks)
        node = start_cluster_nodes(
            settings.tools_dir,
            settings.workdir,
            networks,
            settings.ready_timeout_seconds,
            settings.background_images,
        )
    plane = node.control_plane
    forwarder = LoopbackForwarder(listener, (plane.settings.address, plane.apiserver_port))
    keeper: ProcessKeeper | None = None
    try:
        forwarder.start()
        pki = node.control_plane.pki
        host_kubeconfig = write_kubeconfig(
            settings.workdir / HOST_KUBECONFIG,
            server=f"https://127.0.0.1:{forwarder.port}",
            ca_cert=pki.ca_cert,
            user="admin",
            client=ClientCertificate(cert=pki.admin.cert, key=pki.admin.key),
        )
        restarts = 0

        def write_state(apiserver: ManagedProcess) -> None:
            # Pids here are the cluster's PID namespace's; the machine's are in PIDS_FILE.
            managers = [p.pid for p in node.control_plane.processes if p.name == "kube-controller-manager"]
            state = {
                "apiserver": apiserver.pid,
                "controllerManager": managers[0] if managers else None,
                "apiserverRestarts": restarts,
                "kubeconfig": str(host_kubeconfig),
                "nodeKubeconfig": str(node.kubeconfig),
                "readySeconds": round(node.ready_seconds, 1),
                "podNetwork": netns.POD_CIDR if settings.nodes == 1 else netns.CLUSTER_POD_CIDR,
                "containerdSocket": str(node.containerd_socket),
                "podLogs": str(node.pod_logs),
                "nodes": node.describe_nodes(),
            }
            staged = settings.workdir / f"{STATE_FILE}.tmp"
            staged.write_text(json.dumps(state))
            staged.replace(settings.workdir / STATE_FILE)  # readers never see half a state file

        def restarted(apiserver: ManagedProcess) -> None:
            nonlocal restarts
            restarts += 1
            write_state(apiserver)

        keeper = keep_apiserver(node.control_plane, restarted)
        write_state(keeper.process)
        print(f"local cluster ready in {node.ready_seconds:.1f}s", file=sys.stderr, flush=True)
        keeper.start()
        while not stop_requested.wait(0.5):
            if isinstance(node, ClusterNodes) and _restart_requested_nodes(settings.workdir, node):
                write_state(keeper.process)  # the restarted node's new pids
            if exited := node.exited():
                print(f"{exited} exited; see {settings.workdir / 'logs'}", file=sys.stderr, flush=True)
                break
            if keeper.failure is not None:
                print("giving up on kube-apiserver; stopping the cluster", file=sys.stderr, flush=True)
                break
    finally:
        if keeper is not None:
            keeper.stop()  # before the control plane stops, or it would restart the API server
        forwarder.stop()
        node.stop()
        (settings.workdir / STATE_FILE).unlink(missing_ok=True)
    return 0


def _restart_requested_nodes(workdir: Path, nodes: ClusterNodes) -> bool:
    """Boot again each node a ``SealedCluster.restart_node`` asked for (a request file each);
    whether any was."""
    requests = sorted(workdir.glob(f"{RESTART_NODE_REQUEST}*"))
    for request in requests:
        name = request.name.removeprefix(RESTART_NODE_REQUEST)
        try:
            nodes.restart_node(name, Path(str(request.read_text()).strip()))
            print(f"restarted node {name}", file=sys.stderr, flush=True)
        except Exception as error:  # reported to the requester through the file it waits on
            (workdir / f"{RESTART_NODE_FAILED}{name}").write_text(f"{type(error).__name__}: {error}")
        request.unlink()
    return bool(requests)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Supervisor of the sealed local cluster (see module doc)")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--tools-dir", type=Path, required=True)
    parser.add_argument("--node-name", default="local-node")
    parser.add_argument("--nodes", type=int, default=1, help="1: the single node; more: node-1 ... node-N")
    parser.add_argument("--ready-timeout", type=float, default=90.0, help="seconds; a failure limit")
    parser.add_argument("--api-listen-fd", type=int, required=True)
    parser.add_argument("--background-images", default="", help="comma-separated image names")
    options = parser.parse_args(argv)
    # `kill -USR1` of a supervisor that seems stuck writes every thread's stack to its log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    reap_on_exit()
    listener = socket.socket(fileno=options.api_listen_fd)
    settings = LocalClusterSettings(
        tools_dir=options.tools_dir,
        workdir=options.workdir,
        node_name=options.node_name,
        nodes=options.nodes,
        ready_timeout_seconds=options.ready_timeout,
        background_images=tuple(name for name in options.background_images.split(",") if name),
    )
    return serve(settings, listener)


if __name__ == "__main__":
    sys.exit(main())
