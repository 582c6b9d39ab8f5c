"""Start etcd, kube-apiserver and kube-controller-manager on loopback and wait until usable.

Built the way controller-runtime's envtest is: real binaries (from ``hack/tools``),
free loopback ports, a throwaway directory for data and certificates. Unlike envtest
it also runs the controller-manager (Deployments roll out, garbage collection works,
service-account tokens and ``kube-root-ca.crt`` are published) and enables RBAC with
service-account token signing, so the operator is tested under the permissions its
chart grants.

"Ready" means usable, not just listening: apiserver ``/readyz`` is ok AND the
controller-manager has created the ``default`` ServiceAccount and ``kube-root-ca.crt``
ConfigMap in ``default`` (pods are refused or cannot mount tokens before that).

What it does not do: no scheduler, kubelet, kube-proxy or DNS (the sealed cluster's node,
``kubelet_node``, starts those around it), no cloud controllers, no leader election
(one instance of each). It never reuses or cleans up directories it did not create.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local_cluster.pki import ClusterPki, create_cluster_pki, write_kubeconfig
from local_cluster.processes import ManagedProcess

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
# Controllers that need a cloud or a CNI we do not have.
DISABLED_CONTROLLERS = (
    "node-ipam-controller",
    "cloud-node-lifecycle-controller",
    "service-lb-controller",
    "node-route-controller",
    "persistentvolume-attach-detach-controller",
)


class ControlPlaneStartError(RuntimeError):
    """A component exited or did not become ready; the message carries its log tail."""


@dataclass(frozen=True)
class ControlPlaneSettings:
    tools_dir: Path
    workdir: Path
    ready_timeout_seconds: float = 90.0
    # Where the API server listens. Pod-network mode: the node's bridge address and 6443, so
    # pods reach it and the `kubernetes` Service's endpoints (filled by the API server's own
    # lease reconciler) name an address EndpointSlices accept. Loopback mode: 127.0.0.1, a free port.
    address: str = "127.0.0.1"
    apiserver_port: int | None = None
    # More addresses for the serving certificates (several nodes: the nodes' InternalIPs).
    certificate_addresses: tuple[str, ...] = ()

    @property
    def pod_network(self) -> bool:
        return self.address != "127.0.0.1"


@dataclass
class ControlPlane:
    """A running control plane; ``stop()`` tears it down in reverse start order."""

    settings: ControlPlaneSettings
    pki: ClusterPki
    apiserver_port: int
    admin_kubeconfig: Path
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def server(self) -> str:
        return f"https://{self.settings.address}:{self.apiserver_port}"

    @property
    def audit_log(self) -> Path:
        """What service accounts outside kube-system asked the API server (see AUDIT_POLICY); past
        100 MB the API server moves it aside (``audit_log_files`` finds every part)."""
        return self.settings.workdir / "logs" / "audit.log"

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


# The API calls of workloads' service accounts (the operator's, the validator's), metadata only:
# a test compares them with what RBAC grants. The controller-manager's own accounts
# (kube-system) and every other user are left out of the log.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    userGroups: ["system:serviceaccounts:kube-system"]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


def free_loopback_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (small race with other users; see callers)."""
    return free_loopback_ports(1)[0]


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1: all held open until every one is chosen, since a port
    closed at once can be handed out again by the next bind (it was, in a fresh network namespace:
    etcd's client and peer URLs got the same port and etcd failed with "address already in use")."""
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)
        ]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def _require_tool(tools_dir: Path, name: str) -> Path:
    path = tools_dir / name
    if not path.is_file():
        raise ControlPlaneStartError(f"{name} not found in tools dir {tools_dir}: run `make tools` first")
    return path


class ApiProbe:
    """Authenticated GETs against the apiserver with the admin client certificate."""

    def __init__(self, server: str, pki: ClusterPki) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=str(pki.ca_cert))
        self.context.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.server + path, context=self.context, timeout=2) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as error:
            return error.code
        except (urllib.error.URLError, OSError):
            return 0


def _etcd_healthy(client_url: str) -> bool:
    try:
        with urllib.request.urlopen(client_url + "/health", timeout=2) as reply:
            return bool(json.loads(reply.read()).get("health") == "true")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _wait_until(
    description: str, check: Callable[[], bool], processes: list[ManagedProcess], deadline: float
) -> None:
    while time.monotonic() < deadline:
        for process in processes:
            if process.exited():
                raise ControlPlaneStartError(
                    f"{process.name} exited with {process.popen.returncode} while waiting for {description}; "
                    f"log {process.log_path}:\n{process.log_tail()}"
                )
        if check():
            return
        time.sleep(0.1)
    tails = "\n".join(f"--- {p.name} ({p.log_path}):\n{p.log_tail(10)}" for p in processes)
    raise ControlPlaneStartError(f"timed out waiting for {description}\n{tails}")


def audit_log_files(audit_log: Path) -> list[Path]:
    """Every part of an audit log, oldest first: the API server rotates ``audit.log`` at 100 MB
    (its log writer's default size) into ``audit-<time>.log`` beside it, and a run with thousands of
    objects passes that in minutes."""
    rotated = sorted(audit_log.parent.glob(f"{audit_log.stem}-*{audit_log.suffix}"))
    return [*rotated, audit_log] if audit_log.exists() else rotated


def audit_events(audit_log: Path) -> Iterator[dict[str, Any]]:
    """Each event of an audit log (JSON lines), from every part of it in order (``audit_log_files``)."""
    for part in audit_log_files(audit_log):
        with part.open(encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)


def start_control_plane(settings: ControlPlaneSettings) -> ControlPlane:
    """Start etcd, apiserver, controller-manager; return once pods can be created and mount tokens.

    On any failure everything already started is stopped before the error propagates.
    """
    etcd_bin = _require_tool(settings.tools_dir, "etcd")
    apiserver_bin = _require_tool(settings.tools_dir, "kube-apiserver")
    cm_bin = _require_tool(settings.tools_dir, "kube-controller-manager")
    workdir = settings.workdir
    logs = workdir / "logs"
    pki = create_cluster_pki(workdir / "pki", settings.certificate_addresses)
    etcd_client, etcd_peer, free_port, cm_port = free_loopback_ports(4)
    apiserver_port = settings.apiserver_port or free_port
    server = f"https://{settings.address}:{apiserver_port}"
    admin_kubeconfig = write_kubeconfig(
        workdir / "admin.kubeconfig", server=server, ca_cert=pki.ca_cert, user="admin", client=pki.admin
    )
    cm_kubeconfig = write_kubeconfig(
        workdir / "controller-manager.kubeconfig",
        server=server,
        ca_cert=pki.ca_cert,
        user="system:kube-controller-manager",
        client=pki.controller_manager,
    )
    audit_policy = workdir / "audit-policy.yaml"
    audit_policy.write_text(AUDIT_POLICY, encoding="utf-8")
    plane = ControlPlane(
        settings=settings, pki=pki, apiserver_port=apiserver_port, admin_kubeconfig=admin_kubeconfig
    )
    deadline = time.monotonic() + settings.ready_timeout_seconds
    try:
        etcd_url = f"http://127.0.0.1:{etcd_client}"
        peer_url = f"http://127.0.0.1:{etcd_peer}"
        plane.processes.append(
            ManagedProcess(
                "etcd",
                [
                    str(etcd_bin),
                    "--name=local",
                    f"--data-dir={workdir / 'etcd'}",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=local={peer_url}",
                    # A test cluster's data is thrown away; fsync only costs time on a shared disk.
                    "--unsafe-no-fsync=true",
                    "--log-level=warn",
                ],
                log_path=logs / "etcd.log",
            )
        )
        _wait_until("etcd /health", lambda: _etcd_healthy(etcd_url), plane.processes, deadline)

        plane.processes.append(
            ManagedProcess(
                "kube-apiserver",
                [
                    str(apiserver_bin),
                    f"--etcd-servers={etcd_url}",
                    f"--bind-address={settings.address}",
                    f"--advertise-address={settings.address}",
                    f"--secure-port={apiserver_port}",
                    f"--tls-cert-file={pki.serving_cert}",
                    f"--tls-private-key-file={pki.serving_key}",
                    f"--client-ca-file={pki.ca_cert}",
                    # The kubelet's API (kubectl logs, exec, port-forward): verified against the
                    # cluster CA, reached at the Node's InternalIP and daemonEndpoints port.
                    f"--kubelet-client-certificate={pki.kubelet_client.cert}",
                    f"--kubelet-client-key={pki.kubelet_client.key}",
                    f"--kubelet-certificate-authority={pki.ca_cert}",
                    "--kubelet-preferred-address-types=InternalIP",
                    f"--service-account-issuer={server}",
                    f"--service-account-key-file={pki.service_account_public_key}",
                    f"--service-account-signing-key-file={pki.service_account_key}",
                    f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                    "--authorization-mode=RBAC",
                    "--allow-privileged=true",
                    # On loopback (the control plane alone, as test_control_plane_start starts
                    # it): endpoints for the `kubernetes` Service would name 127.0.0.1, which
                    # Endpoints validation refuses, and nothing routes ClusterIPs anyway.
                    *([] if settings.pod_network else ["--endpoint-reconciler-type=none"]),
                    f"--cert-dir={workdir / 'apiserver-certs'}",
                    f"--audit-policy-file={audit_policy}",
                    f"--audit-log-path={plane.audit_log}",
                    "--audit-log-format=json",
                    "--v=1",
                ],
                log_path=logs / "kube-apiserver.log",
            )
        )
        probe = ApiProbe(server, pki)
        _wait_until(
            "kube-apiserver /readyz", lambda: probe.status("/readyz") == 200, plane.processes, deadline
        )

        # Node lifecycle (the not-ready taint a new Node starts with is lifted by it) is on for
        # the kubelet's cluster; off on loopback, where no kubelet posts Leases.
        disabled = [*DISABLED_CONTROLLERS, *([] if settings.pod_network else ["node-lifecycle-controller"])]
        controllers = ",".join(["*", *(f"-{name}" for name in disabled)])
        plane.processes.append(
            ManagedProcess(
                "kube-controller-manager",
                [
                    str(cm_bin),
                    f"--kubeconfig={cm_kubeconfig}",
                    f"--authentication-kubeconfig={cm_kubeconfig}",
                    f"--authorization-kubeconfig={cm_kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={cm_port}",
                    f"--cert-dir={workdir / 'controller-manager-certs'}",
                    f"--service-account-private-key-file={pki.service_account_key}",
                    f"--root-ca-file={pki.ca_cert}",
                    "--use-service-account-credentials=true",
                    f"--controllers={controllers}",
                    "--leader-elect=false",
                    f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                    "--v=1",
                ],
                log_path=logs / "kube-controller-manager.log",
            )
        )
        _wait_until(
            "the controller-manager to publish the default ServiceAccount and kube-root-ca.crt",
            lambda: (
                probe.status("/api/v1/namespaces/default/serviceaccounts/default") == 200
                and probe.status("/api/v1/namespaces/default/configmaps/kube-root-ca.crt") == 200
            ),
            plane.processes,
            deadline,
        )
    except BaseException:
        plane.stop()
        raise
    return plane
