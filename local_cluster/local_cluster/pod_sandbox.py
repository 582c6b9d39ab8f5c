"""What a kubelet would set up around a container, done with files and env vars on this host.

For one pod this materializes volumes under the pod's directory (emptyDir, Secret,
ConfigMap, downwardAPI, projected service-account tokens; a PVC as the directory of the
PersistentVolume bound to it, so it outlives the pod and a StatefulSet pod's replacement finds
the same claim, volume and data; a pod whose claim is missing or not yet bound waits in
ContainerCreating, as on a real node) and builds each container's environment
(values, fieldRef, secretKeyRef, configMapKeyRef, envFrom, ``$(VAR)`` expansion).

How a container sees its volumes depends on the mode:

- pod-network mode (``network`` set, not ``hostNetwork``): ``launcher`` starts the container
  through ``pod_enter.py``, which gives it a mount namespace of its own with every
  volumeMount bind-mounted at its mountPath (read-only ones read-only, subPath as the
  sub-directory or file of the volume) and the pod's ``resolv.conf`` and ``hosts``; missing
  mount points are made in private tmpfs layers, never on the machine. Env, command, args,
  workingDir and exec probe commands are passed as written, as on a real node.
- loopback mode (no pod network) and ``hostNetwork`` pods: no mount namespace, so paths are
  rewritten: a container's env values, command, args and workingDir that start with one of
  its volumeMount paths are pointed at the local directory instead (``rewrite_paths``).
  That is the documented fake there; code that hard-codes a mount path it was not given will
  not find its files.

In-cluster config: the service-account token comes from the real TokenRequest API
(bound to the pod, so RBAC applies to it) and is written with ``ca.crt`` and
``namespace``. In pod-network mode it is mounted at ``/var/run/secrets/...`` like any volume.
In loopback mode that path cannot be per pod, so the container gets
``KUBERNETES_SERVICE_HOST=127.0.0.1``, the apiserver's port, and a ``KUBECONFIG``
holding that token; client libraries (kubernetes, kopf) fall back from in-cluster
config to it.

Secret, ConfigMap, downwardAPI and projected volumes are written as the kubelet's
AtomicWriter writes them: the files in a fresh ``..<timestamp>`` directory, ``..data`` a
symlink to it, each top-level key a symlink through ``..data``, and an update swaps ``..data``
in one rename, so a reader sees the old files or the new ones, never a mix.
``refresh_volumes`` re-reads the Secret and ConfigMap volumes and swaps the changed ones; the
pod runtime calls it periodically, as the kubelet's sync loop does, so a rotated Secret reaches
a running pod without a restart (environment variables, as on a real node, do not change).

What it does not do: no token rotation of projected service-account tokens (they last an
hour), no refresh of projected volumes, no file modes or ownership, no image volumes, and in
loopback mode a ``subPath`` mount follows updates (the kubelet's does not; in pod-network mode
the bind holds the file it found at start, as the kubelet's does).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from local_cluster import pod_enter
from local_cluster.pki import write_kubeconfig

Body = dict[str, Any]
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class ContainerConfigError(RuntimeError):
    """A referenced Secret/ConfigMap/key is missing: the kubelet's CreateContainerConfigError."""

    reason = "CreateContainerConfigError"  # the container's waiting reason while this lasts


class VolumeNotReadyError(ContainerConfigError):
    """A claim is missing, being deleted or not bound yet: the pod waits in ContainerCreating."""

    reason = "ContainerCreating"


@dataclass(frozen=True)
class ApiServerAddress:
    host: str
    port: int
    ca_cert: Path


@dataclass(frozen=True)
class PodNetwork:
    """Where a pod lives in pod-network mode: its network namespace and the cluster's DNS."""

    namespace_path: Path
    dns_server: str
    cluster_domain: str
    kubernetes_service: tuple[str, int]


@dataclass(frozen=True)
class Mount:
    """A container's view (``mount_path``) of a local directory or file (``local_path``)."""

    mount_path: str
    local_path: Path
    read_only: bool = False


def _decode_secret(secret: Any) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}


def _config_map_items(config_map: Any) -> dict[str, bytes]:
    items = {key: value.encode() for key, value in (config_map.data or {}).items()}
    items.update({key: base64.b64decode(value) for key, value in (config_map.binary_data or {}).items()})
    return items


def _read_tree(directory: Path) -> dict[str, bytes]:
    files = {}
    for path in directory.rglob("*"):
        if path.is_file():
            files[str(path.relative_to(directory))] = path.read_bytes()
    return files


def write_atomically(target: Path, files: dict[str, bytes]) -> bool:
    """Make ``target`` hold exactly ``files`` (relative path: bytes) with one atomic swap; True if changed.

    The kubelet's AtomicWriter layout: a reader holding ``target/<key>`` opens the old file or
    the new one, never a half-written one, and a watcher sees the key's target change.
    """
    target.mkdir(parents=True, exist_ok=True)
    data_link = target / "..data"
    old_dir = target / os.readlink(data_link) if data_link.is_symlink() else None
    if old_dir is not None and old_dir.is_dir() and _read_tree(old_dir) == files:
        return False
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
    new_dir = target / f"..{stamp}.{uuid.uuid4().hex[:8]}"
    for relative, content in files.items():
        path = new_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    new_dir.mkdir(exist_ok=True)
    staged = target / "..data_tmp"
    staged.unlink(missing_ok=True)
    staged.symlink_to(new_dir.name)
    os.replace(staged, data_link)  # the one step that switches every key at once
    visible = {relative.split("/", 1)[0] for relative in files}
    for name in visible:
        link = target / name
        if not link.is_symlink():
            if link.is_dir():
                shutil.rmtree(link)
            else:
                link.unlink(missing_ok=True)
            link.symlink_to(f"..data/{name}")
    for entry in target.iterdir():
        if not entry.name.startswith("..") and entry.name not in visible:
            entry.unlink() if entry.is_symlink() or entry.is_file() else shutil.rmtree(entry)
    if old_dir is not None:
        shutil.rmtree(old_dir, ignore_errors=True)
    return True


class PodSandbox:
    """Files and environment for one pod; one instance per pod UID."""

    def __init__(
        self,
        pod: Body,
        *,
        pod_dir: Path,
        claims_dir: Path,
        core: client.CoreV1Api,
        apiserver: ApiServerAddress,
        pod_ip: str,
        host_ip: str,
        network: PodNetwork | None = None,
    ) -> None:
        self.pod = pod
        self.pod_dir = pod_dir
        # Unused since claims resolve through their bound PV (``claim_path``); kept for callers.
        self.claims_dir = claims_dir
        self.core = core
        self.apiserver = apiserver
        self.pod_ip = pod_ip
        self.host_ip = host_ip
        self.network = network
        self.namespace: str = pod["metadata"]["namespace"]
        self.volume_paths: dict[str, Path] = {}
        self.service_account_dir: Path | None = None

    # ---- field references -------------------------------------------------------

    def field_value(self, field_path: str) -> str:
        """Resolve a downward-API ``fieldPath`` the way the kubelet does."""
        metadata = self.pod["metadata"]
        spec = self.pod["spec"]
        simple = {
            "metadata.name": metadata["name"],
            "metadata.namespace": self.namespace,
            "metadata.uid": metadata.get("uid", ""),
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            "status.podIP": self.pod_ip,
            "status.podIPs": self.pod_ip,
            "status.hostIP": self.host_ip,
            "status.hostIPs": self.host_ip,
        }
        if field_path in simple:
            return str(simple[field_path])
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
        if match:
            return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))
        raise ContainerConfigError(f"fieldRef fieldPath {field_path!r} is not supported by the node agent")

    # ---- volumes ------------------------------------------------------------------

    @staticmethod
    def _selected(items: dict[str, bytes], selection: list[Body] | None, volume: str) -> dict[str, bytes]:
        chosen = (
            {item["key"]: item["path"] for item in selection} if selection else {key: key for key in items}
        )
        files = {}
        for key, relative in chosen.items():
            if key not in items:
                raise ContainerConfigError(f"key {key!r} not found for a volume item in {volume}")
            files[relative] = items[key]
        return files

    def _secret_items(self, name: str, optional: bool) -> dict[str, bytes] | None:
        try:
            return _decode_secret(self.core.read_namespaced_secret(name, self.namespace))
        except ApiException as error:
            if error.status == 404 and optional:
                return None
            raise ContainerConfigError(
                f"secret {self.namespace}/{name} not readable: {error.reason}"
            ) from error

    def _config_map_items(self, name: str, optional: bool) -> dict[str, bytes] | None:
        try:
            return _config_map_items(self.core.read_namespaced_config_map(name, self.namespace))
        except ApiException as error:
            if error.status == 404 and optional:
                return None
            raise ContainerConfigError(
                f"configmap {self.namespace}/{name} not readable: {error.reason}"
            ) from error

    def _service_account_token(self, expiration_seconds: int, audience: str | None) -> bytes:
        metadata = self.pod["metadata"]
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[audience] if audience else [],
                expiration_seconds=expiration_seconds,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=metadata["name"], uid=metadata["uid"]
                ),
            )
        )
        account = self.pod["spec"].get("serviceAccountName") or "default"
        reply = self.core.create_namespaced_service_account_token(account, self.namespace, request)
        if reply.status is None or not reply.status.token:
            raise ContainerConfigError(
                f"TokenRequest for serviceaccount {self.namespace}/{account} returned no token"
            )
        return str(reply.status.token).encode()

    def _projected(self, name: str, sources: list[Body]) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for source in sources:
            if source.get("serviceAccountToken"):
                token = source["serviceAccountToken"]
                files[token["path"]] = self._service_account_token(
                    int(token.get("expirationSeconds") or 3600), token.get("audience")
                )
            elif source.get("configMap"):
                ref = source["configMap"]
                items = self._config_map_items(ref["name"], bool(ref.get("optional")))
                if items is not None:
                    files.update(self._selected(items, ref.get("items"), name))
            elif source.get("secret"):
                ref = source["secret"]
                items = self._secret_items(ref["name"], bool(ref.get("optional")))
                if items is not None:
                    files.update(self._selected(items, ref.get("items"), name))
            elif source.get("downwardAPI"):
                files.update(self._downward_api(source["downwardAPI"].get("items") or []))
        return files

    def _downward_api(self, items: list[Body]) -> dict[str, bytes]:
        return {
            item["path"]: self.field_value(item["fieldRef"]["fieldPath"]).encode()
            for item in items
            if item.get("fieldRef")
        }

    def _referenced_files(self, volume: Body) -> dict[str, bytes] | None:
        """The files of a Secret or ConfigMap volume as the API server has them now; None otherwise."""
        if volume.get("secret"):
            ref = volume["secret"]
            items = self._secret_items(ref["secretName"], bool(ref.get("optional")))
            return self._selected(items or {}, ref.get("items"), volume["name"])
        if volume.get("configMap"):
            ref = volume["configMap"]
            items = self._config_map_items(ref["name"], bool(ref.get("optional")))
            return self._selected(items or {}, ref.get("items"), volume["name"])
        return None

    def materialize_volumes(self) -> None:
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
                write_atomically(target, self._downward_api(volume["downwardAPI"].get("items") or []))
            else:
                # emptyDir and anything else: an empty directory private to this pod.
                target.mkdir(parents=True, exist_ok=True)
            self.volume_paths[name] = target

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

    def refresh_volumes(self) -> list[str]:
        """Swap in the current content of every Secret and ConfigMap volume; the names that changed.

        As the kubelet's sync: a Secret that cannot be read now leaves the volume as it was.
        """
        changed = []
        for volume in self.pod["spec"].get("volumes") or []:
            if volume["name"] not in self.volume_paths:
                continue
            try:
                files = self._referenced_files(volume)
            except ContainerConfigError:
                continue
            if files is not None and write_atomically(self.volume_paths[volume["name"]], files):
                changed.append(volume["name"])
        return changed

    @property
    def isolated(self) -> bool:
        """True when containers get their own mount namespace with volumes at their mountPath."""
        return self.network is not None and not self.pod["spec"].get("hostNetwork")

    def mounts(self, container: Body) -> list[Mount]:
        """The container's mounts, longest path first so nested mounts win when rewriting."""
        volumes = {volume["name"]: volume for volume in self.pod["spec"].get("volumes") or []}
        mounts = []
        for mount in container.get("volumeMounts") or []:
            local = self.volume_paths[mount["name"]]
            if mount.get("subPath"):
                local = local / mount["subPath"]
                if self.isolated and not local.exists() and "hostPath" not in volumes.get(mount["name"], {}):
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

    # ---- pod network ------------------------------------------------------------------

    def _network_files(self, network: PodNetwork) -> dict[str, Path]:
        """The pod's resolv.conf and hosts, as the kubelet writes them for ClusterFirst DNS."""
        etc = self.pod_dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        domain = network.cluster_domain
        search = f"{self.namespace}.svc.{domain} svc.{domain} {domain}"
        resolv = etc / "resolv.conf"
        resolv.write_text(f"search {search}\nnameserver {network.dns_server}\noptions ndots:5\n")
        name = self.pod["metadata"]["name"]
        hosts = etc / "hosts"
        hosts.write_text(
            "# Kubernetes-managed hosts file (broker-failover node agent).\n"
            f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{self.pod_ip}\t{name}\n"
        )
        return {"/etc/resolv.conf": resolv, "/etc/hosts": hosts}

    def launcher(self, mounts: list[Mount], working_dir: str | None = None) -> list[str]:
        """The argv prefix that starts a container inside this pod (empty without a pod network).

        The pod gets its own network namespace, resolv.conf and hosts, and every volume mount
        at its mountPath (``pod_enter`` mounts parents first and makes missing mount points
        in private tmpfs layers); ``working_dir`` is entered once they are in place.
        """
        if self.network is None or not self.isolated:
            return []
        binds = {target: (local, False) for target, local in self._network_files(self.network).items()}
        # A volume mounted at /etc/hosts wins over the generated file, as on a real node.
        binds.update({mount.mount_path: (mount.local_path, mount.read_only) for mount in mounts})
        prefix = [sys.executable, str(Path(pod_enter.__file__)), f"--netns={self.network.namespace_path}"]
        for target, (local, read_only) in sorted(binds.items(), key=lambda item: len(Path(item[0]).parts)):
            prefix.append(f"--bind{'-ro' if read_only else ''}={local}:{target}")
        if working_dir:
            prefix.append(f"--workdir={working_dir}")
        return [*prefix, "--"]

    def rewrite_paths(self, text: str, mounts: list[Mount]) -> str:
        """``rewrite_paths`` where there is no mount namespace; ``text`` as written where there is."""
        return text if self.isolated else rewrite_paths(text, mounts)

    def remove(self, keep_logs: bool = True) -> None:
        """Delete the pod's volumes (never PVC or hostPath directories, which live elsewhere)."""
        shutil.rmtree(self.pod_dir / "volumes", ignore_errors=True)
        if not keep_logs:
            shutil.rmtree(self.pod_dir, ignore_errors=True)

    # ---- environment ---------------------------------------------------------------

    def container_env(self, container: Body, base_env: dict[str, str], mounts: list[Mount]) -> dict[str, str]:
        env = dict(base_env)
        env["HOSTNAME"] = self.pod["metadata"]["name"]
        if self.network is not None and self.isolated:
            # As on a real node: the `kubernetes` Service through kube-proxy, and the service
            # account files at their standard path (``launcher`` mounts them), so clients use
            # plain in-cluster config.
            host, port = self.network.kubernetes_service
            env["KUBERNETES_SERVICE_HOST"] = host
            env["KUBERNETES_SERVICE_PORT"] = env["KUBERNETES_SERVICE_PORT_HTTPS"] = str(port)
        else:
            env["KUBERNETES_SERVICE_HOST"] = self.apiserver.host
            env["KUBERNETES_SERVICE_PORT"] = str(self.apiserver.port)
            env["KUBERNETES_SERVICE_PORT_HTTPS"] = str(self.apiserver.port)
        if self.service_account_dir is not None and not self.isolated:
            env["KUBECONFIG"] = str(
                write_kubeconfig(
                    self.pod_dir / "in-cluster.kubeconfig",
                    server=f"https://{self.apiserver.host}:{self.apiserver.port}",
                    ca_cert=self.service_account_dir / "ca.crt",
                    user="service-account",
                    # Inline, not tokenFile: kopf's plain kubeconfig login reads only `token`.
                    token=(self.service_account_dir / "token").read_text().strip(),
                )
            )
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix") or ""
            if source.get("configMapRef"):
                ref = source["configMapRef"]
                items = self._config_map_items(ref["name"], bool(ref.get("optional"))) or {}
            else:
                ref = source["secretRef"]
                items = self._secret_items(ref["name"], bool(ref.get("optional"))) or {}
            env.update({prefix + key: value.decode() for key, value in items.items()})
        for variable in container.get("env") or []:
            value = self._env_value(container, variable, env)
            if value is not None:
                env[variable["name"]] = self.rewrite_paths(value, mounts)
        return env

    def _env_value(self, container: Body, variable: Body, env: dict[str, str]) -> str | None:
        if "value" in variable and variable["value"] is not None:
            return expand_references(variable["value"], env)
        source = variable.get("valueFrom") or {}
        if source.get("fieldRef"):
            return self.field_value(source["fieldRef"]["fieldPath"])
        if source.get("secretKeyRef"):
            ref = source["secretKeyRef"]
            items = self._secret_items(ref["name"], bool(ref.get("optional")))
            return _pick(items, ref, f"secret {self.namespace}/{ref['name']}")
        if source.get("configMapKeyRef"):
            ref = source["configMapKeyRef"]
            items = self._config_map_items(ref["name"], bool(ref.get("optional")))
            return _pick(items, ref, f"configmap {self.namespace}/{ref['name']}")
        if source.get("resourceFieldRef"):
            # Approximation: the declared quantity, not the node's allocatable.
            resource = source["resourceFieldRef"]["resource"]
            kind, _, name = resource.partition(".")
            return str(((container.get("resources") or {}).get(kind) or {}).get(name, "0"))
        return ""


def _pick(items: dict[str, bytes] | None, ref: Body, what: str) -> str | None:
    if items is None or ref["key"] not in items:
        if ref.get("optional"):
            return None
        raise ContainerConfigError(
            f"{what} has no key {ref['key']!r}; create it or mark the reference optional"
        )
    return items[ref["key"]].decode()


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_references(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names expand, unknown stay as written, ``$$`` escapes."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


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
