"""``spec.activeService``: the shape of the ``<name>-active`` Service, read into a frozen template.

The Service is the backend's (SAP's) address. Where SAP runs outside the cluster it needs a
NodePort or a LoadBalancer (with the cloud's annotations, source ranges, a traffic policy); so the
shape is the user's, within the few fields that make sense for a Service without a selector whose
one EndpointSlice the operator writes (``active_service.py``). Ports are not among them: the
Service keeps the brokers' one main port, TLS or not.

The second line behind the CRD's CEL rules, as ``spec.py`` and ``tls_spec.py``: the same defaults
(``core/spec_fields.py``) and the same rules with the same messages, worded once below.

What it does not do: build or write the Service (``active_service_shape.py``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from broker_operator.controller import names
from broker_operator.core import spec_fields as fields

METADATA_ENTRIES_MAX: Final = 64
SOURCE_RANGES_MAX: Final = 64
# Keys the template may not set: the operator's own. Its watches select its children by these
# labels, and it records what it manages in annotations under its group.
RESERVED_LABELS: Final = (names.LABEL_APP, names.LABEL_MANAGED_BY)
RESERVED_PREFIX: Final = f"{names.GROUP}/"

ANNOTATIONS_RESERVED_MESSAGE: Final = (
    f"spec.activeService.annotations may not use keys under {RESERVED_PREFIX}: the operator keeps its "
    "own there"
)
LABELS_RESERVED_MESSAGE: Final = (
    f"spec.activeService.labels may not set {RESERVED_LABELS[0]}, {RESERVED_LABELS[1]} or keys under "
    f"{RESERVED_PREFIX}: the operator selects its Services by them"
)


def load_balancer_only_message(field_name: str, service_type: str) -> str:
    return (
        f"spec.activeService.{field_name} applies to type LoadBalancer only, and spec.activeService.type "
        f"is {service_type}: remove it, or set type LoadBalancer"
    )


def external_only_message(field_name: str) -> str:
    return (
        f"spec.activeService.{field_name} applies to types NodePort and LoadBalancer only, and "
        "spec.activeService.type is ClusterIP: remove it, or set type NodePort or LoadBalancer"
    )


def source_range_message(value: str) -> str:
    return (
        f"spec.activeService.loadBalancerSourceRanges[] ({value}) is not a CIDR such as 203.0.113.0/24 "
        "or 2001:db8::/32"
    )


@dataclass(frozen=True)
class ActiveServiceSpec:
    """The ``-active`` Service's template. None: not set (the API server's default, or nothing)."""

    type: str = fields.ACTIVE_SERVICE_TYPE.default
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    load_balancer_source_ranges: tuple[str, ...] | None = None
    external_traffic_policy: str | None = None
    node_port: int | None = None
    load_balancer_class: str | None = None

    @property
    def external(self) -> bool:
        """Reachable from outside the cluster (NodePort or LoadBalancer)."""
        return self.type != fields.ACTIVE_SERVICE_CLUSTER_IP

    @property
    def load_balancer(self) -> bool:
        return self.type == fields.ACTIVE_SERVICE_LOAD_BALANCER


def parse_active_service(raw: Mapping[str, Any], problems: list[str]) -> ActiveServiceSpec:
    """``spec.activeService`` (``{}`` when absent) defaulted and checked as the CRD does."""
    service_type = fields.ACTIVE_SERVICE_TYPE.read(raw, problems)
    load_balancer = service_type == fields.ACTIVE_SERVICE_LOAD_BALANCER
    external = service_type != fields.ACTIVE_SERVICE_CLUSTER_IP

    ranges = _source_ranges(raw.get("loadBalancerSourceRanges"), problems)
    if ranges is not None and not load_balancer:
        problems.append(load_balancer_only_message("loadBalancerSourceRanges", service_type))
    policy = fields.EXTERNAL_TRAFFIC_POLICY.read(raw, problems)
    if policy is not None and not external:
        problems.append(external_only_message("externalTrafficPolicy"))
    node_port = fields.NODE_PORT.read(raw, problems) if raw.get("nodePort") is not None else None
    if node_port is not None and not external:
        problems.append(external_only_message("nodePort"))
    load_balancer_class = raw.get("loadBalancerClass")
    if load_balancer_class is not None:
        if not isinstance(load_balancer_class, str) or not load_balancer_class:
            problems.append(
                "spec.activeService.loadBalancerClass must be a non-empty string, "
                f"got {load_balancer_class!r}"
            )
            load_balancer_class = None
        elif not load_balancer:
            problems.append(load_balancer_only_message("loadBalancerClass", service_type))
    annotations = _string_map(raw.get("annotations"), "annotations", problems)
    if any(key.startswith(RESERVED_PREFIX) for key in annotations):
        problems.append(ANNOTATIONS_RESERVED_MESSAGE)
    labels = _string_map(raw.get("labels"), "labels", problems)
    if any(key in RESERVED_LABELS or key.startswith(RESERVED_PREFIX) for key in labels):
        problems.append(LABELS_RESERVED_MESSAGE)
    return ActiveServiceSpec(
        type=service_type,
        annotations=annotations,
        labels=labels,
        load_balancer_source_ranges=ranges,
        external_traffic_policy=policy,
        node_port=node_port,
        load_balancer_class=load_balancer_class,
    )


def is_cidr(value: object) -> bool:
    """CEL's ``isCIDR``: an address, a slash and a prefix length (host bits may be set)."""
    if not isinstance(value, str) or "/" not in value:
        return False
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def _source_ranges(raw: object, problems: list[str]) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) > SOURCE_RANGES_MAX:
        problems.append(
            "spec.activeService.loadBalancerSourceRanges must be a list of at most "
            f"{SOURCE_RANGES_MAX} CIDRs, got {raw!r}"
        )
        return None
    for value in raw:
        if not is_cidr(value):
            problems.append(source_range_message(str(value)))
    return tuple(str(value) for value in raw if is_cidr(value))


def _string_map(raw: object, field_name: str, problems: list[str]) -> dict[str, str]:
    """``spec.activeService.<field_name>`` as a plain dict; the API server checks each key and value
    when the operator writes the Service (its refusal becomes a Warning event)."""
    if raw is None:
        return {}
    if (
        not isinstance(raw, Mapping)
        or len(raw) > METADATA_ENTRIES_MAX
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items())
    ):
        problems.append(
            f"spec.activeService.{field_name} must map at most {METADATA_ENTRIES_MAX} keys to strings, "
            f"got {raw!r}"
        )
        return {}
    return {str(k): str(v) for k, v in raw.items()}
