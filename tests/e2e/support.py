"""Helpers every e2e module uses: bounded polling, `kubectl get -o json`, free ports, our own processes.

Waits here are failure limits (how long before a test gives up), never
performance assertions.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from local_cluster.cluster import REPO_ROOT, ClusterAccess, LocalClusterSettings, built_tools_dir
from local_cluster.control_plane import ControlPlane, ControlPlaneSettings, start_control_plane
from local_cluster.relay import Feeder, Relay, deploy_relay
from local_cluster.sealed_cluster import SealedCluster

# Images for test pods, from `make images` (the sealed cluster's kubelet runs them): Python with
# the kubernetes client, and Debian's sh and coreutils.
PYTHON_IMAGE = "localhost/broker-failover/operator:0.1.0"
SHELL_IMAGE = "localhost/broker-failover/broker:0.1.0"

WAIT_SECONDS = 60.0
CRD_FILE = REPO_ROOT / "crds" / "broker.failover.dev_brokerclusters.yaml"
CRD_NAME = "brokerclusters.broker.failover.dev"


# A tiny web server that answers with its pod's name: which pod a Service picked is visible.
WEB_SERVER = textwrap.dedent(
    """
    import http.server, os
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = os.environ["HOSTNAME"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Hello).serve_forever()
    """
)


def machine_network() -> dict[str, str]:
    """What the machine's own namespace looks like: compared before, during and after a cluster."""

    def read(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout

    return {
        "links": read("ip", "-o", "link", "show"),
        "addresses": read("ip", "-o", "addr", "show"),
        "routes": read("ip", "route", "show", "table", "all"),
        "nftables": read("nft", "list", "ruleset"),
    }


class HeldNamespaces:
    """Network namespaces kept open by file descriptors, to ask afterwards which processes are in them.

    A namespace is known by its nsfs inode, and the kernel gives a freed inode to the next new
    namespace at once: compared by inode alone after a cluster stopped, a pod's namespace in the
    other stream's cluster was taken for ours (CI, 2026-11-27). While a descriptor holds it, the
    namespace and so its inode stay ours; :meth:`close` lets it go.
    """

    def __init__(self, paths: Iterable[Path]) -> None:
        self._fds = [os.open(path, os.O_RDONLY) for path in paths]
        self._inodes = {os.fstat(fd).st_ino for fd in self._fds}

    def holders(self) -> dict[int, str]:
        """Processes in any of the namespaces, with their command lines."""
        found: dict[int, str] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.stat(entry / "ns" / "net").st_ino in self._inodes:
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:  # gone meanwhile, or not ours to look into
                continue
        return found

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def wait_for(
    description: str, probe: Callable[[], Any], timeout: float = WAIT_SECONDS, interval: float = 0.25
) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``description`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {description}; last observation: {last!r}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (pods share this host's network in the harness)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def delete_crd_releasing_finalizers(cluster: ClusterAccess, crd_file: str) -> None:
    """Delete the CRD after the operator has stopped, first dropping finalizers nothing will remove now.

    A BrokerCluster left with the operator's finalizer would hold the CRD in Terminating for ever,
    and the next module that applies the CRD would wait on it.
    """
    listing = cluster.kubectl("get", "brokerclusters", "--all-namespaces", "-o", "json", check=False)
    items = json.loads(listing.stdout)["items"] if listing.returncode == 0 else []
    for item in items:
        if item["metadata"].get("finalizers"):
            cluster.kubectl(
                "-n", item["metadata"]["namespace"], "patch", "brokercluster", item["metadata"]["name"],
                "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip
    cluster.kubectl("delete", "-f", crd_file, "--wait=false", check=False)


@contextlib.contextmanager
def installed_crd(cluster: ClusterAccess, crd_file: Path = CRD_FILE) -> Iterator[None]:
    """The CRD for one test module: applied once an earlier module's deletion of it has finished
    (an apply during deletion would be lost with it), deleted again at the end."""

    def not_being_deleted() -> bool:
        crd = cluster.get_json("default", "crd", CRD_NAME) or {}
        return not crd.get("metadata", {}).get("deletionTimestamp")

    wait_for("an earlier module's CRD deletion to finish", not_being_deleted, timeout=120)
    cluster.kubectl("apply", "-f", str(crd_file))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    try:
        yield
    finally:
        delete_crd_releasing_finalizers(cluster, str(crd_file))


class LocalProcess:
    """A process of ours (operator, simulator) in its own group, logging to a file, killed as a group."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def kill(self) -> None:
        """kill -9 of the whole process group: no cleanup, as in a node crash."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)

    def tail(self) -> str:
        """The log's last lines, without kopf's per-run "succeeded" notes of periodic handlers."""
        if not self.log.exists():
            return ""
        lines = [
            line for line in self.log.read_text(errors="replace").splitlines() if "succeeded." not in line
        ]
        return "\n".join(lines[-150:])


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


LIVE_RELAYS: list[Relay] = []
"""The relays of the running test, for ``conftest.pytest_runtest_makereport`` to describe when it
fails: their namespaces, and the operators' logs with them, are gone by the end of the run."""


@contextlib.contextmanager
def relay_in_new_namespace(cluster: SealedCluster, prefix: str, **deploy: Any) -> Iterator[Relay]:
    """``deploy_relay`` (``deploy``: its keyword arguments) in a namespace of its own, uninstalled and
    the namespace deleted after."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    relay = deploy_relay(cluster, namespace, **deploy)
    LIVE_RELAYS.append(relay)
    try:
        yield relay
    finally:
        LIVE_RELAYS.remove(relay)
        relay.uninstall()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


class PlaneAccess(ClusterAccess):
    """kubectl and API clients as the admin of a control plane alone (``control_plane_only``)."""

    def __init__(self, settings: LocalClusterSettings, plane: ControlPlane) -> None:
        self.settings = settings
        self.plane = plane

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig


@contextlib.contextmanager
def control_plane_only(workdir: Path, crds: Iterable[str] = ()) -> Iterator[PlaneAccess]:
    """etcd, kube-apiserver and kube-controller-manager on loopback, no node (nothing runs pods),
    with the repository's ``crds/`` files named in ``crds`` applied and Established; stopped after."""
    tools = built_tools_dir()
    plane = start_control_plane(ControlPlaneSettings(tools_dir=tools, workdir=workdir / "plane"))
    try:
        access = PlaneAccess(LocalClusterSettings(tools_dir=tools, workdir=workdir), plane)
        crds = list(crds)
        for crd in crds:
            access.kubectl("apply", "-f", str(REPO_ROOT / "crds" / crd))
        if crds:
            access.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield access
    finally:
        plane.stop()


def backend_failures(relay: Relay) -> dict[str, Any]:
    """The backend simulator's counts of requests that failed (a fault, a timeout retried, a backoff)."""
    status = relay.backend("/sim/status")
    return {key: status[key] for key in ("faults", "timeoutRetries", "backoffs")}


@contextlib.contextmanager
def traffic_undisturbed(relay: Relay, what: str) -> Iterator[None]:
    """Relay traffic (the backend sending, a :class:`Feeder` adding 200 msg/s) while the block runs
    ``what``; after it, once everything is confirmed: nothing lost, taken twice or reordered, no
    request failed, no failover, no new epoch, the cluster Healthy. A block that raises is not
    checked (its own error says more)."""
    relay.backend("/sim/start", {})
    feeder = Feeder(relay).start()
    try:
        wait_for("traffic confirmed", lambda: int(relay.backend("/sim/status")["confirmed"]) > 0, timeout=120)
        status = relay.status()
        before = (status["active"], status["epoch"], status.get("failovers", 0))
        failures = backend_failures(relay)
        yield
        moving = int(relay.backend("/sim/status")["confirmed"])
        wait_for("traffic still moving", lambda: int(relay.backend("/sim/status")["confirmed"]) > moving, 60)
    finally:
        feeder.stop.set()
    relay.wait_all_confirmed()
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
    assert backend_failures(relay) == failures, f"a request failed during {what}"
    status = relay.status()
    assert (status["active"], status["epoch"], status.get("failovers", 0)) == before, (what, status)
    assert status.get("phase") == "Healthy", (what, status)
