"""A real kubelet runs our images: the first node of the local cluster that is not our node agent.

``KubeletNode`` (local_cluster/local_cluster/kubelet_node.py) starts the control plane and the
kubelet (built with the other tools) on Debian's containerd and runc, in a sealed namespace with
the CNI bridge plugin, and the images of ``make images`` imported. What these tests prove could
not be proved on the node agent, which enforces no securityContext and runs no image: a broker pod
as the operator builds it runs as 10001 with a read-only root and no capabilities, its readiness
probe is the kubelet's, a killed container is restarted with ``kubectl logs --previous`` showing
the old one's output, and an image never built is the kubelet's own ErrImageNeverPull.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_operator.controller import builders, names
from broker_operator.controller.spec import parse_spec
from local_cluster import netns
from local_cluster.cluster import built_tools_dir
from local_cluster.containerd_sandbox import SealedContainerd
from local_cluster.image_build import build_images
from local_cluster.kubelet_node import KubeletNode
from local_cluster.processes import reap_on_exit
from tests.e2e.support import wait_for

pytestmark = pytest.mark.e2e
CLUSTER = "acme-1000"
NODE = "node-1"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeletNode]:
    reap_on_exit()
    built = {image.reference: image for image in build_images(["broker", "pause"])}
    workdir = Path(tmp_path_factory.mktemp("kubelet-node"))
    sandbox = SealedContainerd(workdir / "containerd", cri=True)
    sandbox.start()
    for image in built.values():
        sandbox.import_image(image.archive)
    kubelet = KubeletNode(sandbox, built_tools_dir(), workdir, NODE)
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
        sandbox.stop()
        left = kubelet.cgroups.remove()
        assert not left, f"cgroups left behind: {left}"


def pod(node: KubeletNode, name: str) -> dict[str, Any]:
    result = node.kubectl("get", "pod", name, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def container_status(node: KubeletNode, name: str) -> dict[str, Any]:
    statuses = pod(node, name).get("status", {}).get("containerStatuses", [])
    return statuses[0] if statuses else {}


def broker_pod(node: KubeletNode) -> None:
    """broker-0 as the operator builds it (its container, volumes and securityContext), with an
    emptyDir for the journal instead of a claim (no provisioner on this node yet)."""
    spec = parse_spec(
        CLUSTER,
        {
            "account": "acme",
            "company": "1000",
            "backend": {"url": f"http://{netns.NODE_ADDRESS}:9"},
            "cloud": {"url": f"http://{netns.NODE_ADDRESS}:9"},
        },
    )
    container = builders.broker_container(CLUSTER, spec)
    container["imagePullPolicy"] = "Never"
    volumes = [
        {"name": v["name"], "emptyDir": {}} if "persistentVolumeClaim" in v else v
        for v in builders.pod_volumes(CLUSTER, 0, spec)
    ]
    secrets = [spec.token_ref(CLUSTER), spec.backend_token_ref(CLUSTER)]
    objects = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": ref.name, "namespace": "default"},
            "stringData": {ref.key: f"{ref.name}-value"},
        }
        for ref in secrets
    ]
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "broker-0", "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "automountServiceAccountToken": False,
                "securityContext": builders.pod_security_context(spec),
                "containers": [container],
                "volumes": volumes,
            },
        }
    )
    node.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


@pytest.fixture(scope="module")
def broker(node: KubeletNode) -> KubeletNode:
    broker_pod(node)
    wait_for(
        "broker-0 Ready (the kubelet's readiness probe)",
        lambda: container_status(node, "broker-0").get("ready"),
    )
    return node


def test_a_broker_pod_runs_as_10001_with_a_read_only_root_and_no_capabilities(broker: KubeletNode) -> None:
    ids = broker.kubectl(
        "exec", "broker-0", "--", "python", "-c", "import os; print(os.getuid(), os.getgid())"
    )
    assert ids.stdout.split() == ["10001", "10001"]
    status = broker.kubectl("exec", "broker-0", "--", "cat", "/proc/1/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0, fields
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"
    write = broker.kubectl("exec", "broker-0", "--", "python", "-c", "open('/probe', 'w')", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr + write.stdout
    journal = broker.kubectl(
        "exec", "broker-0", "--", "python", "-c", f"open('{names.DATA_MOUNT}/probe', 'w').write('ok')"
    )
    assert journal.returncode == 0


def test_a_killed_container_is_restarted_and_its_output_kept_for_logs_previous(broker: KubeletNode) -> None:
    before = container_status(broker, "broker-0")
    container_id = before["containerID"].split("://", 1)[1]
    tasks = broker.sandbox.ctr("task", "list").stdout.splitlines()[1:]
    pid = next(line.split()[1] for line in tasks if line.split()[0] == container_id)
    broker.sandbox.run_inside(["kill", "-9", pid])
    wait_for(
        "the kubelet restarting the killed container",
        lambda: container_status(broker, "broker-0").get("restartCount", 0) > before.get("restartCount", 0),
        120,
    )
    last = container_status(broker, "broker-0")["lastState"]["terminated"]
    assert last["exitCode"] == 137, last
    previous = broker.kubectl("logs", "broker-0", "--previous").stdout
    assert "broker" in previous.lower() and previous.strip(), previous


def test_a_pod_naming_an_image_never_built_shows_the_kubelets_reason(node: KubeletNode) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ghost", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "ghost",
                    "image": "docker.io/broker-failover/never-built:0.1.0",
                    "imagePullPolicy": "Never",
                }
            ],
        },
    }
    node.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def reason() -> str | None:
        waiting = container_status(node, "ghost").get("state", {}).get("waiting", {}).get("reason")
        return None if waiting in (None, "ContainerCreating") else waiting  # the sandbox comes first

    waiting = wait_for("the ghost container waiting on its image", reason)
    assert waiting == "ErrImageNeverPull"
