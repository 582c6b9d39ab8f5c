"""The ``<cluster>-active`` Service's endpoints, written by the operator and fenced by the epoch.

The Service has no selector; its one EndpointSlice (``build_active_endpoint_slice``, below)
carries ``endpointslice.kubernetes.io/managed-by`` naming the operator, so kube-controller-manager
never writes it. The engine points it in the step that takes the leadership: after the new active
answered its activation, before the label, the status or the events. So traffic follows a failover
in one API write, not after the EndpointSlice controller, whose informer can lag for a minute
after an API server restart (docs/benchmarks.md, the 200-fault soak). The idea is Patroni's
``use_endpoints``, where the leader writes the primary Service's Endpoints itself.

The fence: the slice's epoch annotation. A write carries the active's epoch (or the cluster's,
when it points at nobody) and is refused if the slice already carries a higher one: an operator
of an older term (a stale leader, a delayed retry) never moves the Service back. The check and the
write are one compare-and-swap, through the ``resourceVersion`` precondition of the PUT. So the
check may be made against the slice as this operator last wrote it (:class:`KnownSlice`), with no
read first: if anyone wrote it since, the PUT's precondition fails, and the retry reads.

Converting a Service from the selector era (``role=active``): drop its selector, delete the
EndpointSlice controller's slices of it, then write ours. In between, the Service has no endpoint;
it never has two (ours would point at the new active while the controller's still followed the
label).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker_operator.controller import builders, names
from broker_operator.controller.kube import KubeApi
from broker_operator.engine import ServiceFenced

logger = logging.getLogger(__name__)

Manifest = dict[str, Any]

# Concurrent writers (two operators during a leader change) can make a PUT conflict; each retry
# re-reads and re-checks the fence, and the engine retries after an interval if all of them lose.
WRITE_ATTEMPTS = 3


@dataclass(frozen=True)
class ActiveEndpoint:
    """The broker the ``-active`` Service points at: the address it was activated at, its port."""

    pod: str
    address: str
    port: int = names.BROKER_PORT
    uid: str | None = None
    node: str | None = None


def build_active_endpoint_slice(
    owner: Mapping[str, Any], endpoint: ActiveEndpoint | None, epoch: int
) -> Manifest:
    """The ``-active`` Service's one EndpointSlice: the active broker, or no endpoint at all.

    ``managed-by`` names the operator, so the EndpointSlice controller leaves it alone; the epoch
    annotation is the fence a later write checks (``point_active_service``, below).
    """
    cluster = owner["metadata"]["name"]
    service = names.active_service_name(cluster)
    labels = {
        **names.cluster_labels(cluster),
        names.LABEL_SERVICE_NAME: service,
        names.LABEL_SLICE_MANAGED_BY: names.SLICE_MANAGER,
    }
    metadata = builders.owned_meta(owner, service, labels)
    metadata["annotations"] = {
        names.ANNOTATION_EPOCH: str(epoch),
        names.ANNOTATION_ACTIVE: endpoint.pod if endpoint is not None else "",
    }
    endpoints: list[Manifest] = []
    if endpoint is not None:
        entry: Manifest = {
            "addresses": [endpoint.address],
            "conditions": {"ready": True, "serving": True, "terminating": False},
        }
        if endpoint.uid is not None:
            entry["targetRef"] = {
                "kind": "Pod",
                "namespace": owner["metadata"]["namespace"],
                "name": endpoint.pod,
                "uid": endpoint.uid,
            }
        if endpoint.node is not None:
            entry["nodeName"] = endpoint.node
        endpoints.append(entry)
    ipv6 = endpoint is not None and ":" in endpoint.address
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": "IPv6" if ipv6 else "IPv4",
        "ports": [
            {
                "name": names.BROKER_PORT_NAME,
                "port": endpoint.port if endpoint is not None else names.BROKER_PORT,
                "protocol": "TCP",
            }
        ],
        "endpoints": endpoints,
    }


class ServiceWriteError(RuntimeError):
    """The slice changed under every attempt; the engine tries again after an interval."""


@dataclasses.dataclass
class KnownSlice:
    """The slice as an engine's last write or read left it: the next write's precondition, saving
    the read on the failover path. Stale is safe (the PUT fails and the write re-reads)."""

    body: dict[str, Any] | None = None


def slice_epoch(body: Mapping[str, Any]) -> int:
    """The epoch a slice was written under; -1 for one without the annotation (never ours)."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    try:
        return int(annotations.get(names.ANNOTATION_EPOCH, -1))
    except ValueError:
        return -1


def _same_content(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    def content(body: Mapping[str, Any]) -> tuple[object, ...]:
        metadata = body.get("metadata", {})
        return (
            body.get("endpoints") or [],
            body.get("ports"),
            body.get("addressType"),
            (metadata.get("annotations") or {}).get(names.ANNOTATION_EPOCH),
            (metadata.get("annotations") or {}).get(names.ANNOTATION_ACTIVE),
            (metadata.get("labels") or {}).get(names.LABEL_SLICE_MANAGED_BY),
        )

    return content(current) == content(wanted)


async def point_active_service(
    api: KubeApi,
    owner: Mapping[str, Any],
    endpoint: ActiveEndpoint | None,
    epoch: int,
    known: KnownSlice | None = None,
) -> bool:
    """Make the slice name ``endpoint`` (or nothing) under ``epoch``; True if this call wrote it.

    With ``known``, the first attempt checks and writes against ``known.body`` instead of a read,
    and ``known`` is left holding the slice as written or read. Raises :class:`ServiceFenced` if
    the slice carries a higher epoch, :class:`ServiceWriteError` if every compare-and-swap lost to
    a concurrent writer.
    """
    namespace = str(owner["metadata"]["namespace"])
    name = names.active_service_name(str(owner["metadata"]["name"]))
    wanted = build_active_endpoint_slice(owner, endpoint, epoch)
    known = known if known is not None else KnownSlice()
    for _ in range(WRITE_ATTEMPTS):
        current, known.body = known.body, None
        if current is None or _same_content(current, wanted):
            # "Nothing to write" is never taken from memory: the slice may have been deleted or
            # changed by hand since, and the watch asks for it to be written again.
            current = await api.read_endpoint_slice(namespace, name)
        if current is None:
            if await api.create(wanted):
                return True
            continue  # created meanwhile by another writer: read it and check its epoch
        stored = slice_epoch(current)
        if stored > epoch:
            raise ServiceFenced(f"EndpointSlice {name} was written under epoch {stored}, above {epoch}")
        if _same_content(current, wanted):
            known.body = current
            return False
        body = {
            **wanted,
            "metadata": {**wanted["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        known.body = await api.replace_endpoint_slice(namespace, name, body)
        if known.body is not None:
            return True
    raise ServiceWriteError(f"EndpointSlice {name} changed under each of {WRITE_ATTEMPTS} writes")


async def convert_selector_service(api: KubeApi, namespace: str, cluster: str) -> bool:
    """Take a ``-active`` Service of the selector era over: drop its selector and the Endpoints the
    endpoints controller left (it stops writing them, it does not delete them, and
    ``kubectl get endpoints`` would go on naming the old active). True if there was one to convert.
    The caller deletes the controller's slices next (:func:`delete_controller_slices`)."""
    name = names.active_service_name(cluster)
    service = await api.read_service(namespace, name)
    if service is None or not (service.get("spec") or {}).get("selector"):
        return False
    await api.remove_service_selector(namespace, name, service["metadata"]["resourceVersion"])
    await api.delete_endpoints(namespace, name)
    logger.info(
        "%s/%s: Service %s no longer selects pods; the operator writes its endpoints",
        namespace,
        cluster,
        name,
    )
    return True


async def delete_controller_slices(api: KubeApi, namespace: str, cluster: str) -> int:
    """Delete the EndpointSlice controller's slices of the ``-active`` Service; how many there were.

    It leaves them behind when the selector goes (it stops managing the Service, it does not clean
    up), and a controller whose informer lagged may still write one just after: either would keep
    naming a former active beside ours.
    """
    name = names.active_service_name(cluster)
    selector = f"{names.LABEL_SERVICE_NAME}={name},{names.LABEL_SLICE_MANAGED_BY}={names.SLICE_CONTROLLER}"
    stale = await api.list_endpoint_slices(namespace, selector)
    for body in stale:
        await api.delete_endpoint_slice(namespace, body["metadata"]["name"])
    return len(stale)
