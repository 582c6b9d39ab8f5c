"""The sealed pod network: no route out, Services through kube-proxy, DNS through CoreDNS, clean teardown.

Every pod here has a network namespace of its own on the cluster's bridge (the CNI bridge plugin,
called by containerd's CRI for the kubelet); the cluster's
namespace was made by ``unshare`` and the machine's own is only read (``ip``, ``nft list``),
never changed. Traffic goes only between addresses inside the cluster's namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from local_cluster import netns
from local_cluster.cgroups import CgroupRoot
from local_cluster.cluster import REPO_ROOT, built_tools_dir
from local_cluster.cluster_state import read_state
from local_cluster.kubelet_node import cgroup_root_name
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import (
    PYTHON_IMAGE,
    SHELL_IMAGE,
    WEB_SERVER,
    HeldNamespaces,
    machine_network,
    wait_for,
)

# A client pod: resolve the Service by its short name (search path from resolv.conf) and
# fetch through it; print one JSON line and exit 0 only if both worked.
DNS_CLIENT = textwrap.dedent(
    """
    import json, socket, urllib.request
    address = socket.gethostbyname("web")
    full = socket.gethostbyname("web.{namespace}.svc.cluster.local")
    body = urllib.request.urlopen("http://web:8080/", timeout=10).read().decode()
    print(json.dumps({{"address": address, "full": full, "body": body}}), flush=True)
    """
)

IN_CLUSTER_CLIENT = textwrap.dedent(
    """
    import json, os
    from kubernetes import client, config
    config.load_incluster_config()  # the standard path and KUBERNETES_SERVICE_HOST, nothing else
    version = client.VersionApi().get_code()
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    print(json.dumps({"git": version.git_version, "host": os.environ["KUBERNETES_SERVICE_HOST"],
                      "token": os.path.getsize(token) > 0}), flush=True)
    """
)


def _python_pod(
    name: str,
    script: str,
    labels: dict[str, str] | None = None,
    restart: str = "Never",
    port: int | None = None,
) -> str:
    container: dict[str, object] = {
        "name": "main",
        "image": PYTHON_IMAGE,
        "command": ["python3", "-c", script],
    }
    if port is not None:
        container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {
                "restartPolicy": restart,
                "containers": [container],  # with the readiness probe, so endpoints wait for the server
            },
        }
    )


def _pod_output(cluster: SealedCluster, namespace: str, name: str) -> str:
    return cluster.kubectl("-n", namespace, "logs", name, check=False).stdout


def _phase(cluster: SealedCluster, namespace: str, name: str) -> str | None:
    pod = cluster.get_json(namespace, "pod", name)
    return pod["status"].get("phase") if pod else None


def _run_to_completion(cluster: SealedCluster, namespace: str, name: str, script: str) -> Any:
    """Run ``script`` in a pod; it must succeed; its last output line, decoded as JSON."""
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=_python_pod(name, script))
    phase = wait_for(
        f"pod {name} to finish",
        lambda: (p := _phase(cluster, namespace, name)) in ("Succeeded", "Failed") and p,
    )
    output = _pod_output(cluster, namespace, name)
    assert phase == "Succeeded", output
    return json.loads(output.strip().splitlines()[-1])


@pytest.fixture
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    name = f"net-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", name)
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _node_output(cluster: SealedCluster, *argv: str) -> str:
    result = subprocess.run(
        cluster.node_command(argv), capture_output=True, text=True, timeout=30, check=True
    )
    return result.stdout


def test_the_cluster_namespace_has_no_route_out(sealed_cluster: SealedCluster) -> None:
    routes = _node_output(sealed_cluster, "ip", "route", "show").splitlines()
    assert sorted(route.split()[0] for route in routes) == sorted([netns.POD_CIDR, netns.SERVICE_CIDR]), (
        routes
    )
    # The kernel's answer for addresses outside the cluster, asked without sending anything:
    # from the node itself and for a packet a pod would hand to the node to forward.
    for address in ("8.8.8.8", "192.168.1.1", "10.0.0.1", "172.17.0.1"):
        result = subprocess.run(
            sealed_cluster.node_command(["ip", "route", "get", address]),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode != 0 and "unreachable" in result.stderr.lower(), (address, result)
    # The cluster's namespace is not the machine's.
    assert Path("/proc/self/ns/net").resolve() != sealed_cluster.network_namespace.resolve()
    assert Path("/proc/self/ns/net").readlink() != sealed_cluster.network_namespace.readlink()


def test_a_service_name_resolves_through_coredns_and_routes_through_kube_proxy(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    for index in range(2):
        sealed_cluster.kubectl(
            "-n",
            namespace,
            "apply",
            "-f",
            "-",
            input=_python_pod(f"web-{index}", WEB_SERVER, {"app": "web"}, "Always", port=8080),
        )
    sealed_cluster.kubectl("-n", namespace, "create", "service", "clusterip", "web", "--tcp=8080:8080")
    sealed_cluster.kubectl("-n", namespace, "set", "selector", "service", "web", "app=web")
    service = sealed_cluster.get_json(namespace, "service", "web")
    cluster_ip = service["spec"]["clusterIP"]
    wait_for(
        "both web pods as endpoints of the Service",
        lambda: (
            len(
                [
                    endpoint
                    for item in (sealed_cluster.get_json(namespace, "endpointslices") or {}).get("items", [])
                    for endpoint in item.get("endpoints") or []
                    if (endpoint.get("conditions") or {}).get("ready")
                ]
            )
            == 2
        ),
    )
    answer = _run_to_completion(sealed_cluster, namespace, "client", DNS_CLIENT.format(namespace=namespace))
    assert answer["address"] == answer["full"] == cluster_ip
    assert answer["body"] in ("web-0", "web-1")

    # The node's own clients (a test, an operator outside the cluster) use ClusterIPs too.
    def fetch() -> str:
        with urllib.request.urlopen(f"http://{cluster_ip}:8080/", timeout=10) as reply:
            return reply.read().decode()

    seen = {sealed_cluster.call_in_network(fetch) for _ in range(20)}
    assert seen <= {"web-0", "web-1"} and seen, seen


def test_a_pod_uses_plain_in_cluster_config(sealed_cluster: SealedCluster, namespace: str) -> None:
    answer = _run_to_completion(sealed_cluster, namespace, "incluster", IN_CLUSTER_CLIENT)
    assert answer["host"] == netns.KUBERNETES_SERVICE_IP
    assert answer["token"] is True
    assert answer["git"].startswith("v1.")


def _cluster_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "local_cluster.cluster", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=REPO_ROOT,
    )


def test_cluster_up_shell_and_down_leave_nothing_behind(tmp_path: Path) -> None:
    """The user's commands (make cluster-up / shell / cluster-down) and a clean machine afterwards."""
    before = machine_network()
    workdir = tmp_path / "cluster"
    up = _cluster_cli("up", f"--workdir={workdir}", f"--tools-dir={built_tools_dir()}")
    state = read_state(workdir) if up.returncode == 0 else None
    try:
        assert up.returncode == 0 and state is not None, up.stderr
        kubeconfig = up.stdout.strip().removeprefix("export KUBECONFIG=")
        supervisor, inside = int(state["supervisor"]), int(state["namespacePid"])
        held = HeldNamespaces([Path(f"/proc/{inside}/ns/net")])
        cgroups = CgroupRoot(cgroup_root_name(workdir.resolve()))
        assert cgroups.directories(), "the node's cgroup root is missing"
        during = machine_network()

        def kubectl(*args: str, input: str | None = None) -> str:
            return subprocess.run(
                ["kubectl", f"--kubeconfig={kubeconfig}", *args],
                input=input, capture_output=True, text=True, timeout=60, check=True,
            ).stdout  # fmt: skip

        # From the machine's shell, through the loopback port: a real API server.
        assert "local-node" in kubectl("get", "nodes")
        kubectl(
            "apply", "-f", "-", input=_python_pod("sleeper", "import time; time.sleep(600)", restart="Always")
        )
        wait_for(
            "the sleeper pod running",
            lambda: kubectl("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}") == "Running",
        )
        # Inside, through `shell`: the pod's own namespace (containerd's CNI names it) and the
        # in-cluster kubeconfig.
        netns_list = _cluster_cli("shell", f"--workdir={workdir}", "--", "ip", "netns", "list")
        assert netns_list.returncode == 0 and "cni-" in netns_list.stdout, netns_list
        nodes = _cluster_cli("shell", f"--workdir={workdir}", "--", "kubectl", "get", "nodes", "-o", "name")
        assert nodes.stdout.strip() == "node/local-node", nodes
    finally:
        down = _cluster_cli("down", f"--workdir={workdir}")
    assert down.returncode == 0, down.stderr
    assert during == before, "starting the cluster changed the machine's network namespace"
    assert machine_network() == before
    try:
        holders = held.holders()
    finally:
        held.close()
    assert holders == {}, f"processes still in the cluster's network namespace: {holders}"
    assert not [pid for pid in (supervisor, inside) if Path(f"/proc/{pid}").exists()]
    assert str(workdir) not in Path("/proc/self/mountinfo").read_text()
    assert not cgroups.directories(), "the node's cgroups were left"


# The mount path is put together at run time, so no rewriting of command or env could find it:
# only a volume really mounted at /var/lib/demo/data makes this work.
HARD_CODED_WRITER = """
set -e
base=/var/lib/demo; dir=$base/data
echo written-by-writer > $dir/file
cat $dir/file
if (echo nope > /demo-ro/refused) 2>/dev/null; then echo read-only-mount-was-writable; exit 1; fi
echo read-only-refused
test "$(cat /demo-ro/file)" = written-by-writer
"""


def _demo_pod(name: str, script: str, mounts: list[dict[str, object]], working_dir: str = "") -> str:
    container: dict[str, object] = {
        "name": "main",
        "image": SHELL_IMAGE,
        "command": ["sh", "-c", script],
        "volumeMounts": mounts,
    }
    if working_dir:
        container["workingDir"] = working_dir
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "containers": [container],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "demo-data"}}],
            },
        }
    )


def _finished(cluster: SealedCluster, namespace: str, name: str) -> str:
    phase = wait_for(
        f"pod {name} to finish",
        lambda: (p := _phase(cluster, namespace, name)) in ("Succeeded", "Failed") and p,
    )
    output = _pod_output(cluster, namespace, name)
    assert phase == "Succeeded", output
    return output


def test_volumes_are_mounted_at_their_mount_path_and_nothing_lands_on_the_machine(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    made_up = [Path("/var/lib/demo"), Path("/demo-ro"), Path("/demo")]
    assert not [path for path in made_up if path.exists()], "left over from an earlier run"
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "demo-data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
    }
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(claim))
    writer = _demo_pod(
        "writer",
        HARD_CODED_WRITER,
        [
            {"name": "data", "mountPath": "/var/lib/demo/data"},  # /var/lib exists: a tmpfs shadow of it
            {"name": "data", "mountPath": "/demo-ro", "readOnly": True},  # at the root: a new root
        ],
    )
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=writer)
    output = _finished(sealed_cluster, namespace, "writer")
    assert "written-by-writer" in output and "read-only-refused" in output, output

    # A second pod finds the file in the claim, with a relative path from its workingDir.
    reader = _demo_pod("reader", "cat file", [{"name": "data", "mountPath": "/demo/data"}], "/demo/data")
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=reader)
    assert "written-by-writer" in _finished(sealed_cluster, namespace, "reader")

    # The write went to the claim's volume, a directory of the cluster ...
    volume_name = sealed_cluster.get_json(namespace, "pvc", "demo-data")["spec"]["volumeName"]
    host_path = Path(sealed_cluster.get_json("default", "pv", volume_name)["spec"]["hostPath"]["path"])
    assert (host_path / "file").read_text() == "written-by-writer\n"
    assert not (host_path / "refused").exists()
    # ... and no mount point was made on the machine, nor in the cluster's own namespace.
    assert not [path for path in made_up if path.exists()]
    seen = _node_output(sealed_cluster, "sh", "-c", "ls -d /var/lib/demo /demo-ro /demo 2>/dev/null; true")
    assert seen.strip() == ""
