"""The local cluster's volumes: kind's local-path-provisioner, deployed as kind deploys it.

Claims bind through a real provisioner, the one kind ships (``github.com/rancher/local-path-provisioner``,
pinned and built by ``make tools``, packed by ``make images`` with the Debian base its helper pods need),
running as pods of the cluster from ``local_path_storage.yaml``. It watches claims, runs a helper pod
on the chosen node that makes the volume's directory (``setup``: ``mkdir -m 0777``, so the brokers'
user 10001 can write to a hostPath volume, which gets no ``fsGroup``), creates the PersistentVolume
(``hostPath``), and on ``Delete`` runs a helper pod that removes the directory before it deletes the
volume. The real PV controller binds claim and volume, the scheduler (``WaitForFirstConsumer``) picks
the node, the kubelet mounts it.

Two instances, because no single config serves both kinds of claim the relay makes (the manifest's
header says why): ``standard``, the default class (``rancher.io/local-path``, a directory per node
under that node's own directory, node affinity to it, ReadWriteOnce only), and ``shared-path``
(``broker-failover.dev/shared-path``, its ``sharedFileSystemPath`` mode: one directory every node
mounts, no node affinity, any access mode), which the shared message-log store's claim names. Every
node of the sealed cluster sees the machine's one file system, so the shared mode is what it claims.

Where the data lives is the provisioner's business: callers read the bound PV's path
(``volume_path``, ``ClusterAccess.claim_volume_path``), never a directory derived from the claim's
name (``<base>/pvc-<uid>_<namespace>_<claim>`` today).

What this does not do: wait for the provisioners to be running (the cluster counts as ready once the
classes exist; a claim made before a provisioner runs is provisioned when it starts, as on kind), or
enforce capacity (local-path does not either).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

import yaml

from local_cluster.cluster_services import apply_cluster_manifest

MANIFEST = Path(__file__).with_name("local_path_storage.yaml")
NAMESPACE = "local-path-storage"
DEFAULT_CLASS = "standard"
SHARED_CLASS = "shared-path"  # ReadWriteMany: the message-log store's claim names it
PROVISIONER = "rancher.io/local-path"
SHARED_PROVISIONER = "broker-failover.dev/shared-path"
NODE_CONFIG_MAP = "local-path-config"
SHARED_CONFIG_MAP = "shared-path-config"


class NodePaths(TypedDict):
    node: str
    paths: list[str]


def node_path_config(node_paths: Mapping[str, Path]) -> dict[str, list[NodePaths]]:
    """``config.json`` of the default class: each node's own directory (no fallback entry, so a
    node this cluster did not make is an error in the provisioner's log, not a guess)."""
    return {"nodePathMap": [{"node": node, "paths": [str(path)]} for node, path in node_paths.items()]}


def shared_path_config(path: Path) -> dict[str, str]:
    return {"sharedFileSystemPath": str(path)}


def manifest(node_paths: Mapping[str, Path], shared_path: Path) -> list[dict[str, Any]]:
    """``local_path_storage.yaml`` with both ConfigMaps' ``config.json`` filled in."""
    documents = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    configs = {
        NODE_CONFIG_MAP: node_path_config(node_paths),
        SHARED_CONFIG_MAP: shared_path_config(shared_path),
    }
    for document in documents:
        if document["kind"] == "ConfigMap" and document["metadata"]["name"] in configs:
            document["data"]["config.json"] = json.dumps(configs[document["metadata"]["name"]], indent=2)
    return documents


def install_local_path_storage(kubeconfig: Path, node_paths: Mapping[str, Path], shared_path: Path) -> None:
    """Apply the provisioners and their classes (server-side apply: safe to repeat)."""
    documents = manifest(node_paths, shared_path)
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
    apply_cluster_manifest(kubeconfig, "local-path-provisioner", text=listed)


def volume_path(volume: Mapping[str, Any]) -> Path:
    """The directory of a PersistentVolume this provisioner made (``hostPath``, or ``local`` for a
    claim annotated ``volumeType: local``)."""
    spec = volume.get("spec") or {}
    for source in ("hostPath", "local"):
        path = (spec.get(source) or {}).get("path")
        if path:
            return Path(path)
    name = (volume.get("metadata") or {}).get("name")
    raise ValueError(f"PersistentVolume {name} has neither spec.hostPath.path nor spec.local.path")
