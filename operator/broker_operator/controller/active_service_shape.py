"""The ``<cluster>-active`` Service's shape from ``spec.activeService``, and bringing the Service to it.

The Service is made with the template's shape (:func:`build_active_service`) and brought back
to it once per spec generation, at the operator's start, and when it was deleted (its watch makes
the reconcile forget it, and the next pass makes it again): :func:`ensure_active_service`,
:func:`apply_active_service`. A change by hand is put back at the next of those. The selector
stays absent whatever happens: the operator writes the Service's one EndpointSlice
(``active_service.py``), and a selector would let the EndpointSlice controller write a second one.

Type changes are made in place, by a merge patch of the fields the template owns: ``type``,
the one port, ``externalTrafficPolicy``, ``loadBalancerSourceRanges``, ``loadBalancerClass``.
The API server keeps what it allocated for fields the patch leaves out (the clusterIP; a node
port the template does not fix, while the type still needs one) and drops what the new type
cannot have and the patch did not set (node ports and the health-check node port when going
back to ClusterIP, LoadBalancer-only fields), so no read-modify-write of its allocations is
needed; the patch sends null for the template's fields the new type must not carry. One change
it refuses: ``loadBalancerClass`` of a LoadBalancer Service is immutable. That is reported, not
forced: deleting the Service would re-provision the load balancer under a new address, which SAP
is configured with, so that is left to a person (delete the Service; it comes back with the new
class).

Annotations and labels are shared with others: a cloud's load-balancer controller writes its
own, and fighting over them would make two controllers rewrite the Service forever. So the
operator writes only the keys the template lists (and its own labels), records which keys it set
in two annotations of its own (``broker.failover.dev/managed-annotations``, ``...-labels``), and
removes a recorded key once the template no longer lists it. Keys it never set are never
touched, and a key it set that someone else has changed is set back (it is the template's).

What it does not do: point the Service anywhere (the EndpointSlice is the engine's), or change
its port (the brokers' main port, TLS or not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import kopf
from kubernetes.client.exceptions import ApiException

from broker_operator.controller import names
from broker_operator.controller.active_service_spec import ActiveServiceSpec
from broker_operator.controller.builders import Manifest, cluster_labels, owned_meta
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.kube import KubeApi

if TYPE_CHECKING:  # reconcile imports this module
    from broker_operator.controller.reconcile import ClusterRef

# The template's spec fields besides type and ports; each is null (absent) unless the type takes it.
_OPTIONAL_FIELDS: Final = ("externalTrafficPolicy", "loadBalancerSourceRanges", "loadBalancerClass")
_DEFAULT_TRAFFIC_POLICY: Final = "Cluster"


def service_port(template: ActiveServiceSpec) -> Manifest:
    """The one port: the brokers' main port, with the template's node port when it fixes one."""
    port: Manifest = {
        "name": names.BROKER_PORT_NAME,
        "port": names.BROKER_PORT,
        "targetPort": names.BROKER_PORT_NAME,
        "protocol": "TCP",
    }
    if template.node_port is not None:
        port["nodePort"] = template.node_port
    return port


def service_spec(template: ActiveServiceSpec) -> Manifest:
    """The Service's spec under ``template``; no selector, ever."""
    spec: Manifest = {"type": template.type, "ports": [service_port(template)]}
    if template.external:
        # Spelled out, not left to the API server's default: a policy set by hand is set back.
        spec["externalTrafficPolicy"] = template.external_traffic_policy or _DEFAULT_TRAFFIC_POLICY
    if template.load_balancer and template.load_balancer_source_ranges is not None:
        spec["loadBalancerSourceRanges"] = list(template.load_balancer_source_ranges)
    if template.load_balancer and template.load_balancer_class is not None:
        spec["loadBalancerClass"] = template.load_balancer_class
    return spec


def _record(keys: Mapping[str, str]) -> str:
    return ",".join(sorted(keys))  # keys cannot hold a comma (label and annotation key syntax)


def _recorded(annotations: Mapping[str, str], record: str) -> set[str]:
    return {key for key in (annotations.get(record) or "").split(",") if key}


_RECORDS: Final = frozenset({names.ANNOTATION_MANAGED_ANNOTATIONS, names.ANNOTATION_MANAGED_LABELS})


def service_metadata(template: ActiveServiceSpec, own_labels: Mapping[str, str]) -> tuple[Manifest, Manifest]:
    """(labels, annotations) the operator sets: the template's, its own labels (which win, and
    which the CRD keeps the template from naming), and the record of the template's keys. A record
    of nothing is left out, so the default Service carries no annotation (and an operator upgrade
    finds the Services it made before in shape: no write)."""
    labels = {**template.labels, **own_labels}
    records = {
        names.ANNOTATION_MANAGED_ANNOTATIONS: _record(template.annotations),
        names.ANNOTATION_MANAGED_LABELS: _record(template.labels),
    }
    return labels, {**template.annotations, **{key: value for key, value in records.items() if value}}


def build_active_service(owner: Mapping[str, Any], template: ActiveServiceSpec | None = None) -> Manifest:
    """``<cluster>-active``: the backend's address, in the shape of ``spec.activeService``. No
    selector: the operator writes its EndpointSlice (``active_service.build_active_endpoint_slice``) in
    the step that activates a broker."""
    cluster = owner["metadata"]["name"]
    template = template or ActiveServiceSpec()
    labels, annotations = service_metadata(template, cluster_labels(cluster))
    metadata = owned_meta(owner, names.active_service_name(cluster), labels)
    metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": service_spec(template)}


def _map_patch(current: Mapping[str, str], wanted: Mapping[str, str], previously: set[str]) -> Manifest:
    """Set what differs, remove (null) what the operator set before and no longer wants."""
    patch: Manifest = {key: value for key, value in wanted.items() if current.get(key) != value}
    patch.update({key: None for key in previously - set(wanted) if key in current})
    return patch


def _port_shape(port: Mapping[str, Any], node_port: bool) -> tuple[object, ...]:
    return (
        port.get("name"),
        port.get("port"),
        str(port.get("targetPort", port.get("port"))),
        port.get("protocol") or "TCP",
        (port.get("nodePort") or None) if node_port else None,
    )


def _same_ports(current: object, wanted: list[Manifest], template: ActiveServiceSpec) -> bool:
    """The wanted port, with a node port only where the template fixes one; on ClusterIP, with none.
    An allocated node port of a NodePort or LoadBalancer Service is the API server's to keep."""
    if not isinstance(current, list) or len(current) != 1 or not isinstance(current[0], Mapping):
        return False
    if not template.external and current[0].get("nodePort"):
        return False
    check_node_port = template.node_port is not None
    return _port_shape(current[0], check_node_port) == _port_shape(wanted[0], check_node_port)


@dataclass(frozen=True)
class ShapePatch:
    """What brings a Service to the template: a merge patch (None: nothing to change), and what
    cannot be changed in place, in words."""

    patch: Manifest | None
    problem: str | None = None


def shape_patch(
    current: Mapping[str, Any], wanted: Mapping[str, Any], template: ActiveServiceSpec
) -> ShapePatch:
    """The merge patch from ``current`` (the Service as read) to ``wanted`` (as built from
    ``template``), touching only what the template owns."""
    current_meta = current.get("metadata") or {}
    current_annotations = current_meta.get("annotations") or {}
    wanted_meta = wanted["metadata"]
    metadata: Manifest = {}
    annotations = _map_patch(
        current_annotations,
        wanted_meta["annotations"],
        _recorded(current_annotations, names.ANNOTATION_MANAGED_ANNOTATIONS) | _RECORDS,
    )
    if annotations:
        metadata["annotations"] = annotations
    labels = _map_patch(
        current_meta.get("labels") or {},
        wanted_meta["labels"],
        _recorded(current_annotations, names.ANNOTATION_MANAGED_LABELS),
    )
    if labels:
        metadata["labels"] = labels

    current_spec = current.get("spec") or {}
    wanted_spec = wanted["spec"]
    spec: Manifest = {}
    if (current_spec.get("type") or "ClusterIP") != wanted_spec["type"]:
        spec["type"] = wanted_spec["type"]
    if not _same_ports(current_spec.get("ports"), wanted_spec["ports"], template):
        spec["ports"] = wanted_spec["ports"]
    for field in _OPTIONAL_FIELDS:
        if (current_spec.get(field) or None) != (wanted_spec.get(field) or None):
            spec[field] = wanted_spec.get(field)  # None: a merge patch removes the field
    problem = None
    class_changed = "loadBalancerClass" in spec
    if class_changed and current_spec.get("type") == wanted_spec["type"] == "LoadBalancer":
        del spec["loadBalancerClass"]
        name = current_meta.get("name")
        problem = (
            f"Service {name} has loadBalancerClass {current_spec.get('loadBalancerClass')!r} and "
            f"spec.activeService.loadBalancerClass is {wanted_spec.get('loadBalancerClass')!r}: the API "
            "server does not change the class of a LoadBalancer Service. Delete the Service to have it "
            "made again with the new class (a new load balancer, and a new address for SAP)"
        )
    patch: Manifest = {}
    if metadata:
        patch["metadata"] = metadata
    if spec:
        patch["spec"] = spec
    return ShapePatch(patch or None, problem)


@dataclass(frozen=True)
class ShapeResult:
    created: bool = False
    patched: Manifest | None = None  # the merge patch sent, if any
    problem: str | None = None


# The API server's answers that a Service cannot take the shape asked for (a node port in use, a
# key or value it does not take): reported, and the Service keeps its shape and its endpoints.
_REFUSED: Final = frozenset({400, 422})


async def apply_active_service(api: KubeApi, wanted: Manifest, template: ActiveServiceSpec) -> ShapeResult:
    """Create the Service as ``wanted``, or bring the existing one to its shape; a shape the API
    server refuses comes back as the result's ``problem``, any other error is raised."""
    try:
        return await _apply(api, wanted, template)
    except ApiException as error:
        if error.status not in _REFUSED:
            raise
        name = wanted["metadata"]["name"]
        problem = f"Service/{name} could not be brought to spec.activeService: the API server answered "
        problem += f"{error.status} {error.reason}" + (f": {error.body}" if error.body else "")
        return ShapeResult(problem=problem)


async def _apply(api: KubeApi, wanted: Manifest, template: ActiveServiceSpec) -> ShapeResult:
    namespace, name = wanted["metadata"]["namespace"], wanted["metadata"]["name"]
    current = await api.read_service(namespace, name)
    if current is None:
        if await api.create(wanted):
            return ShapeResult(created=True)
        current = await api.read_service(namespace, name)  # made meanwhile by another replica
        if current is None:
            return ShapeResult()  # and deleted again: the watch brings the next pass here
    found = shape_patch(current, wanted, template)
    if found.patch is not None:
        await api.patch_service(namespace, name, found.patch)
    return ShapeResult(patched=found.patch, problem=found.problem)


async def ensure_active_service(
    context: ControllerContext, ref: ClusterRef, template: ActiveServiceSpec
) -> None:
    """The reconcile's step: the Service in the template's shape, once per spec generation (and
    again after its deletion, which its watch makes the reconcile forget).

    A shape the API server refuses (a node port another Service holds, an annotation key it does
    not take) or cannot take in place (a LoadBalancer's class) is a Warning event
    ``ActiveServiceNotShaped``, once per message, and tried again on every pass; the Service keeps
    its former shape and keeps routing to the active.
    """
    observations = context.observations_for(ref.namespace, ref.name)
    key = f"Service/{names.active_service_name(ref.name)}"
    if key in observations.ensured:
        return
    owner = ref.kopf_body
    result = await apply_active_service(context.api, build_active_service(owner, template), template)
    if result.created:
        kopf.info(owner, reason="Created", message=f"created {key} ({template.type})")
    elif result.patched is not None:
        changed = ", ".join(sorted({*result.patched.get("spec", {}), *result.patched.get("metadata", {})}))
        kopf.info(owner, reason="Updated", message=f"brought {key} to spec.activeService: {changed}")
    if result.problem is None:
        observations.ensured.add(key)
        observations.reported.pop("ActiveServiceNotShaped", None)
    elif observations.first_report("ActiveServiceNotShaped", result.problem):
        kopf.warn(owner, reason="ActiveServiceNotShaped", message=result.problem)
