"""A container's environment as the kubelet builds it, and how it finds the API server.

Values, fieldRef, secretKeyRef, configMapKeyRef, resourceFieldRef, envFrom, and
``$(VAR)`` expansion (``expand_references``). Environment variables, as on a real node, are
fixed when the container starts: a rotated Secret does not change them.

In-cluster config: in pod-network mode the container gets the ``kubernetes`` Service
(through kube-proxy) and finds the service-account files at their standard path, so clients
use plain in-cluster config. In loopback mode that path cannot be per pod, so the container
gets ``KUBERNETES_SERVICE_HOST=127.0.0.1``, the apiserver's port, and a ``KUBECONFIG`` holding
the pod's token; client libraries (kubernetes, kopf) fall back from in-cluster config to it.
Values are path-rewritten there (``pod_volumes.rewrite_paths``), as written where the
container has its own mounts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from local_cluster.pki import write_kubeconfig
from local_cluster.pod_references import Body, ContainerConfigError, PodReferences
from local_cluster.pod_volumes import Mount, rewrite_paths


@dataclass(frozen=True)
class ApiServerAddress:
    host: str
    port: int
    ca_cert: Path


def container_env(
    container: Body,
    base_env: dict[str, str],
    mounts: list[Mount],
    *,
    references: PodReferences,
    pod_dir: Path,
    apiserver: ApiServerAddress,
    kubernetes_service: tuple[str, int] | None,
    service_account_dir: Path | None,
) -> dict[str, str]:
    """``base_env`` plus what the pod spec gives ``container``.

    ``kubernetes_service``: the Service address where the container has a pod network and
    mounts of its own; None where it shares the host (loopback mode, ``hostNetwork``).
    """
    isolated = kubernetes_service is not None
    env = dict(base_env)
    env["HOSTNAME"] = references.pod["metadata"]["name"]
    if kubernetes_service is not None:
        # As on a real node: the `kubernetes` Service through kube-proxy, and the service
        # account files at their standard path (the launcher mounts them), so clients use
        # plain in-cluster config.
        host, port = kubernetes_service
        env["KUBERNETES_SERVICE_HOST"] = host
        env["KUBERNETES_SERVICE_PORT"] = env["KUBERNETES_SERVICE_PORT_HTTPS"] = str(port)
    else:
        env["KUBERNETES_SERVICE_HOST"] = apiserver.host
        env["KUBERNETES_SERVICE_PORT"] = str(apiserver.port)
        env["KUBERNETES_SERVICE_PORT_HTTPS"] = str(apiserver.port)
    if service_account_dir is not None and not isolated:
        env["KUBECONFIG"] = str(
            write_kubeconfig(
                pod_dir / "in-cluster.kubeconfig",
                server=f"https://{apiserver.host}:{apiserver.port}",
                ca_cert=service_account_dir / "ca.crt",
                user="service-account",
                # Inline, not tokenFile: kopf's plain kubeconfig login reads only `token`.
                token=(service_account_dir / "token").read_text().strip(),
            )
        )
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix") or ""
        if source.get("configMapRef"):
            ref = source["configMapRef"]
            items = references.config_map_items(ref["name"], bool(ref.get("optional"))) or {}
        else:
            ref = source["secretRef"]
            items = references.secret_items(ref["name"], bool(ref.get("optional"))) or {}
        env.update({prefix + key: value.decode() for key, value in items.items()})
    for variable in container.get("env") or []:
        value = _env_value(references, container, variable, env)
        if value is not None:
            env[variable["name"]] = value if isolated else rewrite_paths(value, mounts)
    return env


def _env_value(references: PodReferences, container: Body, variable: Body, env: dict[str, str]) -> str | None:
    if "value" in variable and variable["value"] is not None:
        return expand_references(variable["value"], env)
    source = variable.get("valueFrom") or {}
    if source.get("fieldRef"):
        return references.field_value(source["fieldRef"]["fieldPath"])
    if source.get("secretKeyRef"):
        ref = source["secretKeyRef"]
        items = references.secret_items(ref["name"], bool(ref.get("optional")))
        return _pick(items, ref, f"secret {references.namespace}/{ref['name']}")
    if source.get("configMapKeyRef"):
        ref = source["configMapKeyRef"]
        items = references.config_map_items(ref["name"], bool(ref.get("optional")))
        return _pick(items, ref, f"configmap {references.namespace}/{ref['name']}")
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
