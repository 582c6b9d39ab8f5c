"""Claims bind through a real provisioner: kind's local-path-provisioner, running as pods of the cluster.

On the sealed cluster (real PV controller, real kube-scheduler, real kubelet mounting the volumes into
our images' containers, ``local_cluster/local_cluster/local_path_storage.py``):

- the default class ``standard`` is local-path's (``rancher.io/local-path``, WaitForFirstConsumer,
  Delete): a claim stays Pending until a pod needs it, then gets a volume on the pod's node (node
  affinity), under that node's directory, made by a helper pod, writable by the brokers' user 10001;
  what a pod writes is at the bound PV's path, visible from this process;
- it refuses ReadWriteMany (its nodePathMap mode knows only ReadWriteOnce), which is why the shared
  store's claims name ``shared-path``, the second instance in sharedFileSystemPath mode: bound at once,
  no node affinity, one pod writes and another reads;
- ``Delete`` removes directory and volume with the claim (a claim re-created under the name starts
  empty); a ``Retain`` class of the same provisioner keeps both;
- a pod whose claim does not exist yet is held back by the scheduler until the claim is created.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from local_cluster.cluster import ClusterAccess
from local_cluster.local_path_storage import (
    DEFAULT_CLASS,
    PROVISIONER,
    SHARED_CLASS,
    SHARED_PROVISIONER,
    volume_path,
)
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import SHELL_IMAGE, wait_for

pytestmark = pytest.mark.e2e
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"  # set by sig-storage-lib-external-provisioner
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


@pytest.fixture
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    name = f"volumes-{uuid.uuid4().hex[:8]}"
    sealed_cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: sealed_cluster.get_json(name, "serviceaccount", "default"))
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def apply(cluster: ClusterAccess, namespace: str, *documents: dict[str, Any]) -> None:
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all(documents))


def claim(name: str, access_mode: str = "ReadWriteOnce", size: str = "1Gi", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": [access_mode], "resources": {"requests": {"storage": size}}, **spec},
    }


def shell_pod(name: str, claim_name: str, script: str) -> dict[str, Any]:
    """A pod of the broker image (Debian's sh, user 10001) running ``script`` once with the claim at /data."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": SHELL_IMAGE,
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
        },
    }


def bound_claim(cluster: ClusterAccess, namespace: str, name: str) -> dict[str, Any]:
    def probe() -> Any:
        found = cluster.get_json(namespace, "pvc", name)
        return found if found and found["status"].get("phase") == "Bound" else None

    # A helper pod runs before the volume exists: seconds on an idle node, more on a loaded one.
    return dict(wait_for(f"claim {name} Bound", probe, timeout=120))


def volume(cluster: ClusterAccess, name: str) -> dict[str, Any] | None:
    result = cluster.get_json("default", "pv", name)
    return dict(result) if result else None


def bound_volume(cluster: ClusterAccess, namespace: str, claim_name: str) -> dict[str, Any]:
    pv = volume(cluster, bound_claim(cluster, namespace, claim_name)["spec"]["volumeName"])
    assert pv is not None
    return pv


def run_to_completion(cluster: ClusterAccess, namespace: str, pod: dict[str, Any]) -> str:
    """Apply a pod, wait for it to finish, return its phase (Succeeded or Failed)."""
    name = pod["metadata"]["name"]
    apply(cluster, namespace, pod)

    def finished() -> Any:
        found = cluster.get_json(namespace, "pod", name)
        phase = (found or {}).get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = str(wait_for(f"pod {name} finished", finished, timeout=150))
    if phase != "Succeeded":  # say why: the container's own output, through the kubelet
        output = cluster.kubectl("-n", namespace, "logs", name, check=False)
        print(f"pod {name} {phase}: {output.stdout}{output.stderr}")
    return phase


def delete(cluster: ClusterAccess, namespace: str, *what: str) -> None:
    cluster.kubectl("-n", namespace, "delete", *what, "--wait=true", "--timeout=60s")


def claim_events(cluster: ClusterAccess, namespace: str, name: str) -> list[dict[str, Any]]:
    found = cluster.get_json(namespace, "events", "--field-selector", f"involvedObject.name={name}")
    return list((found or {}).get("items") or [])


def test_the_default_class_is_local_path_and_binds_a_claim_on_the_node_of_its_first_pod(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    default = sealed_cluster.get_json("default", "storageclass", DEFAULT_CLASS)
    assert default["metadata"]["annotations"][DEFAULT_CLASS_ANNOTATION] == "true"
    assert default["provisioner"] == PROVISIONER == "rancher.io/local-path"
    assert (default["volumeBindingMode"], default["reclaimPolicy"]) == ("WaitForFirstConsumer", "Delete")
    running = sealed_cluster.get_json("local-path-storage", "deployment", "local-path-provisioner")
    (container,) = running["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "localhost/broker-failover/local-path-provisioner:0.1.0", container

    apply(sealed_cluster, namespace, claim("journal"))
    # No class in the claim: the DefaultStorageClass admission plugin gave it `standard`, and its
    # binding waits for a consumer, so it stays Pending with no volume until a pod needs it.
    time.sleep(3)
    pending = sealed_cluster.get_json(namespace, "pvc", "journal")
    assert pending["spec"]["storageClassName"] == DEFAULT_CLASS
    assert pending["status"]["phase"] == "Pending" and not pending["spec"].get("volumeName"), pending
    reasons = {event["reason"] for event in claim_events(sealed_cluster, namespace, "journal")}
    assert "WaitForFirstConsumer" in reasons, reasons

    # The pod writes as 10001 (the broker image's user): the helper pod made the directory 0777.
    written = run_to_completion(
        sealed_cluster, namespace, shell_pod("writer", "journal", "id -u > /data/f && echo hello >> /data/f")
    )
    assert written == "Succeeded"
    pv = bound_volume(sealed_cluster, namespace, "journal")
    node = sealed_cluster.get_json(namespace, "pod", "writer")["spec"]["nodeName"]
    assert pv["metadata"]["annotations"][PROVISIONED_BY] == PROVISIONER
    assert pv["spec"]["storageClassName"] == DEFAULT_CLASS
    assert pv["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pv["spec"]["capacity"]["storage"] == "1Gi"
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert pv["spec"]["claimRef"]["namespace"] == namespace and pv["spec"]["claimRef"]["name"] == "journal"
    # A node's own disk: the volume is tied to the node the pod was scheduled to.
    (term,) = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    ], term
    directory = volume_path(pv)
    assert directory.parent == sealed_cluster.workdir / "local-path", directory
    assert directory.stat().st_mode & 0o777 == 0o777
    assert (directory / "f").read_text() == "10001\nhello\n"
    assert sealed_cluster.claim_volume_path(namespace, "journal") == directory


def test_read_write_many_claims_use_the_shared_path_class_and_pods_share_one_volume(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    shared = sealed_cluster.get_json("default", "storageclass", SHARED_CLASS)
    assert shared["provisioner"] == SHARED_PROVISIONER
    assert (shared["volumeBindingMode"], shared["reclaimPolicy"]) == ("Immediate", "Delete")
    assert DEFAULT_CLASS_ANNOTATION not in (shared["metadata"].get("annotations") or {})

    apply(sealed_cluster, namespace, claim("store", "ReadWriteMany", "2Gi", storageClassName=SHARED_CLASS))
    pv = bound_volume(sealed_cluster, namespace, "store")  # Immediate: bound before any pod
    assert pv["metadata"]["annotations"][PROVISIONED_BY] == SHARED_PROVISIONER
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"] and pv["spec"]["capacity"]["storage"] == "2Gi"
    assert not pv["spec"].get("nodeAffinity"), pv["spec"]  # every node mounts the shared directory
    directory = volume_path(pv)
    assert directory.parent == sealed_cluster.workdir / "shared-path", directory
    table = sealed_cluster.kubectl("-n", namespace, "get", "pvc", "store").stdout
    assert "Bound" in table and "RWX" in table and SHARED_CLASS in table, table

    writer = run_to_completion(
        sealed_cluster, namespace, shell_pod("writer", "store", "echo hello > /data/f")
    )
    assert writer == "Succeeded"
    reader = run_to_completion(
        sealed_cluster, namespace, shell_pod("reader", "store", 'test "$(cat /data/f)" = hello')
    )
    assert reader == "Succeeded"
    assert (directory / "f").read_text() == "hello\n"


def test_the_default_class_refuses_read_write_many(sealed_cluster: SealedCluster, namespace: str) -> None:
    """Why the store's claim names ``shared-path``: local-path's nodePathMap mode is ReadWriteOnce only."""
    apply(sealed_cluster, namespace, claim("wide", "ReadWriteMany"), shell_pod("user", "wide", "true"))

    def refused() -> Any:
        events = claim_events(sealed_cluster, namespace, "wide")
        return [e["message"] for e in events if e["reason"] == "ProvisioningFailed"]

    messages = wait_for("the provisioner to refuse the claim", refused, timeout=90)
    assert any("only supports ReadWriteOnce" in message for message in messages), messages
    found = sealed_cluster.get_json(namespace, "pvc", "wide")
    assert found["status"]["phase"] == "Pending" and not found["spec"].get("volumeName")
    assert sealed_cluster.get_json(namespace, "pod", "user")["status"]["phase"] == "Pending"


def test_deleting_a_claim_deletes_its_volume_and_directory_and_a_new_claim_of_the_name_starts_empty(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    apply(sealed_cluster, namespace, claim("scratch"))
    filled = run_to_completion(sealed_cluster, namespace, shell_pod("fill", "scratch", "echo old > /data/f"))
    assert filled == "Succeeded"
    pv = bound_volume(sealed_cluster, namespace, "scratch")
    pv_name, directory = pv["metadata"]["name"], volume_path(pv)
    assert (directory / "f").read_text() == "old\n"

    delete(sealed_cluster, namespace, "pod", "fill")
    delete(sealed_cluster, namespace, "pvc", "scratch")
    # The provisioner's teardown helper pod removes the directory, then the volume goes.
    wait_for(f"volume {pv_name} deleted", lambda: volume(sealed_cluster, pv_name) is None, timeout=120)
    assert not directory.exists()

    apply(sealed_cluster, namespace, claim("scratch"))
    empty = run_to_completion(sealed_cluster, namespace, shell_pod("check", "scratch", "test ! -e /data/f"))
    assert empty == "Succeeded"
    second = bound_volume(sealed_cluster, namespace, "scratch")
    assert second["metadata"]["name"] != pv_name and volume_path(second) != directory


def test_a_retain_class_keeps_volume_and_data_after_the_claim_is_deleted(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    class_name = f"retain-{namespace}"
    storage_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": class_name},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    sealed_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(storage_class))
    try:
        apply(sealed_cluster, namespace, claim("kept", storageClassName=class_name))
        kept = run_to_completion(sealed_cluster, namespace, shell_pod("keep", "kept", "echo mine > /data/f"))
        assert kept == "Succeeded"
        pv = bound_volume(sealed_cluster, namespace, "kept")
        pv_name, directory = pv["metadata"]["name"], volume_path(pv)
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        delete(sealed_cluster, namespace, "pod", "keep")
        delete(sealed_cluster, namespace, "pvc", "kept")
        wait_for(
            f"volume {pv_name} Released",
            lambda: ((volume(sealed_cluster, pv_name) or {}).get("status") or {}).get("phase") == "Released",
        )
        time.sleep(5)  # time for a provisioner that wrongly deleted it to have done so
        assert volume(sealed_cluster, pv_name) is not None
        assert (directory / "f").read_text() == "mine\n"

        # A new claim of the name gets a volume of its own, empty, beside the retained one.
        apply(sealed_cluster, namespace, claim("kept", storageClassName=class_name))
        empty = run_to_completion(sealed_cluster, namespace, shell_pod("fresh", "kept", "test ! -e /data/f"))
        assert empty == "Succeeded"
        assert bound_claim(sealed_cluster, namespace, "kept")["spec"]["volumeName"] != pv_name
        assert (directory / "f").read_text() == "mine\n"
    finally:
        # Retain means an admin cleans up: here, the test (the data directory too).
        sealed_cluster.kubectl("-n", namespace, "delete", "pod", "--all", "--wait=true", check=False)
        sealed_cluster.kubectl("-n", namespace, "delete", "pvc", "--all", "--wait=true", check=False)
        for leftover in (sealed_cluster.get_json("default", "pv") or {}).get("items", []):
            if leftover["spec"].get("storageClassName") == class_name:
                sealed_cluster.kubectl(
                    "delete", "pv", leftover["metadata"]["name"], "--wait=false", check=False
                )
                if leftover["spec"]["persistentVolumeReclaimPolicy"] == "Retain":
                    shutil.rmtree(volume_path(leftover), ignore_errors=True)
        sealed_cluster.kubectl("delete", "storageclass", class_name, check=False)


def test_a_pod_whose_claim_does_not_exist_yet_waits_until_it_is_created(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    apply(sealed_cluster, namespace, shell_pod("early", "later", "echo ran > /data/f"))

    def unschedulable() -> Any:
        pod = sealed_cluster.get_json(namespace, "pod", "early") or {}
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled: dict[str, Any] = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return scheduled if scheduled.get("status") == "False" else None

    # On a real cluster the scheduler holds the pod back (its VolumeBinding plugin), not the kubelet.
    scheduled = wait_for("pod early held back for its claim", unschedulable)
    assert scheduled["reason"] == "Unschedulable", scheduled
    assert 'persistentvolumeclaim "later" not found' in scheduled["message"], scheduled
    time.sleep(2)
    early = sealed_cluster.get_json(namespace, "pod", "early")
    assert early["status"]["phase"] == "Pending" and not early["spec"].get("nodeName"), early["status"]

    apply(sealed_cluster, namespace, claim("later"))

    def succeeded() -> Any:
        pod = sealed_cluster.get_json(namespace, "pod", "early") or {}
        return (pod.get("status") or {}).get("phase") == "Succeeded"

    # The claim's creation requeues the pod (a scheduler event), well before its 5-minute retry;
    # the scheduler then picks the node and local-path provisions the volume there.
    wait_for("pod early Succeeded once its claim is bound", succeeded, timeout=150)
    assert (sealed_cluster.claim_volume_path(namespace, "later") / "f").read_text() == "ran\n"
