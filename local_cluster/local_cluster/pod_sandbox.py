"""What a kubelet would set up around a container, done with files and env vars on this host.

``PodSandbox`` is one pod's: it ties together the modules that do the work and decides, per
mode, how a container sees its volumes:

- ``pod_references``: the Secrets, ConfigMaps, fields and service-account tokens the pod names;
- ``pod_volumes``: volumes under the pod's directory, mounts, path rewriting (``atomic_writer``
  writes Secret, ConfigMap, downwardAPI and projected volumes);
- ``container_env``: each container's environment and in-cluster config;
- ``pod_launcher``: the ``pod_enter`` argv prefix in pod-network mode.

The modes:

- pod-network mode (``network`` set, not ``hostNetwork``): ``launcher`` starts the container
  through ``pod_enter.py``, which gives it a mount namespace of its own with every
  volumeMount bind-mounted at its mountPath and the pod's ``resolv.conf`` and ``hosts``.
  Env, command, args, workingDir and exec probe commands are passed as written, as on a real
  node; the service-account token is mounted at ``/var/run/secrets/...`` like any volume.
- loopback mode (no pod network) and ``hostNetwork`` pods: no mount namespace, so paths are
  rewritten: a container's env values, command, args and workingDir that start with one of
  its volumeMount paths are pointed at the local directory instead (``rewrite_paths``).
  That is the documented fake there; code that hard-codes a mount path it was not given will
  not find its files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kubernetes import client

from local_cluster import pod_volumes
from local_cluster.container_env import ApiServerAddress, container_env
from local_cluster.pod_launcher import PodNetwork, launcher_argv, write_network_files
from local_cluster.pod_references import Body, PodReferences
from local_cluster.pod_volumes import Mount, PodVolumes


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
        self.references = PodReferences(pod, core=core, pod_ip=pod_ip, host_ip=host_ip)
        self.volumes = PodVolumes(pod, pod_dir=pod_dir, core=core, references=self.references)

    @property
    def volume_paths(self) -> dict[str, Path]:
        return self.volumes.paths

    @property
    def service_account_dir(self) -> Path | None:
        return self.volumes.service_account_dir

    @property
    def isolated(self) -> bool:
        """True when containers get their own mount namespace with volumes at their mountPath."""
        return self.network is not None and not self.pod["spec"].get("hostNetwork")

    def field_value(self, field_path: str) -> str:
        """Resolve a downward-API ``fieldPath`` the way the kubelet does."""
        return self.references.field_value(field_path)

    # ---- volumes ------------------------------------------------------------------

    def materialize_volumes(self) -> None:
        """Create every volume of the pod; safe to call again (contents are refreshed)."""
        self.volumes.materialize()

    def claim_path(self, claim_name: str) -> Path:
        """The directory of the PersistentVolume bound to ``claim_name`` (hostPath or local)."""
        return self.volumes.claim_path(claim_name)

    def refresh_volumes(self) -> list[str]:
        """Swap in the current content of every Secret and ConfigMap volume; the names that changed."""
        return self.volumes.refresh()

    def mounts(self, container: Body) -> list[Mount]:
        """The container's mounts, longest path first so nested mounts win when rewriting."""
        return self.volumes.mounts(container, self.isolated)

    def remove(self, keep_logs: bool = True) -> None:
        """Delete the pod's volumes (never PVC or hostPath directories, which live elsewhere)."""
        shutil.rmtree(self.pod_dir / "volumes", ignore_errors=True)
        if not keep_logs:
            shutil.rmtree(self.pod_dir, ignore_errors=True)

    # ---- how a container sees them ------------------------------------------------------

    def launcher(self, mounts: list[Mount], working_dir: str | None = None) -> list[str]:
        """The argv prefix that starts a container inside this pod (empty without a pod network).

        The pod gets its own network namespace, resolv.conf and hosts, and every volume mount
        at its mountPath; ``working_dir`` is entered once they are in place.
        """
        if self.network is None or not self.isolated:
            return []
        network_files = write_network_files(
            self.pod_dir / "etc",
            self.network,
            namespace=self.namespace,
            pod_name=self.pod["metadata"]["name"],
            pod_ip=self.pod_ip,
        )
        return launcher_argv(self.network, network_files, mounts, working_dir)

    def rewrite_paths(self, text: str, mounts: list[Mount]) -> str:
        """``rewrite_paths`` where there is no mount namespace; ``text`` as written where there is."""
        return text if self.isolated else pod_volumes.rewrite_paths(text, mounts)

    def container_env(self, container: Body, base_env: dict[str, str], mounts: list[Mount]) -> dict[str, str]:
        """The container's environment (``container_env``); call ``mounts`` first."""
        return container_env(
            container,
            base_env,
            mounts,
            references=self.references,
            pod_dir=self.pod_dir,
            apiserver=self.apiserver,
            kubernetes_service=(
                self.network.kubernetes_service if self.network is not None and self.isolated else None
            ),
            service_account_dir=self.service_account_dir,
        )
