"""Three real nodes in one sealed cluster (issue 22's foundation): ``--nodes 3``.

One test, kept short (it runs in ``make test``): a cluster of three nodes starts, each a kubelet with
its own containerd, cgroup, address and pod CIDR in a network namespace of its own; a pod of the
broker image is pinned to each node; every node reaches every pod (across nodes, as kindnet's
routes carry it) and a ClusterIP Service in front of them (through its own kube-proxy), and so does
each pod; no node namespace has a route out; a default-class claim's volume is made on the node of
its pod and tied to it, a ``shared-path`` claim's is written from two nodes; and stopping the
cluster leaves no process, mount, cgroup or change to the machine's network behind.

Traffic goes only between addresses inside the cluster's namespaces; the machine's own network
namespace is only read (``ip``, ``nft list``), never changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import urllib.request
from pathlib import Path

import pytest

from local_cluster import netns
from local_cluster.cgroups import CgroupRoot
from local_cluster.cluster import LocalClusterSettings, built_tools_dir
from local_cluster.kubelet_node import cgroup_root_name
from local_cluster.local_path_storage import SHARED_CLASS, volume_path
from local_cluster.processes import reap_on_exit
from local_cluster.sealed_cluster import SealedCluster, start_sealed_cluster
from tests.e2e.support import SHELL_IMAGE, WEB_SERVER, HeldNamespaces, machine_network, wait_for

pytestmark = pytest.mark.three_nodes

NAMESPACE = "spread"
# Run in each pod (kubectl exec): fetch every URL given, print {url: body}.
FETCH_ALL = textwrap.dedent(
    """
    import json, sys, urllib.request
    print(json.dumps({u: urllib.request.urlopen(u, timeout=10).read().decode() for u in sys.argv[1:]}))
    """
)


def _web_pod(name: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": SHELL_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", WEB_SERVER],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    "securityContext": {
                        "runAsNonRoot": True,
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


def _ready_nodes(cluster: SealedCluster) -> list[str]:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return sorted(
        node["metadata"]["name"]
        for node in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    )


def _inode(namespace: Path) -> int:
    """A network namespace's nsfs inode: distinct for namespaces that exist at the same time."""
    return os.stat(namespace).st_ino


def _check_spread_and_reach(cluster: SealedCluster) -> None:
    nodes = cluster.nodes
    assert [node.name for node in nodes] == ["node-1", "node-2", "node-3"]
    assert _ready_nodes(cluster) == ["node-1", "node-2", "node-3"]
    # Distinct addresses, pod CIDRs, network namespaces and cgroups; the Nodes say the same.
    assert len({n.address for n in nodes}) == len({n.pod_cidr for n in nodes}) == 3
    assert len({_inode(n.network_namespace) for n in [*nodes, cluster]}) == 4
    internal = {
        item["metadata"]["name"]: next(
            a["address"] for a in item["status"]["addresses"] if a["type"] == "InternalIP"
        )
        for item in json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    }
    assert internal == {n.name: n.address for n in nodes}
    for node in nodes:
        # The whole node runs under its cgroup: its kubelet, containerd and kube-proxy.
        assert set(node.host_pids().values()) <= set(node.cgroup_pids()), node
    # No route out of the cluster's namespace or any node's: the kernel says so, nothing is sent.
    for command in [cluster.node_command, *(node.command for node in nodes)]:
        for address in ("8.8.8.8", "192.168.1.1", "10.0.0.1", "172.17.0.1"):
            result = subprocess.run(
                command(["ip", "route", "get", address]),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert result.returncode != 0 and "unreachable" in result.stderr.lower(), result
    cluster.kubectl("create", "namespace", NAMESPACE)
    for index, node in enumerate(nodes, start=1):
        pod = _web_pod(f"web-{index}", node.name)
        cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(pod))
    cluster.kubectl("-n", NAMESPACE, "create", "service", "clusterip", "web", "--tcp=8080:8080")
    cluster.kubectl("-n", NAMESPACE, "set", "selector", "service", "web", "app=web")
    cluster_ip = cluster.get_json(NAMESPACE, "service", "web")["spec"]["clusterIP"]

    def pods_ready() -> dict[str, tuple[str, str]] | None:
        listed = cluster.get_json(NAMESPACE, "pods") or {"items": []}
        ready = {
            pod["metadata"]["name"]: (pod["spec"]["nodeName"], pod["status"]["podIP"])
            for pod in listed["items"]
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", [])
            )
        }
        return ready if len(ready) == 3 else None

    placed: dict[str, tuple[str, str]] = wait_for("a ready web pod on each node", pods_ready, timeout=180)
    for node in nodes:  # each pod on its node, with an address of that node's pod CIDR
        pod_ip = placed[f"web-{node.name.removeprefix('node-')}"][1]
        assert pod_ip.startswith(node.pod_cidr.rsplit(".", 1)[0] + "."), (node, pod_ip)
    wait_for(
        "the Service's three endpoints",
        lambda: (
            sum(
                1
                for item in (cluster.get_json(NAMESPACE, "endpointslices") or {}).get("items", [])
                for endpoint in item.get("endpoints") or []
                if (endpoint.get("conditions") or {}).get("ready")
            )
            == 3
        ),
    )
    pod_urls = {name: f"http://{ip}:8080/" for name, (_, ip) in placed.items()}
    service_url = f"http://{cluster_ip}:8080/"
    # From every node's namespace (its own routes and kube-proxy) and from the control plane's.
    for where in [*nodes, cluster]:
        for name, url in pod_urls.items():
            assert where.call_in_network(lambda url=url: _fetch(url)) == name, (where, name)
        answered = {where.call_in_network(lambda: _fetch(service_url)) for _ in range(15)}
        assert answered and answered <= set(pod_urls), (where, answered)
    # From every pod: pod to pod across nodes, and the Service through its node's kube-proxy.
    for name in pod_urls:
        fetch = cluster.kubectl(
            "-n", NAMESPACE, "exec", name, "--", "python", "-c", FETCH_ALL, *pod_urls.values(), service_url,
            timeout=60,
        )  # fmt: skip
        answers = json.loads(fetch.stdout.strip().splitlines()[-1])
        assert {url: answers[url] for url in pod_urls.values()} == {url: n for n, url in pod_urls.items()}
        assert answers[service_url] in pod_urls
    _check_volumes(cluster)


def _claim_user(name: str, claim: str, node: str) -> dict[str, object]:
    """A pod that writes its node's name into ``claim``; placed by the scheduler (a nodeSelector, not
    ``nodeName``, which would bypass the scheduler that picks a WaitForFirstConsumer claim's node)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": SHELL_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", f"echo {node} >> /data/nodes"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def _check_volumes(cluster: SealedCluster) -> None:
    """As on kind: a default-class claim's volume is a directory of the node its first pod ran on,
    tied to it; a ``shared-path`` claim's is one directory every node mounts."""
    claims = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Mi"}}, **extra},
        }
        for name, mode, extra in (
            ("journal", "ReadWriteOnce", {}),
            ("store", "ReadWriteMany", {"storageClassName": SHARED_CLASS}),
        )
    ]
    pods = [
        _claim_user("journal-user", "journal", "node-2"),
        *(_claim_user(f"store-user-{i}", "store", f"node-{i}") for i in (1, 3)),
    ]
    objects = {"apiVersion": "v1", "kind": "List", "items": [*claims, *pods]}
    cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(objects))

    def finished() -> bool:
        listed = cluster.get_json(NAMESPACE, "pods", "-l", "!app") or {"items": []}
        phases = [pod["status"].get("phase") for pod in listed["items"]]
        assert "Failed" not in phases, listed
        return phases.count("Succeeded") == 3

    wait_for("the claims' three pods finished", finished, timeout=180)
    journal = cluster.get_json(
        "default", "pv", cluster.get_json(NAMESPACE, "pvc", "journal")["spec"]["volumeName"]
    )
    (term,) = journal["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["node-2"], term
    journal_path = volume_path(journal)
    assert journal_path.parent == cluster.workdir / "nodes" / "node-2" / "local-path", journal_path
    assert (journal_path / "nodes").read_text() == "node-2\n"
    store = cluster.get_json(
        "default", "pv", cluster.get_json(NAMESPACE, "pvc", "store")["spec"]["volumeName"]
    )
    assert not store["spec"].get("nodeAffinity"), store["spec"]
    store_path = volume_path(store)
    assert store_path.parent == cluster.workdir / "shared-path", store_path
    assert sorted((store_path / "nodes").read_text().split()) == ["node-1", "node-3"]


def test_three_nodes_run_a_pod_each_reach_each_other_and_leave_nothing_behind(tmp_path: Path) -> None:
    reap_on_exit()
    before = machine_network()
    workdir = tmp_path / "three-nodes"
    cluster = start_sealed_cluster(
        LocalClusterSettings(tools_dir=built_tools_dir(), workdir=workdir, nodes=3, ready_timeout_seconds=270)
    )
    cgroups = CgroupRoot(cgroup_root_name(workdir))
    held = HeldNamespaces([cluster.network_namespace, *(node.network_namespace for node in cluster.nodes)])
    try:
        during = machine_network()
        print(f"three nodes ready in {cluster.ready_seconds:.1f}s")
        _check_spread_and_reach(cluster)
    finally:
        cluster.stop()
    assert during == before, "starting the cluster changed the machine's network namespace"
    assert machine_network() == before
    try:
        holders = held.holders()
    finally:
        held.close()
    assert holders == {}, f"processes still in a node's namespace: {holders}"
    assert str(workdir) not in Path("/proc/self/mountinfo").read_text()
    assert not cgroups.directories(), "the nodes' cgroups were left"
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{cgroups.name}*"))
    assert netns.CONTROL_PLANE_ADDRESS not in machine_network()["addresses"]
