"""A dynamic volume provisioner for the local cluster, in the spirit of kind's local-path provisioner.

At start it creates the default StorageClass ``standard`` (``storageclass.kubernetes.io/is-default-class``,
provisioner ``broker-failover.dev/local-path``, ``reclaimPolicy: Delete``,
``volumeBindingMode: Immediate``). The API server's ``DefaultStorageClass`` admission plugin (on by
default) then gives every claim created without a class this one, so the operator's journal claims and
the shared message-log store need no ``storageClassName``.

For every claim that is not bound and whose class names this provisioner (``standard`` or any other
class a test creates with it, e.g. a ``Retain`` one) it creates a PersistentVolume ``pvc-<claim uid>``:
a ``hostPath`` directory on this node, capacity from the claim's request, the claim's access modes
(ReadWriteOnce, ReadWriteMany, ...: one host, so all of them hold), ``claimRef`` to the claim, the
class's name and reclaim policy, node affinity to this node (with several nodes, ``cluster_nodes``: to
every node, since each reaches the same directory of the one machine, as a network volume would be
reached), and the annotation
``pv.kubernetes.io/provisioned-by``. The real PV controller in kube-controller-manager
(persistentvolume-binder) binds claim and volume, so ``kubectl get pvc`` shows ``Bound``.

Where the data lives: ``<state-dir>/claims/<namespace>/<claim>``, the directory callers (the
validator's e2e test, the demo) read the message-log store from; if a retained volume of an earlier
claim of that name still holds it, ``<state-dir>/volumes/<pv-name>``. Pods reach it through the
bound PV's ``hostPath``, which the kubelet mounts, never by the claim's name.

Reclaim: a volume of ours that turns ``Released`` (its claim is gone) under ``Delete`` loses its
directory, then its PV object; under ``Retain`` both stay, as on a real cluster, and an admin deletes
them. So a claim re-created under the same name starts empty.

Why a thread of the sealed cluster's supervisor (``kubelet_node``), not a process of its own: the
directories are the node's (as the local-path provisioner runs on the node), the supervisor already
has the state directory and the API credentials, and its lifetime, logs and teardown come with it:
nothing more to start, sweep or stop.

What it does not do: quotas (capacity is a label, not a limit), ``volumeMode: Block``, expansion,
snapshots, or ``WaitForFirstConsumer`` scheduling (a class with that mode is provisioned once a claim
carries ``volume.kubernetes.io/selected-node``, which nothing here sets).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("provisioner")
Body = dict[str, Any]

PROVISIONER_NAME = "broker-failover.dev/local-path"
DEFAULT_CLASS = "standard"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
DIRECTORY_ANNOTATION = "broker-failover.dev/local-path"  # the volume's directory, for humans


def default_storage_class() -> Body:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": DEFAULT_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": PROVISIONER_NAME,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_name(claim: Body) -> str:
    """``pvc-<uid>``, as the external provisioners name theirs: unique per claim object."""
    return f"pvc-{claim['metadata']['uid']}"


def claim_directory(state_dir: Path, claim: Body, taken: bool) -> Path:
    """``claims/<ns>/<claim>`` unless an earlier (retained) volume still holds it."""
    metadata = claim["metadata"]
    if not taken:
        return state_dir / "claims" / metadata["namespace"] / metadata["name"]
    return state_dir / "volumes" / volume_name(claim)


def persistent_volume(
    claim: Body, storage_class: Body, directory: Path, node_name: str, also_on: Sequence[str] = ()
) -> Body:
    metadata, spec = claim["metadata"], claim["spec"]
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage") or "1Gi"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(claim),
            "annotations": {PROVISIONED_BY: PROVISIONER_NAME, DIRECTORY_ANNOTATION: str(directory)},
        },
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
            "storageClassName": storage_class["metadata"]["name"],
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": metadata["namespace"],
                "name": metadata["name"],
                "uid": metadata["uid"],
            },
            "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node_name, *also_on],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def wants_volume(claim: Body, classes: dict[str, Body], node_name: str) -> Body | None:
    """The class to provision ``claim`` with, or None (bound, being deleted, another provisioner's)."""
    metadata, spec = claim["metadata"], claim["spec"]
    if spec.get("volumeName") or metadata.get("deletionTimestamp"):
        return None
    storage_class = classes.get(spec.get("storageClassName") or "")
    if storage_class is None:
        return None
    if storage_class.get("volumeBindingMode") == "WaitForFirstConsumer":
        selected = (metadata.get("annotations") or {}).get(SELECTED_NODE)
        if selected != node_name:
            return None
    return storage_class


def within(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


class LocalPathProvisioner:
    """The controller: ``run`` until ``stopping`` is set (a thread of the cluster's supervisor)."""

    def __init__(
        self,
        kubeconfig: Path,
        state_dir: Path,
        node_name: str,
        stopping: threading.Event,
        resync_seconds: float = 5.0,
        *,
        other_nodes: Sequence[str] = (),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.state_dir = state_dir
        self.node_name = node_name
        self.other_nodes = tuple(other_nodes)
        self.stopping = stopping
        self.resync_seconds = resync_seconds
        self.changed = threading.Event()
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.storage = client.StorageV1Api(self.api_client)
        self.threads: list[threading.Thread] = []

    # ---- API helpers (dicts) -----------------------------------------------------------

    @staticmethod
    def _items(reply: Any) -> list[Body]:
        return list(json.loads(reply.data).get("items") or [])

    def ensure_default_class(self) -> None:
        try:
            body: Any = default_storage_class()  # a dict body: the client sends it as it is
            self.storage.create_storage_class(body, _preload_content=False)
            log.info("created the default StorageClass %s (%s)", DEFAULT_CLASS, PROVISIONER_NAME)
        except ApiException as error:
            if error.status != 409:
                raise

    def _our_classes(self) -> dict[str, Body]:
        classes = self._items(self.storage.list_storage_class(_preload_content=False))
        return {c["metadata"]["name"]: c for c in classes if c.get("provisioner") == PROVISIONER_NAME}

    # ---- reconciliation ----------------------------------------------------------------

    def reconcile(self) -> None:
        classes = self._our_classes()
        volumes = self._items(self.core.list_persistent_volume(_preload_content=False))
        existing = {v["metadata"]["name"] for v in volumes}
        held = {
            str((v["spec"].get("hostPath") or {}).get("path") or (v["spec"].get("local") or {}).get("path"))
            for v in volumes
        }
        claims = self._items(
            self.core.list_persistent_volume_claim_for_all_namespaces(_preload_content=False)
        )
        for claim in claims:
            storage_class = wants_volume(claim, classes, self.node_name)
            if storage_class is None or volume_name(claim) in existing:
                continue
            self._provision(claim, storage_class, held)
        for volume in volumes:
            self._reclaim(volume)

    def _provision(self, claim: Body, storage_class: Body, held: set[str]) -> None:
        preferred = claim_directory(self.state_dir, claim, taken=False)
        directory = claim_directory(self.state_dir, claim, taken=str(preferred) in held or preferred.exists())
        directory.mkdir(parents=True, exist_ok=True)
        # Writable by whatever user the pod runs as (brokers run as 10001): a hostPath volume gets
        # no fsGroup, so the directory is 0777, as kind's local-path-provisioner makes it.
        directory.chmod(0o777)
        body: Any = persistent_volume(claim, storage_class, directory, self.node_name, self.other_nodes)
        try:
            self.core.create_persistent_volume(body, _preload_content=False)
        except ApiException as error:
            if error.status != 409:
                log.warning("volume for claim %s not created: %s", self._claim_ref(claim), error.reason)
            return
        held.add(str(directory))
        log.info(
            "provisioned %s for claim %s (%s, %s) at %s",
            body["metadata"]["name"],
            self._claim_ref(claim),
            ",".join(body["spec"]["accessModes"]),
            body["spec"]["capacity"]["storage"],
            directory,
        )

    def _reclaim(self, volume: Body) -> None:
        metadata, spec = volume["metadata"], volume["spec"]
        if (metadata.get("annotations") or {}).get(PROVISIONED_BY) != PROVISIONER_NAME:
            return
        if (volume.get("status") or {}).get("phase") != "Released":
            return
        if spec.get("persistentVolumeReclaimPolicy") != "Delete" or metadata.get("deletionTimestamp"):
            return  # Retain: the volume and its data stay for an admin
        directory = Path((spec.get("hostPath") or {}).get("path") or "")
        if directory.parts and within(directory, self.state_dir):
            shutil.rmtree(directory, ignore_errors=True)
        try:
            self.core.delete_persistent_volume(metadata["name"], _preload_content=False)
        except ApiException as error:
            if error.status != 404:
                log.warning("volume %s not deleted: %s", metadata["name"], error.reason)
                return
        log.info(
            "deleted %s and its directory %s (claim gone, reclaim policy Delete)", metadata["name"], directory
        )

    @staticmethod
    def _claim_ref(claim: Body) -> str:
        return f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"

    # ---- the loop ------------------------------------------------------------------------

    def _watch(self, kind: str) -> None:
        """Wake the loop on any claim or volume event (its own API client; bounded by ``stopping``)."""
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))
        lister = (
            api.list_persistent_volume_claim_for_all_namespaces
            if kind == "claims"
            else api.list_persistent_volume
        )
        while not self.stopping.is_set():
            try:
                for _event in watch.Watch().stream(lister, timeout_seconds=30, deserialize=False):
                    self.changed.set()
                    if self.stopping.is_set():
                        return
            except Exception as error:  # apiserver restart, timeout: watch again
                if self.stopping.is_set():
                    return
                log.debug("%s watch failed (%s); again in 1s", kind, error)
                time.sleep(1)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.ensure_default_class()
                break
            except Exception as error:
                log.warning("default StorageClass not created yet (%s); retrying in 1s", error)
                self.stopping.wait(1.0)
        for kind in ("claims", "volumes"):
            thread = threading.Thread(
                target=self._watch, args=(kind,), name=f"provisioner-{kind}", daemon=True
            )
            thread.start()
            self.threads.append(thread)
        while not self.stopping.is_set():
            self.changed.clear()
            try:
                self.reconcile()
            except Exception:
                log.exception("provisioner pass failed; retried")
            self.changed.wait(self.resync_seconds)
            self.stopping.wait(0.1)  # coalesce a burst of events into one pass

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="provisioner", daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread
