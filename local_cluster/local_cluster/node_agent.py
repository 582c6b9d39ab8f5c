"""The node agent: the one fake part of the local cluster, playing scheduler and kubelet for one Node.

Everything else in the local cluster is the real Kubernetes control plane. This
agent registers a Node, binds every unscheduled pod (default scheduler) to it through
the real ``pods/binding`` API, and runs the pods bound to it as local process groups
(``pod_runtime``) with files and env prepared as a kubelet would (``pod_sandbox``).
It reports status through ``pods/status`` (Running, Ready, Terminated with exit code,
restart count; ``pod_status_reporter``), honours ``restartPolicy``, and on deletion kills
each process group within the grace period before completing the delete, as the kubelet
does. This module is the reconcile loop; the Node object is ``node_registration``, the pod
list and watch ``pod_watch``, the settings ``node_settings``.

Why a Python process watching pods, not a real kubelet: there is no container engine,
no cgroups and no CNI here; what the operator's tests need from a node is that pods
run, get an address, report status and die on request.

What is fake, plainly: no images (``images.yaml`` maps image names to local commands), no
isolation (every container runs as this user on this host), node selectors, taints, affinity
and resources are ignored (one node, everything fits), and the kubelet API serves container
logs and port-forward (``kubelet_api``: ``kubectl logs`` and ``port-forward`` work, ``exec`` fails; logs are
files under ``<state-dir>/pods/<namespace>_<name>_<uid>/logs``). In loopback mode, also:
volume mount paths are rewritten into env values and args, each pod gets its own 127.x.y.z
loopback address but no network namespace (a process can still bind any address), and
there is no kube-proxy or DNS (ClusterIPs and service names do not resolve). Pod-network
mode (``--pod-network``, ``netns``) gives each pod a network namespace on the cluster's
bridge and its volumes at their mount paths; the cluster adds kube-proxy and CoreDNS.

Volumes: a thread of this process is the node's dynamic provisioner (``provisioner``: the default
StorageClass ``standard``, a hostPath PV per claim, deleted with its claim under ``Delete``); the
real PV controller binds claims, and a pod's claim resolves to its bound PV's directory (a pod
whose claim is missing or unbound waits in ContainerCreating).

Run: ``python -m local_cluster.node_agent --kubeconfig K --state-dir D [--pod-subnet 127.0.0]``.
"""

from __future__ import annotations

import argparse
import logging
import queue
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from local_cluster import netns
from local_cluster.container_logs import PodLogFinder
from local_cluster.images import DEFAULT_IMAGES_FILE, ImageTable
from local_cluster.kubelet_api import KubeletApi, start_kubelet_api
from local_cluster.node_registration import register_node
from local_cluster.node_settings import NodeAgentSettings, apiserver_address
from local_cluster.pod_launcher import PodNetwork
from local_cluster.pod_references import Body
from local_cluster.pod_runtime import PodRuntime, PodRuntimeContext, minimal_base_env
from local_cluster.pod_sandbox import PodSandbox
from local_cluster.pod_status_reporter import PodStatusReporter
from local_cluster.pod_watch import watch_pods
from local_cluster.port_forward import PodEndpointFinder
from local_cluster.provisioner import LocalPathProvisioner

log = logging.getLogger("node-agent")
DEFAULT_SCHEDULER = "default-scheduler"


class NodeAgent:
    def __init__(self, settings: NodeAgentSettings) -> None:
        self.settings = settings
        self.api_client = config.new_client_from_config(config_file=str(settings.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.apiserver = apiserver_address(settings.kubeconfig)
        # Loopback mode: 127.x.y.2-254 (.1 stands for the node); pod-network mode: the bridge's /24.
        self.addresses = (
            netns.PodAddressPool()
            if settings.pod_network
            else netns.PodAddressPool(f"{settings.pod_subnet}.0/24", node_address=f"{settings.pod_subnet}.1")
        )
        self.context = PodRuntimeContext(
            images=ImageTable.load(settings.images_file),
            base_env=minimal_base_env(),
            pgid_dir=settings.pgid_dir,
            probe_pool=ThreadPoolExecutor(max_workers=8, thread_name_prefix="probe"),
            volume_pool=ThreadPoolExecutor(max_workers=2, thread_name_prefix="volumes"),
            volume_resync_seconds=settings.volume_resync_seconds,
        )
        self.pods: dict[str, PodRuntime] = {}
        self.finished: set[str] = set()  # uids whose processes are done; the object may linger (finalizers)
        self.status_reporter = PodStatusReporter(self.core)
        self.events: queue.Queue[tuple[str, Body]] = queue.Queue()
        self.stopping = threading.Event()
        self.kubelet_api: KubeletApi | None = None
        # The node's volume provisioner (provisioner.py): claims bind to directories on this node.
        self.provisioner: LocalPathProvisioner | None = None

    # ---- registration and scheduling ----------------------------------------------

    def register_node(self) -> None:
        register_node(
            self.core, self.settings, self.kubelet_api.port if self.kubelet_api is not None else None
        )

    def bind(self, pod: Body) -> None:
        metadata = pod["metadata"]
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=metadata["name"], uid=metadata["uid"]),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.settings.node_name),
        )
        try:
            self.core.create_namespaced_pod_binding(
                metadata["name"], metadata["namespace"], binding, _preload_content=False
            )
        except ApiException as error:
            # 409: already bound (our own earlier attempt); 404: deleted meanwhile.
            if error.status not in (404, 409):
                log.warning("binding %s/%s failed: %s", metadata["namespace"], metadata["name"], error.reason)

    def start_kubelet_api(self) -> None:
        """Serve container logs and port-forward on the node's InternalIP, for CA-signed clients."""
        pki_dir = self.apiserver.ca_cert.parent
        self.kubelet_api = start_kubelet_api(
            host=self.settings.host_ip,
            port=self.settings.kubelet_port,
            cert=self.settings.kubelet_cert or pki_dir / "kubelet.crt",
            key=self.settings.kubelet_key or pki_dir / "kubelet.key",
            client_ca=self.apiserver.ca_cert,
            lookup=PodLogFinder(self.pods.values, self.settings.state_dir / "pods"),
            endpoints=PodEndpointFinder(self.pods.values),
        )

    # ---- reconciliation --------------------------------------------------------------

    def _pod_dir(self, pod: Body) -> Path:
        metadata = pod["metadata"]
        return (
            self.settings.state_dir / "pods" / f"{metadata['namespace']}_{metadata['name']}_{metadata['uid']}"
        )

    def observe(self, pod: Body) -> None:
        """Act on the latest version of one pod."""
        metadata, spec = pod["metadata"], pod["spec"]
        uid = metadata["uid"]
        if not spec.get("nodeName"):
            if (spec.get("schedulerName") or DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER and not metadata.get(
                "deletionTimestamp"
            ):
                self.bind(pod)
            return
        if spec["nodeName"] != self.settings.node_name or uid in self.finished:
            return
        runtime = self.pods.get(uid)
        if runtime is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") and not metadata.get(
                "deletionTimestamp"
            ):
                return  # finished before this agent started; nothing to run
            # hostNetwork pods share the node's address, as on a real node.
            ip = self.settings.host_ip if spec.get("hostNetwork") else self.addresses.allocate(uid)
            network = None
            if self.settings.pod_network and not spec.get("hostNetwork"):
                try:
                    namespace_path = netns.add_pod_interface(uid, ip)
                except netns.PodNetworkError as error:
                    log.error(
                        "%s/%s: %s; retried on its next event", metadata["namespace"], metadata["name"], error
                    )
                    self.addresses.release(uid)
                    return
                network = PodNetwork(
                    namespace_path=namespace_path,
                    dns_server=netns.CLUSTER_DNS_IP,
                    cluster_domain=netns.CLUSTER_DOMAIN,
                    kubernetes_service=(netns.KUBERNETES_SERVICE_IP, 443),
                )
            sandbox = PodSandbox(
                pod,
                pod_dir=self._pod_dir(pod),
                claims_dir=self.settings.state_dir / "claims",
                core=self.core,
                apiserver=self.apiserver,
                pod_ip=ip,
                host_ip=self.settings.host_ip,
                network=network,
            )
            runtime = self.pods[uid] = PodRuntime(pod, sandbox, self.context)
            log.info("running pod %s/%s (uid %s) at %s", metadata["namespace"], metadata["name"], uid, ip)
        runtime.pod = pod
        if metadata.get("deletionTimestamp"):
            grace = float(metadata.get("deletionGracePeriodSeconds") or 0)
            runtime.begin_termination(grace, time.monotonic())

    def forget(self, pod: Body) -> None:
        """The object is gone (force delete or our final delete): no process may survive it."""
        uid = pod["metadata"]["uid"]
        runtime = self.pods.pop(uid, None)
        if runtime is not None:
            runtime.kill_now()
            runtime.sandbox.remove()
        self._release_address(uid)
        self.status_reporter.forget(uid)
        self.finished.discard(uid)

    def _release_address(self, uid: str) -> None:
        if self.settings.pod_network:
            netns.remove_pod_interface(uid)
        self.addresses.release(uid)

    def _complete_deletion(self, runtime: PodRuntime) -> None:
        metadata = runtime.pod["metadata"]
        self.finished.add(runtime.uid)
        self.pods.pop(runtime.uid, None)
        runtime.sandbox.remove()
        self._release_address(runtime.uid)
        log.info("pod %s/%s stopped; completing its deletion", metadata["namespace"], metadata["name"])
        self.status_reporter.delete_stopped(runtime)

    def _drain_events(self) -> None:
        deadline = time.monotonic() + self.settings.loop_interval_seconds
        while True:
            try:
                kind, body = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if kind == "SYNC":
                present = {item["metadata"]["uid"] for item in body.get("items") or []}
                for uid in [uid for uid in self.pods if uid not in present]:
                    self.forget(self.pods[uid].pod)
                for item in body.get("items") or []:
                    self.observe(item)
            elif kind == "DELETED":
                self.forget(body)
            else:
                self.observe(body)

    def run(self) -> None:
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.start_kubelet_api()
        self.register_node()
        watcher = threading.Thread(
            target=watch_pods,
            args=(self.settings.kubeconfig, self.events, self.stopping),
            name="pod-watch",
            daemon=True,
        )
        watcher.start()
        self.provisioner = LocalPathProvisioner(
            self.settings.kubeconfig, self.settings.state_dir, self.settings.node_name, self.stopping
        )
        self.provisioner.start()
        subnet = netns.POD_CIDR if self.settings.pod_network else f"{self.settings.pod_subnet}.0/24"
        log.info("node %s ready; pods on %s", self.settings.node_name, subnet)
        while not self.stopping.is_set():
            self._drain_events()
            now = time.monotonic()
            for runtime in list(self.pods.values()):
                try:
                    if runtime.terminating_deadline is not None:
                        if runtime.finished_terminating(now):
                            self._complete_deletion(runtime)
                        continue
                    runtime.step(now)
                    self.status_reporter.report(runtime)
                except Exception:
                    # One pod's surprise must not take the node (and every other pod) down.
                    log.exception("node agent error on pod %s", runtime.uid)
        self.shutdown()

    def shutdown(self) -> None:
        """Stop every pod's processes: SIGTERM, a short grace, then SIGKILL. No API writes."""
        if self.kubelet_api is not None:
            self.kubelet_api.stop()  # ends every `kubectl logs -f` too
        now = time.monotonic()
        for runtime in self.pods.values():
            runtime.begin_termination(2.0, now)
        deadline = now + 2.0
        while time.monotonic() < deadline and any(r.alive_pgids() for r in self.pods.values()):
            for runtime in self.pods.values():
                runtime.step(time.monotonic())
            time.sleep(0.05)
        for runtime in self.pods.values():
            runtime.kill_now()
            if self.settings.pod_network:
                netns.remove_pod_interface(runtime.uid)
        self.context.probe_pool.shutdown(wait=False, cancel_futures=True)
        self.context.volume_pool.shutdown(wait=False, cancel_futures=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--node-name", default="local-node")
    parser.add_argument("--pod-subnet", default="127.0.0", help="first three octets of pod IPs")
    parser.add_argument("--images", type=Path, default=DEFAULT_IMAGES_FILE)
    parser.add_argument("--kubelet-port", type=int, default=0, help="kubelet API port (0: a free one)")
    parser.add_argument(
        "--pod-network", action="store_true", help="a network namespace per pod (inside the sealed cluster)"
    )
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = NodeAgent(
        NodeAgentSettings(
            kubeconfig=options.kubeconfig,
            state_dir=options.state_dir,
            node_name=options.node_name,
            pod_subnet=options.pod_subnet,
            images_file=options.images,
            kubelet_port=options.kubelet_port,
            pod_network=options.pod_network,
        )
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()


if __name__ == "__main__":
    main()
