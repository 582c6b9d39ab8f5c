"""Claims bind: the sealed node's local-path provisioner behind the default StorageClass ``standard``.

On the sealed cluster (real PV controller, real kube-scheduler, real kubelet mounting the volumes into
our images' containers): a claim gets a PersistentVolume of its access mode and size and turns Bound,
pods reach the volume through the bound PV's hostPath, which the kubelet mounts (one writes, another
reads: ReadWriteMany), the ``Delete`` reclaim policy takes volume and directory with the claim (a claim
re-created under the name starts empty), a ``Retain`` class keeps both, and a pod whose claim does not
exist yet is held back by the scheduler until the claim is created and bound. The volumes' directories
are under the cluster's own directory (``state_dir / "claims" / <namespace> / <claim>``), visible from
this process. See local_cluster/local_cluster/provisioner.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.cluster import ClusterAccess
from local_cluster.provisioner import DEFAULT_CLASS, PROVISIONED_BY, PROVISIONER_NAME
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import SHELL_IMAGE, get_json, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    name = f"volumes-{uuid.uuid4().hex[:8]}"
    sealed_cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: get_json(sealed_cluster, name, "serviceaccount", "default"))
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
        found = get_json(cluster, namespace, "pvc", name)
        return found if found and found["status"].get("phase") == "Bound" else None

    return dict(wait_for(f"claim {name} Bound", probe, timeout=60))


def volume(cluster: ClusterAccess, name: str) -> dict[str, Any] | None:
    result = get_json(cluster, "default", "pv", name)
    return dict(result) if result else None


def run_to_completion(cluster: ClusterAccess, namespace: str, pod: dict[str, Any]) -> str:
    """Apply a pod, wait for it to finish, return its phase (Succeeded or Failed)."""
    name = pod["metadata"]["name"]
    apply(cluster, namespace, pod)

    def finished() -> Any:
        found = get_json(cluster, namespace, "pod", name)
        phase = (found or {}).get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = str(wait_for(f"pod {name} finished", finished, timeout=90))
    if phase != "Succeeded":  # say why: the container's own output, through the kubelet
        output = cluster.kubectl("-n", namespace, "logs", name, check=False)
        print(f"pod {name} {phase}: {output.stdout}{output.stderr}")
    return phase


def delete(cluster: ClusterAccess, namespace: str, *what: str) -> None:
    cluster.kubectl("-n", namespace, "delete", *what, "--wait=true", "--timeout=60s")


def test_claims_bind_to_provisioned_volumes_and_pods_share_one(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    apply(
        sealed_cluster, namespace, claim("store", "ReadWriteMany", "2Gi"), claim("journal", "ReadWriteOnce")
    )
    store, journal = (
        bound_claim(sealed_cluster, namespace, "store"),
        bound_claim(sealed_cluster, namespace, "journal"),
    )
    # No class in the claims: the DefaultStorageClass admission plugin gave them `standard`.
    assert store["spec"]["storageClassName"] == journal["spec"]["storageClassName"] == DEFAULT_CLASS
    default = get_json(sealed_cluster, "default", "storageclass", DEFAULT_CLASS)
    assert default["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert default["provisioner"] == PROVISIONER_NAME and default["reclaimPolicy"] == "Delete"

    for bound, mode, size in ((store, "ReadWriteMany", "2Gi"), (journal, "ReadWriteOnce", "1Gi")):
        pv = volume(sealed_cluster, bound["spec"]["volumeName"])
        assert pv is not None
        assert pv["metadata"]["annotations"][PROVISIONED_BY] == PROVISIONER_NAME
        assert pv["spec"]["accessModes"] == [mode]
        assert pv["spec"]["capacity"]["storage"] == size
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
        assert pv["spec"]["claimRef"]["uid"] == bound["metadata"]["uid"]
        assert pv["status"]["phase"] == "Bound"
        assert bound["status"]["accessModes"] == [mode] and bound["status"]["capacity"]["storage"] == size
        # The directory callers know: <state-dir>/claims/<namespace>/<claim>.
        name = bound["metadata"]["name"]
        assert Path(pv["spec"]["hostPath"]["path"]) == sealed_cluster.state_dir / "claims" / namespace / name
    table = sealed_cluster.kubectl("-n", namespace, "get", "pvc", "store").stdout
    assert "Bound" in table and "RWX" in table, table

    written = run_to_completion(
        sealed_cluster, namespace, shell_pod("writer", "store", "echo hello > /data/f")
    )
    assert written == "Succeeded"
    read = run_to_completion(
        sealed_cluster, namespace, shell_pod("reader", "store", 'test "$(cat /data/f)" = hello')
    )
    assert read == "Succeeded"
    assert (sealed_cluster.state_dir / "claims" / namespace / "store" / "f").read_text() == "hello\n"


def test_deleting_a_claim_deletes_its_volume_and_a_new_claim_of_the_name_starts_empty(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    apply(sealed_cluster, namespace, claim("scratch"))
    first = bound_claim(sealed_cluster, namespace, "scratch")
    pv_name = first["spec"]["volumeName"]
    pv = volume(sealed_cluster, pv_name)
    assert pv is not None
    directory = Path(pv["spec"]["hostPath"]["path"])
    assert run_to_completion(
        sealed_cluster, namespace, shell_pod("fill", "scratch", "echo old > /data/f")
    ) == ("Succeeded")
    assert (directory / "f").exists()

    delete(sealed_cluster, namespace, "pod", "fill")
    delete(sealed_cluster, namespace, "pvc", "scratch")
    wait_for(f"volume {pv_name} deleted", lambda: volume(sealed_cluster, pv_name) is None, timeout=60)
    assert not directory.exists()

    apply(sealed_cluster, namespace, claim("scratch"))
    second = bound_claim(sealed_cluster, namespace, "scratch")
    assert second["spec"]["volumeName"] != pv_name
    empty = run_to_completion(sealed_cluster, namespace, shell_pod("check", "scratch", "test ! -e /data/f"))
    assert empty == "Succeeded"


def test_a_retain_class_keeps_volume_and_data_after_the_claim_is_deleted(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    class_name = f"retain-{namespace}"
    storage_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": class_name},
        "provisioner": PROVISIONER_NAME,
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }
    sealed_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(storage_class))
    pv_name = ""
    try:
        apply(sealed_cluster, namespace, claim("kept", storageClassName=class_name))
        pv_name = bound_claim(sealed_cluster, namespace, "kept")["spec"]["volumeName"]
        pv = volume(sealed_cluster, pv_name)
        assert pv is not None and pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        directory = Path(pv["spec"]["hostPath"]["path"])
        assert run_to_completion(
            sealed_cluster, namespace, shell_pod("keep", "kept", "echo mine > /data/f")
        ) == ("Succeeded")
        delete(sealed_cluster, namespace, "pod", "keep")
        delete(sealed_cluster, namespace, "pvc", "kept")
        wait_for(
            f"volume {pv_name} Released",
            lambda: ((volume(sealed_cluster, pv_name) or {}).get("status") or {}).get("phase") == "Released",
        )
        time.sleep(3)  # a few provisioner passes: nothing may delete a retained volume
        assert volume(sealed_cluster, pv_name) is not None
        assert (directory / "f").read_text() == "mine\n"

        # A new claim of the name gets a volume of its own, empty, beside the retained one.
        apply(sealed_cluster, namespace, claim("kept", storageClassName=class_name))
        again = bound_claim(sealed_cluster, namespace, "kept")
        assert again["spec"]["volumeName"] != pv_name
        empty = run_to_completion(sealed_cluster, namespace, shell_pod("fresh", "kept", "test ! -e /data/f"))
        assert empty == "Succeeded"
        assert (directory / "f").read_text() == "mine\n"
    finally:
        # Retain means an admin cleans up: here, the test.
        sealed_cluster.kubectl("-n", namespace, "delete", "pod", "--all", "--wait=true", check=False)
        sealed_cluster.kubectl("-n", namespace, "delete", "pvc", "--all", "--wait=true", check=False)
        for leftover in (get_json(sealed_cluster, "default", "pv") or {}).get("items", []):
            if leftover["spec"].get("storageClassName") == class_name:
                sealed_cluster.kubectl(
                    "delete", "pv", leftover["metadata"]["name"], "--wait=false", check=False
                )
        sealed_cluster.kubectl("delete", "storageclass", class_name, check=False)


def test_a_pod_whose_claim_does_not_exist_yet_waits_until_it_is_created_and_bound(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    apply(sealed_cluster, namespace, shell_pod("early", "later", "echo ran > /data/f"))

    def unschedulable() -> Any:
        pod = get_json(sealed_cluster, namespace, "pod", "early") or {}
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled: dict[str, Any] = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return scheduled if scheduled.get("status") == "False" else None

    # On a real cluster the scheduler holds the pod back (its VolumeBinding plugin), not the kubelet.
    scheduled = wait_for("pod early held back for its claim", unschedulable)
    assert scheduled["reason"] == "Unschedulable", scheduled
    assert 'persistentvolumeclaim "later" not found' in scheduled["message"], scheduled
    time.sleep(2)
    early = get_json(sealed_cluster, namespace, "pod", "early")
    assert early["status"]["phase"] == "Pending" and not early["spec"].get("nodeName"), early["status"]

    apply(sealed_cluster, namespace, claim("later"))
    bound_claim(sealed_cluster, namespace, "later")

    def succeeded() -> Any:
        pod = get_json(sealed_cluster, namespace, "pod", "early") or {}
        return (pod.get("status") or {}).get("phase") == "Succeeded"

    # The claim's creation requeues the pod (a scheduler event), well before its 5-minute retry.
    wait_for("pod early Succeeded once its claim is bound", succeeded, timeout=120)
    assert (sealed_cluster.state_dir / "claims" / namespace / "later" / "f").read_text() == "ran\n"
