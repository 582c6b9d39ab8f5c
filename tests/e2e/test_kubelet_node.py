"""The sealed cluster's node is a real kubelet on containerd and runc, running our images.

``kubelet_node`` starts the kubelet (built with the other tools) on Debian's containerd and runc,
with the CNI bridge plugin and the images of ``make images`` imported. What these tests prove could
not be proved on the node agent, which enforces no securityContext and runs no image: a broker pod
as the operator builds it runs as 10001 with a read-only root and no capabilities, its readiness
probe is the kubelet's, a killed container is restarted with ``kubectl logs --previous`` showing
the old one's output, and an image never built is the kubelet's own ErrImageNeverPull.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest

from broker_operator.controller import builders, names, verifiers
from broker_operator.controller.spec import parse_spec
from local_cluster import netns
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import SHELL_IMAGE, wait_for

pytestmark = pytest.mark.e2e
CLUSTER = "acme-1000"


@pytest.fixture(scope="module")
def node(sealed_cluster: SealedCluster) -> SealedCluster:
    return sealed_cluster


@pytest.fixture(scope="module")
def namespace(node: SealedCluster) -> str:
    name = f"kubelet-{uuid.uuid4().hex[:6]}"
    node.kubectl("create", "namespace", name)
    return name


def pod(node: SealedCluster, namespace: str, name: str) -> dict[str, Any]:
    result = node.kubectl("-n", namespace, "get", "pod", name, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def container_status(node: SealedCluster, namespace: str, name: str) -> dict[str, Any]:
    statuses = pod(node, namespace, name).get("status", {}).get("containerStatuses", [])
    return statuses[0] if statuses else {}


def broker_pod(node: SealedCluster, namespace: str) -> None:
    """broker-0 as the operator builds it (its container, volumes and securityContext), its claims
    bound by the cluster's provisioner (kind's local-path-provisioner, the default class)."""
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
    volumes = builders.pod_volumes(CLUSTER, 0, spec)
    # What the pod mounts: the verifiers of two tokens, never the tokens (verifiers.py).
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": names.verifier_secret_name(CLUSTER), "namespace": namespace},
            "stringData": verifiers.verifier_data("o" * 32, "b" * 32),
        }
    ]
    objects += [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": volume["persistentVolumeClaim"]["claimName"], "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        for volume in volumes
        if "persistentVolumeClaim" in volume
    ]
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "broker-0", "namespace": namespace},
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": builders.pod_security_context(spec),
                "containers": [container],
                "volumes": volumes,
            },
        }
    )
    node.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


@pytest.fixture(scope="module")
def broker(node: SealedCluster, namespace: str) -> str:
    broker_pod(node, namespace)
    wait_for(
        "broker-0 Ready (the kubelet's readiness probe)",
        lambda: container_status(node, namespace, "broker-0").get("ready"),
        120,
    )
    return namespace


def test_a_broker_pod_runs_as_10001_with_a_read_only_root_and_no_capabilities(
    node: SealedCluster, broker: str
) -> None:
    def in_broker(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return node.kubectl("-n", broker, "exec", "broker-0", "--", *argv, check=check)

    ids = in_broker("python", "-c", "import os; print(os.getuid(), os.getgid())")
    assert ids.stdout.split() == ["10001", "10001"]
    status = in_broker("cat", "/proc/1/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0, fields
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"
    write = in_broker("python", "-c", "open('/probe', 'w')", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr + write.stdout
    # The journal's claim, a hostPath volume local-path's helper pod made 0777, is writable by 10001.
    journal = in_broker("python", "-c", f"open('{names.DATA_MOUNT}/probe', 'w').write('ok')")
    assert journal.returncode == 0


def test_a_killed_container_is_restarted_and_its_output_kept_for_logs_previous(
    node: SealedCluster, broker: str
) -> None:
    before = container_status(node, broker, "broker-0")
    pid = node.container_pid(pod(node, broker, "broker-0"))
    subprocess.run(node.node_command(["kill", "-9", str(pid)]), check=True, timeout=30)
    wait_for(
        "the kubelet restarting the killed container",
        lambda: (
            container_status(node, broker, "broker-0").get("restartCount", 0) > before.get("restartCount", 0)
        ),
        120,
    )
    last = container_status(node, broker, "broker-0")["lastState"]["terminated"]
    assert last["exitCode"] == 137, last
    previous = node.kubectl("-n", broker, "logs", "broker-0", "--previous").stdout
    assert "broker" in previous.lower() and previous.strip(), previous


def test_a_pod_naming_an_image_never_built_shows_the_kubelets_reason(
    node: SealedCluster, namespace: str
) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ghost", "namespace": namespace},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "ghost",
                    "image": "localhost/broker-failover/never-built:0.1.0",
                    "imagePullPolicy": "Never",
                }
            ],
        },
    }
    node.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def reason() -> str | None:
        waiting = container_status(node, namespace, "ghost").get("state", {}).get("waiting", {}).get("reason")
        return None if waiting in (None, "ContainerCreating") else waiting  # the sandbox comes first

    waiting = wait_for("the ghost container waiting on its image", reason)
    assert waiting == "ErrImageNeverPull"


def test_kubectl_attach_reaches_the_container_s_stdin_through_the_kubelet(
    node: SealedCluster, namespace: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reader", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": SHELL_IMAGE,
                    "command": ["sh", "-c", "read line; echo got:$line"],
                    "stdin": True,
                    "stdinOnce": True,
                }
            ],
        },
    }
    node.kubectl("apply", "-f", "-", input=json.dumps(pod))
    wait_for(
        "reader running", lambda: container_status(node, namespace, "reader").get("state", {}).get("running")
    )
    attached = node.kubectl(
        "-n", namespace, "attach", "-i", "reader", "-c", "main", input="hello\n", timeout=60
    )
    wait_for(
        "the container's answer in its log",
        lambda: "got:hello" in node.kubectl("-n", namespace, "logs", "reader", check=False).stdout,
        60,
    )
    assert attached.returncode == 0
