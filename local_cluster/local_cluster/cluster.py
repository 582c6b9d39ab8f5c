"""What every local cluster shares: its settings, the tools, and kubectl/helm/API access.

``LocalClusterSettings`` says where a cluster lives and which tools it runs; ``ClusterAccess`` is
the kubectl, helm and API-client side of a running one (the sealed cluster, ``sealed_cluster``,
is the only kind there is: a real kubelet on containerd and runc in namespaces of its own);
``built_tools_dir`` finds the binaries ``make tools`` built.

The ``make cluster-up/down`` CLI is ``cluster_cli``; ``python -m local_cluster.cluster``
runs it, as it always has.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from local_cluster.api_reads import TABLE_ACCEPT, api_path, table_rows
from local_cluster.control_plane import ControlPlaneStartError
from local_cluster.local_path_storage import volume_path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "etcd",
    "helm",
    "kube-proxy",
    "coredns",
)


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.output}\nstderr: {self.stderr}"


def built_tools_dir() -> Path:
    """The bin directory ``make tools`` fills for the current pins; fails clearly if not built."""
    result = subprocess.run(
        [str(REPO_ROOT / "hack/tools/build.sh"), "--print"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    tools_dir = Path(result.stdout.strip())
    missing = [tool for tool in TOOLS if not (tools_dir / tool).is_file()]
    if missing:
        raise ControlPlaneStartError(
            f"{', '.join(missing)} not built in {tools_dir} for the current pins: "
            "run `make tools` (takes minutes, once)"
        )
    return tools_dir


@dataclass(frozen=True)
class LocalClusterSettings:
    tools_dir: Path
    workdir: Path
    node_name: str = "local-node"
    ready_timeout_seconds: float = 90.0
    # The sealed cluster's node: images imported in the background once it is ready, beyond those
    # it always imports (``kubelet_node.ON_DEMAND_IMAGES``: the validator's).
    background_images: tuple[str, ...] = ()
    # 1: the node above (the default, and the fastest); more: node-1 ... node-N, each a kubelet,
    # containerd and kube-proxy in a network namespace of its own (``cluster_nodes``).
    nodes: int = 1


class ClusterAccess:
    """kubectl, helm and API clients for a cluster, given its kubeconfig and tools."""

    settings: LocalClusterSettings

    @property
    def kubeconfig(self) -> Path:
        raise NotImplementedError

    @property
    def workdir(self) -> Path:
        return self.settings.workdir

    @property
    def tools_dir(self) -> Path:
        return self.settings.tools_dir

    def claim_volume_path(self, namespace: str, claim: str, timeout: float = 120) -> Path:
        """The directory of the volume bound to ``claim``, once it is bound: its PV's ``hostPath``
        (``local_path_storage.volume_path``), where the provisioner put it. A claim of a
        ``WaitForFirstConsumer`` class binds only once a pod uses it."""
        deadline = time.monotonic() + timeout
        phase = "absent"
        while time.monotonic() < deadline:
            body = self.get_json(namespace, "pvc", claim)
            if body is not None:
                phase = str((body.get("status") or {}).get("phase"))
                volume = (body.get("spec") or {}).get("volumeName")
                if phase == "Bound" and volume:
                    bound = json.loads(self.kubectl("get", "pv", volume, "-o", "json").stdout)
                    return volume_path(bound)
            time.sleep(0.5)
        raise TimeoutError(f"claim {namespace}/{claim} not Bound after {timeout:.0f}s (phase {phase})")

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG, with the tools (helm) first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.tools_dir}:{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        command = ["kubectl", f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, command, result.stdout, result.stderr)
        return result

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [str(self.tools_dir / "helm"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, env=self.env
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, command, result.stdout, result.stderr)
        return result

    def api_client(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    @functools.cached_property
    def _reader(self) -> client.ApiClient:
        """The client ``get_json`` keeps for its reads (a connection pool, not one per look)."""
        return self.api_client()

    def get_json(self, namespace: str, *what: str) -> Any:
        """``kubectl -n NAMESPACE get WHAT -o json`` decoded, or None where kubectl would fail (not
        found, API server unreachable). For the kinds ``api_reads`` knows, one GET over a client
        kept for the purpose, not a kubectl process (what polling loops call)."""
        request = api_path(namespace, what)
        if request is None:
            result = self.kubectl("-n", namespace, "get", *what, "-o", "json", check=False)
            return json.loads(result.stdout) if result.returncode == 0 else None
        return self._get(*request)

    def get_table(self, namespace: str, *what: str) -> list[dict[str, str]] | None:
        """The rows ``kubectl -n NAMESPACE get WHAT`` prints, as {COLUMN: cell}, from the API
        server's own printing (the Table kubectl asks for, ``api_reads.table_rows``) over the kept
        client, or None where kubectl would fail. Only for the kinds ``api_reads`` knows."""
        request = api_path(namespace, what)
        if request is None:
            raise ValueError(f"no API path for {what}: see local_cluster.api_reads")
        table = self._get(*request, accept=TABLE_ACCEPT)
        return None if table is None else table_rows(table)

    def _get(self, path: str, query: dict[str, str], accept: str = "application/json") -> Any:
        reader = self._reader
        method, url, headers, _, _ = reader.param_serialize(
            "GET",
            path,
            query_params=list(query.items()),
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
        )
        try:
            response = reader.call_api(method, url, header_params=headers, _request_timeout=10)
            body = response.read()
        except (ApiException, urllib3.exceptions.HTTPError, OSError):
            return None
        return json.loads(body) if response.status == 200 else None


if __name__ == "__main__":
    # `python -m local_cluster.cluster up|run|down|shell`: the Makefile's entry point.
    from local_cluster.cluster_cli import main

    sys.exit(main())
