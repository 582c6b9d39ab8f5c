"""Prometheus's Kubernetes service discovery (roles ``pod`` and ``endpoints``), as file_sd target files.

Debian's ``prometheus`` package is built without Kubernetes discovery (Debian removed it for the
dependencies of Kubernetes' client library; its NEWS.Debian, 1.5.0+ds-1), so the local cluster's
Prometheus cannot be given ``kubernetes_sd_configs``. This program stands in for it: beside
Prometheus in its pod, it lists the objects of a namespace through the API server every second and
writes, for each scrape job, a ``file_sd`` file whose targets carry the ``__meta_kubernetes_*``
labels Prometheus's own discovery gives them (https://prometheus.io/docs/prometheus/latest/
configuration/configuration/#kubernetes_sd_config). The jobs' ``relabel_configs`` (the chart's
monitors', :mod:`local_cluster.prometheus_config`) then apply to them unchanged.

Standalone on purpose: it runs as ``python3.11 kubernetes_sd.py JOBS_FILE`` in the operator's
image (Python, no local_cluster), mounted from a ConfigMap, with the pod's service account token;
the standard library only. ``JOBS_FILE`` is a JSON list of ``{"file", "role", "namespaces"}``.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import sys
import time
import urllib.request
from typing import Any

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
Target = dict[str, Any]


def sanitized(name: str) -> str:
    """A label name as Prometheus's discovery spells it (``strutil.SanitizeLabelName``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def object_labels(prefix: str, metadata: dict[str, Any]) -> dict[str, str]:
    """``<prefix>_label_<name>``, ``<prefix>_labelpresent_<name>`` and the same for annotations."""
    labels: dict[str, str] = {}
    for kind, items in (("label", metadata.get("labels")), ("annotation", metadata.get("annotations"))):
        for key, value in (items or {}).items():
            labels[f"{prefix}_{kind}_{sanitized(key)}"] = str(value)
            labels[f"{prefix}_{kind}present_{sanitized(key)}"] = "true"
    return labels


def pod_labels(pod: dict[str, Any]) -> dict[str, str]:
    """The ``__meta_kubernetes_pod_*`` labels of a pod, its containers' aside."""
    metadata, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
    labels = {
        "__meta_kubernetes_namespace": metadata["namespace"],
        "__meta_kubernetes_pod_name": metadata["name"],
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_ready": "true" if ready else "false",
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_uid": metadata.get("uid", ""),
        **object_labels("__meta_kubernetes_pod", metadata),
    }
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("controller"):
            labels["__meta_kubernetes_pod_controller_kind"] = owner["kind"]
            labels["__meta_kubernetes_pod_controller_name"] = owner["name"]
    return labels


def container_labels(container: dict[str, Any], port: dict[str, Any] | None, init: bool) -> dict[str, str]:
    labels = {
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_image": container.get("image", ""),
        "__meta_kubernetes_pod_container_init": "true" if init else "false",
    }
    if port is not None:
        labels["__meta_kubernetes_pod_container_port_name"] = port.get("name", "")
        labels["__meta_kubernetes_pod_container_port_number"] = str(port["containerPort"])
        labels["__meta_kubernetes_pod_container_port_protocol"] = port.get("protocol", "TCP")
    return labels


def pod_targets(pod: dict[str, Any]) -> list[Target]:
    """Role ``pod``: a target per container port at the pod's IP, and one per container without
    ports (the IP alone); none for a pod with no IP yet."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return []
    common = pod_labels(pod)
    spec = pod.get("spec") or {}
    targets = []
    for init, containers in ((False, spec.get("containers")), (True, spec.get("initContainers"))):
        for container in containers or []:
            ports = container.get("ports") or []
            for port in ports or [None]:
                address = ip if port is None else f"{ip}:{port['containerPort']}"
                labels = {**common, **container_labels(container, port, init)}
                targets.append({"targets": [address], "labels": labels})
    return targets


def endpoints_targets(
    endpoints: dict[str, Any], services: dict[str, dict[str, Any]], pods: dict[str, dict[str, Any]]
) -> list[Target]:
    """Role ``endpoints``: a target per address and port of an Endpoints object (ready or not), with
    its Service's labels and, for a pod's address, the pod's and the container's that has the port."""
    metadata = endpoints["metadata"]
    common = {
        "__meta_kubernetes_namespace": metadata["namespace"],
        "__meta_kubernetes_endpoints_name": metadata["name"],
        **object_labels("__meta_kubernetes_endpoints", metadata),
    }
    service = services.get(metadata["name"])
    if service is not None:
        common["__meta_kubernetes_service_name"] = service["metadata"]["name"]
        common.update(object_labels("__meta_kubernetes_service", service["metadata"]))
    targets = []
    for subset in endpoints.get("subsets") or []:
        for ready, addresses in (
            ("true", subset.get("addresses")),
            ("false", subset.get("notReadyAddresses")),
        ):
            for address in addresses or []:
                for port in subset.get("ports") or []:
                    labels = {
                        **common,
                        "__meta_kubernetes_endpoint_ready": ready,
                        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                        "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
                    }
                    if "hostname" in address:
                        labels["__meta_kubernetes_endpoint_hostname"] = address["hostname"]
                    if "nodeName" in address:
                        labels["__meta_kubernetes_endpoint_node_name"] = address["nodeName"]
                    target_ref = address.get("targetRef") or {}
                    if target_ref:
                        labels["__meta_kubernetes_endpoint_address_target_kind"] = target_ref.get("kind", "")
                        labels["__meta_kubernetes_endpoint_address_target_name"] = target_ref.get("name", "")
                    pod = pods.get(target_ref.get("name", "")) if target_ref.get("kind") == "Pod" else None
                    if pod is not None:
                        labels.update(pod_labels(pod))
                        for container in (pod.get("spec") or {}).get("containers") or []:
                            for container_port in container.get("ports") or []:
                                if container_port["containerPort"] == port["port"]:
                                    labels.update(container_labels(container, container_port, False))
                    targets.append({"targets": [f"{address['ip']}:{port['port']}"], "labels": labels})
    return targets


def discover(role: str, listed: dict[str, list[dict[str, Any]]]) -> list[Target]:
    """The targets of ``role`` among ``listed`` objects (``pods``, ``services``, ``endpoints``)."""
    if role == "pod":
        return [target for pod in listed["pods"] for target in pod_targets(pod)]
    if role == "endpoints":
        services = {item["metadata"]["name"]: item for item in listed["services"]}
        pods = {item["metadata"]["name"]: item for item in listed["pods"]}
        return [target for item in listed["endpoints"] for target in endpoints_targets(item, services, pods)]
    raise ValueError(f"role {role!r}: only pod and endpoints are emulated")


class ApiServer:
    """The API server as a pod reaches it: ``kubernetes.default.svc`` environment, the account's
    token and CA (read anew each time: the kubelet rotates the token)."""

    def __init__(self) -> None:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        self.base = f"https://[{host}]" if ":" in host else f"https://{host}"
        self.base += f":{os.environ['KUBERNETES_SERVICE_PORT']}"
        self.context = ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")

    def items(self, namespace: str, resource: str) -> list[dict[str, Any]]:
        with open(f"{ACCOUNT}/token", encoding="utf-8") as file:
            token = file.read().strip()
        request = urllib.request.Request(
            f"{self.base}/api/v1/namespaces/{namespace}/{resource}",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=10, context=self.context) as reply:
            items: list[dict[str, Any]] = json.load(reply)["items"]
        for item in items:
            item["metadata"].setdefault("namespace", namespace)
        return items


def write_atomically(path: str, targets: list[Target]) -> None:
    """Prometheus reads the file on change: it must never see half of one."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as file:
        json.dump(targets, file, sort_keys=True)
    os.replace(partial, path)


def main(argv: list[str]) -> None:
    with open(argv[1], encoding="utf-8") as file:
        jobs: list[dict[str, Any]] = json.load(file)
    api = ApiServer()
    while True:
        try:
            for job in jobs:
                targets = []
                for namespace in job["namespaces"]:
                    listed = {kind: api.items(namespace, kind) for kind in ("pods", "services", "endpoints")}
                    targets += discover(job["role"], listed)
                write_atomically(job["file"], targets)
        except (OSError, ValueError, KeyError) as error:  # the API server away a moment: next round
            print(f"kubernetes_sd: {error!r}", file=sys.stderr, flush=True)
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv)
