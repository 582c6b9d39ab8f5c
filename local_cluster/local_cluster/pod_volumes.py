"""A pod's volumes as directories on this host, its containers' mounts, and loopback-mode path rewriting.

Volumes are materialized under the pod's directory: emptyDir, Secret, ConfigMap, downwardAPI
and projected service-account tokens (the last four written by ``atomic_writer``); a PVC is
the directory of the PersistentVolume bound to it, so it outlives the pod and a StatefulSet
pod's replacement finds the same claim, volume and data; a pod whose claim is missing or not
yet bound waits in ContainerCreating, as on a real node.

``refresh`` re-reads the Secret and ConfigMap volumes and swaps the changed ones; the pod
runtime calls it periodically, as the kubelet's sync loop does, so a rotated Secret reaches a
running pod without a restart.

Where there is no mount namespace (loopback mode, ``hostNetwork`` pods), ``rewrite_paths``
points a container's mount paths at these local directories instead.

What it does not do: no token rotation of projected service-account tokens (they last an
hour), no refresh of projected volumes, no file modes or ownership, no image volumes, and in
loopback mode a ``subPath`` mount follows updates (the kubelet's does not; in pod-network mode
the bind holds the file it found at start, as the kubelet's does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from local_cluster.atomic_writer import write_atomically
from local_cluster.pod_references import (
    Body,
    ContainerConfigError,
    PodReferences,
    VolumeNotReadyError,
    select_items,
)

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class Mount:
    """A container's view (``mount_path``) of a local directory or file (``local_path``)."""

    mount_path: str
    local_path: Path
    read_only: bool = False


class PodVolumes:
    """The volumes of one pod: where each one lives on this host, and each container's mounts."""

    def __init__(
        self, pod: Body, *, pod_dir: Path, core: client.CoreV1Api, references: PodReferences
    ) -> None:
        self.pod = pod
        self.pod_dir = pod_dir
        self.core = core
        self.references = references
        self.namespace: str = pod["metadata"]["namespace"]
        self.paths: dict[str, Path] = {}  # volume name: its local directory
        self.service_account_dir: Path | None = None  # set by ``mounts`` once a container mounts it

    def _projected(self, name: str, sources: list[Body]) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for source in sources:
            if source.get("serviceAccountToken"):
                token = source["serviceAccountToken"]
                files[token["path"]] = self.references.service_account_token(
                    int(token.get("expirationSeconds") or 3600), token.get("audience")
                )
            elif source.get("configMap"):
                ref = source["configMap"]
                items = self.references.config_map_items(ref["name"], bool(ref.get("optional")))
                if items is not None:
                    files.update(select_items(items, ref.get("items"), name))
            elif source.get("secret"):
                ref = source["secret"]
                items = self.references.secret_items(ref["name"], bool(ref.get("optional")))
                if items is not None:
                    files.update(select_items(items, ref.get("items"), name))
            elif source.get("downwardAPI"):
                files.update(self.references.downward_api(source["downwardAPI"].get("items") or []))
        return files

    def _referenced_files(self, volume: Body) -> dict[str, bytes] | None:
        """The files of a Secret or ConfigMap volume as the API server has them now; None otherwise."""
        if volume.get("secret"):
            ref = volume["secret"]
            items = self.references.secret_items(ref["secretName"], bool(ref.get("optional")))
            return select_items(items or {}, ref.get("items"), volume["name"])
        if volume.get("configMap"):
            ref = volume["configMap"]
            items = self.references.config_map_items(ref["name"], bool(ref.get("optional")))
            return select_items(items or {}, ref.get("items"), volume["name"])
        return None

    def materialize(self) -> None:
        """Create every volume of the pod; safe to call again (contents are refreshed)."""
        volumes_dir = self.pod_dir / "volumes"
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            target = volumes_dir / name
            referenced = self._referenced_files(volume)
            if referenced is not None:
                write_atomically(target, referenced)
            elif volume.get("persistentVolumeClaim"):
                # The bound PV's directory, outside the pod directory: a StatefulSet pod's
                # replacement finds the journal its predecessor wrote.
                target = self.claim_path(volume["persistentVolumeClaim"]["claimName"])
            elif volume.get("hostPath"):
                target = Path(volume["hostPath"]["path"])
            elif volume.get("projected"):
                write_atomically(target, self._projected(name, volume["projected"].get("sources") or []))
            elif volume.get("downwardAPI"):
                write_atomically(
                    target, self.references.downward_api(volume["downwardAPI"].get("items") or [])
                )
            else:
                # emptyDir and anything else: an empty directory private to this pod.
                target.mkdir(parents=True, exist_ok=True)
            self.paths[name] = target

    def claim_path(self, claim_name: str) -> Path:
        """The directory of the PersistentVolume bound to ``claim_name`` (hostPath or local)."""
        what = f'persistentvolumeclaim "{claim_name}"'
        try:
            claim = self.core.read_namespaced_persistent_volume_claim(claim_name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                raise VolumeNotReadyError(f"{what} not found; waiting for it to be created") from error
            raise VolumeNotReadyError(f"{what} not readable: {error.reason}") from error
        if claim.metadata is not None and claim.metadata.deletion_timestamp is not None:
            raise VolumeNotReadyError(f"{what} is being deleted")
        phase = (claim.status.phase if claim.status is not None else None) or "Pending"
        volume_name = claim.spec.volume_name if claim.spec is not None else None
        if phase != "Bound" or not volume_name:
            raise VolumeNotReadyError(f"waiting for claim {claim_name} to be bound (phase {phase})")
        try:
            spec = self.core.read_persistent_volume(volume_name).spec
        except ApiException as error:
            raise VolumeNotReadyError(f"persistentvolume {volume_name!r}: {error.reason}") from error
        host_path = spec.host_path if spec is not None else None
        source = host_path or (spec.local if spec is not None else None)
        if source is None:
            raise ContainerConfigError(
                f"persistentvolume {volume_name!r} of {what}: the node agent mounts hostPath and local only"
            )
        path = Path(source.path)
        if host_path is not None and host_path.type in (None, "", "DirectoryOrCreate"):
            path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise VolumeNotReadyError(f"persistentvolume {volume_name!r}: {path} is not a directory")
        return path

    def refresh(self) -> list[str]:
        """Swap in the current content of every Secret and ConfigMap volume; the names that changed.

        As the kubelet's sync: a Secret that cannot be read now leaves the volume as it was.
        """
        changed = []
        for volume in self.pod["spec"].get("volumes") or []:
            if volume["name"] not in self.paths:
                continue
            try:
                files = self._referenced_files(volume)
            except ContainerConfigError:
                continue
            if files is not None and write_atomically(self.paths[volume["name"]], files):
                changed.append(volume["name"])
        return changed

    def mounts(self, container: Body, isolated: bool) -> list[Mount]:
        """The container's mounts, longest path first so nested mounts win when rewriting.

        ``isolated``: the container gets a mount namespace, so a missing subPath is created
        (a bind needs its source).
        """
        volumes = {volume["name"]: volume for volume in self.pod["spec"].get("volumes") or []}
        mounts = []
        for mount in container.get("volumeMounts") or []:
            local = self.paths[mount["name"]]
            if mount.get("subPath"):
                local = local / mount["subPath"]
                if isolated and not local.exists() and "hostPath" not in volumes.get(mount["name"], {}):
                    # A bind needs its source; the kubelet, too, creates a missing subPath directory.
                    local.mkdir(parents=True, exist_ok=True)
            mounts.append(
                Mount(
                    mount_path=mount["mountPath"].rstrip("/") or "/",
                    local_path=local,
                    read_only=bool(mount.get("readOnly")),
                )
            )
            if mount["mountPath"].rstrip("/") == SERVICE_ACCOUNT_MOUNT:
                self.service_account_dir = local
        return sorted(mounts, key=lambda m: len(m.mount_path), reverse=True)


def rewrite_paths(text: str, mounts: list[Mount]) -> str:
    """Point mount paths inside ``text`` (whole value, ``--flag=/path``, ``a:/path``) at local dirs.

    One pass over all mounts (longest first), so a rewritten local path is never
    rewritten again by a shorter mount such as ``/tmp``.
    """
    by_path = {mount.mount_path: str(mount.local_path) for mount in mounts if mount.mount_path != "/"}
    if not by_path:
        return text
    alternatives = "|".join(re.escape(path) for path in sorted(by_path, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w./-])(" + alternatives + r")(?=/|$|[^\w.-])")
    return pattern.sub(lambda match: by_path[match.group(1)], text)
