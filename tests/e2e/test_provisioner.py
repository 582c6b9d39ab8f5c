"""Claims bind: the node agent's local-path provisioner behind the default StorageClass ``standard``.

Against the real API server and the real PV controller (kube-controller-manager binds claim and
volume): a claim gets a PersistentVolume of its access mode and size and turns Bound, pods reach the
volume's directory through the bound PV (one writes, another reads: ReadWriteMany), the ``Delete``
reclaim policy takes volume and directory with the claim (a claim re-created under the name starts
empty), a ``Retain`` class keeps both, and a pod whose claim does not exist yet waits in
ContainerCreating until the claim is created and bound. See local_cluster/local_cluster/provisioner.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.cluster import ClusterAccess, LocalCluster
from local_cluster.provisioner import DEFAULT_CLASS, PROVISIONED_BY, PROVISIONER_NAME
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import SHELL_IMAGE, get_json, wait_for


@pytest.fixture
def namespace(kube_cluster: LocalCluster) -> Iterator[str]:
    name = f"volumes-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: get_json(kube_cluster, name, "serviceaccount", "default"))
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


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
    """A busybox pod (the host's ``sh``) running ``script`` once with the claim at /data."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
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

    return str(wait_for(f"pod {name} finished", finished, timeout=60))


def delete(cluster: ClusterAccess, namespace: str, *what: str) -> None:
    cluster.kubectl("-n", namespace, "delete", *what, "--wait=true", "--timeout=60s")


def test_claims_bind_to_provisioned_volumes_and_pods_share_one(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    apply(kube_cluster, namespace, claim("store", "ReadWriteMany", "2Gi"), claim("journal", "ReadWriteOnce"))
    store, journal = (
        bound_claim(kube_cluster, namespace, "store"),
        bound_claim(kube_cluster, namespace, "journal"),
    )
    # No class in the claims: the DefaultStorageClass admission plugin gave them `standard`.
    assert store["spec"]["storageClassName"] == journal["spec"]["storageClassName"] == DEFAULT_CLASS
    default = get_json(kube_cluster, "default", "storageclass", DEFAULT_CLASS)
    assert default["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert default["provisioner"] == PROVISIONER_NAME and default["reclaimPolicy"] == "Delete"

    for bound, mode, size in ((store, "ReadWriteMany", "2Gi"), (journal, "ReadWriteOnce", "1Gi")):
        pv = volume(kube_cluster, bound["spec"]["volumeName"])
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
        assert Path(pv["spec"]["hostPath"]["path"]) == kube_cluster.state_dir / "claims" / namespace / name
    table = kube_cluster.kubectl("-n", namespace, "get", "pvc", "store").stdout
    assert "Bound" in table and "RWX" in table, table

    written = run_to_completion(kube_cluster, namespace, shell_pod("writer", "store", "echo hello > /data/f"))
    assert written == "Succeeded"
    read = run_to_completion(
        kube_cluster, namespace, shell_pod("reader", "store", 'test "$(cat /data/f)" = hello')
    )
    assert read == "Succeeded"
    assert (kube_cluster.state_dir / "claims" / namespace / "store" / "f").read_text() == "hello\n"


def test_deleting_a_claim_deletes_its_volume_and_a_new_claim_of_the_name_starts_empty(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    apply(kube_cluster, namespace, claim("scratch"))
    first = bound_claim(kube_cluster, namespace, "scratch")
    pv_name = first["spec"]["volumeName"]
    pv = volume(kube_cluster, pv_name)
    assert pv is not None
    directory = Path(pv["spec"]["hostPath"]["path"])
    assert run_to_completion(kube_cluster, namespace, shell_pod("fill", "scratch", "echo old > /data/f")) == (
        "Succeeded"
    )
    assert (directory / "f").exists()

    delete(kube_cluster, namespace, "pod", "fill")
    delete(kube_cluster, namespace, "pvc", "scratch")
    wait_for(f"volume {pv_name} deleted", lambda: volume(kube_cluster, pv_name) is None, timeout=60)
    assert not directory.exists()

    apply(kube_cluster, namespace, claim("scratch"))
    second = bound_claim(kube_cluster, namespace, "scratch")
    assert second["spec"]["volumeName"] != pv_name
    empty = run_to_completion(kube_cluster, namespace, shell_pod("check", "scratch", "test ! -e /data/f"))
    assert empty == "Succeeded"


def test_a_retain_class_keeps_volume_and_data_after_the_claim_is_deleted(
    kube_cluster: LocalCluster, namespace: str
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
    kube_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(storage_class))
    pv_name = ""
    try:
        apply(kube_cluster, namespace, claim("kept", storageClassName=class_name))
        pv_name = bound_claim(kube_cluster, namespace, "kept")["spec"]["volumeName"]
        pv = volume(kube_cluster, pv_name)
        assert pv is not None and pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        directory = Path(pv["spec"]["hostPath"]["path"])
        assert run_to_completion(
            kube_cluster, namespace, shell_pod("keep", "kept", "echo mine > /data/f")
        ) == ("Succeeded")
        delete(kube_cluster, namespace, "pod", "keep")
        delete(kube_cluster, namespace, "pvc", "kept")
        wait_for(
            f"volume {pv_name} Released",
            lambda: ((volume(kube_cluster, pv_name) or {}).get("status") or {}).get("phase") == "Released",
        )
        time.sleep(3)  # a few provisioner passes: nothing may delete a retained volume
        assert volume(kube_cluster, pv_name) is not None
        assert (directory / "f").read_text() == "mine\n"

        # A new claim of the name gets a volume of its own, empty, beside the retained one.
        apply(kube_cluster, namespace, claim("kept", storageClassName=class_name))
        again = bound_claim(kube_cluster, namespace, "kept")
        assert again["spec"]["volumeName"] != pv_name
        empty = run_to_completion(kube_cluster, namespace, shell_pod("fresh", "kept", "test ! -e /data/f"))
        assert empty == "Succeeded"
        assert (directory / "f").read_text() == "mine\n"
    finally:
        # Retain means an admin cleans up: here, the test.
        kube_cluster.kubectl("-n", namespace, "delete", "pod", "--all", "--wait=true", check=False)
        kube_cluster.kubectl("-n", namespace, "delete", "pvc", "--all", "--wait=true", check=False)
        for leftover in (get_json(kube_cluster, "default", "pv") or {}).get("items", []):
            if leftover["spec"].get("storageClassName") == class_name:
                kube_cluster.kubectl(
                    "delete", "pv", leftover["metadata"]["name"], "--wait=false", check=False
                )
        kube_cluster.kubectl("delete", "storageclass", class_name, check=False)


def test_a_pod_waits_in_container_creating_until_its_claim_exists_and_is_bound(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    apply(kube_cluster, namespace, shell_pod("early", "later", "echo ran > /data/f"))

    def waiting() -> Any:
        pod = get_json(kube_cluster, namespace, "pod", "early") or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        state = (statuses[0].get("state") or {}).get("waiting") or {}
        return state if state.get("message") else None

    state = wait_for("pod early waiting for its claim", waiting)
    assert state["reason"] == "ContainerCreating", state
    assert '"later"' in state["message"], state
    time.sleep(2)
    assert get_json(kube_cluster, namespace, "pod", "early")["status"]["phase"] == "Pending"

    apply(kube_cluster, namespace, claim("later"))
    bound_claim(kube_cluster, namespace, "later")

    def succeeded() -> Any:
        pod = get_json(kube_cluster, namespace, "pod", "early") or {}
        return (pod.get("status") or {}).get("phase") == "Succeeded"

    wait_for("pod early Succeeded once its claim is bound", succeeded, timeout=60)
    assert (kube_cluster.state_dir / "claims" / namespace / "later" / "f").read_text() == "ran\n"


def test_claims_bind_in_the_sealed_pod_network_cluster(sealed_cluster: SealedCluster) -> None:
    """The sealed cluster runs the same node agent, so the same provisioner: a pod in a network
    namespace of its own writes to a Bound claim's volume."""
    namespace = f"volumes-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    try:
        wait_for(
            "default ServiceAccount", lambda: get_json(sealed_cluster, namespace, "serviceaccount", "default")
        )
        apply(sealed_cluster, namespace, claim("store", "ReadWriteMany"))
        bound = bound_claim(sealed_cluster, namespace, "store")
        assert bound["spec"]["storageClassName"] == DEFAULT_CLASS
        phase = run_to_completion(
            sealed_cluster, namespace, shell_pod("writer", "store", "echo sealed > /data/f")
        )
        assert phase == "Succeeded"
        assert (sealed_cluster.state_dir / "claims" / namespace / "store" / "f").read_text() == "sealed\n"
    finally:
        sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
