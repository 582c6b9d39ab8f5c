"""What a pod's volumes and environment refer to, read from the API server as the kubelet reads it.

Secrets and ConfigMaps (with ``items`` selecting keys), downward-API ``fieldPath`` values, and
service-account tokens from the real TokenRequest API (bound to the pod, so RBAC applies to
it). A reference that cannot be resolved raises ``ContainerConfigError``: the container waits
in CreateContainerConfigError, as on a real node.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

Body = dict[str, Any]  # a Kubernetes object as the API server's JSON


class ContainerConfigError(RuntimeError):
    """A referenced Secret/ConfigMap/key is missing: the kubelet's CreateContainerConfigError."""

    reason = "CreateContainerConfigError"  # the container's waiting reason while this lasts


class VolumeNotReadyError(ContainerConfigError):
    """A claim is missing, being deleted or not bound yet: the pod waits in ContainerCreating."""

    reason = "ContainerCreating"


def _decode_secret(secret: Any) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}


def _config_map_items(config_map: Any) -> dict[str, bytes]:
    items = {key: value.encode() for key, value in (config_map.data or {}).items()}
    items.update({key: base64.b64decode(value) for key, value in (config_map.binary_data or {}).items()})
    return items


def select_items(items: dict[str, bytes], selection: list[Body] | None, volume: str) -> dict[str, bytes]:
    """A volume's files: every key under its own name, or only the ``items`` listed, at their paths."""
    chosen = {item["key"]: item["path"] for item in selection} if selection else {key: key for key in items}
    files = {}
    for key, relative in chosen.items():
        if key not in items:
            raise ContainerConfigError(f"key {key!r} not found for a volume item in {volume}")
        files[relative] = items[key]
    return files


class PodReferences:
    """Resolves one pod's references to API objects and to its own fields."""

    def __init__(self, pod: Body, *, core: client.CoreV1Api, pod_ip: str, host_ip: str) -> None:
        self.pod = pod
        self.core = core
        self.pod_ip = pod_ip
        self.host_ip = host_ip
        self.namespace: str = pod["metadata"]["namespace"]

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

    def downward_api(self, items: list[Body]) -> dict[str, bytes]:
        """The files of a downwardAPI volume (or projected source): path to field value."""
        return {
            item["path"]: self.field_value(item["fieldRef"]["fieldPath"]).encode()
            for item in items
            if item.get("fieldRef")
        }

    def secret_items(self, name: str, optional: bool) -> dict[str, bytes] | None:
        """The Secret's keys and decoded values; None if it is missing and ``optional``."""
        try:
            return _decode_secret(self.core.read_namespaced_secret(name, self.namespace))
        except ApiException as error:
            if error.status == 404 and optional:
                return None
            raise ContainerConfigError(
                f"secret {self.namespace}/{name} not readable: {error.reason}"
            ) from error

    def config_map_items(self, name: str, optional: bool) -> dict[str, bytes] | None:
        """The ConfigMap's keys (data and binaryData); None if it is missing and ``optional``."""
        try:
            return _config_map_items(self.core.read_namespaced_config_map(name, self.namespace))
        except ApiException as error:
            if error.status == 404 and optional:
                return None
            raise ContainerConfigError(
                f"configmap {self.namespace}/{name} not readable: {error.reason}"
            ) from error

    def service_account_token(self, expiration_seconds: int, audience: str | None) -> bytes:
        """A token for the pod's service account from TokenRequest, bound to this pod."""
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
