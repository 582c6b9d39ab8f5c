"""Typed views of the Kubernetes bodies the controller reads: the BrokerCluster, its pods and claims.

kopf hands bodies over as mappings; these ``TypedDict``s name the fields the
controller actually reads (down to those and no further), so that mypy catches
a misspelt ``unavailabilityCode`` instead of a failover silently reading None.
Each is used by the modules that read that body (``tests/unit/controller/
test_crd.py`` checks that none is declared for nothing, and that the status
fields are the CRD's). The spec is not restated here: ``spec.parse_spec``
reads it into ``ClusterSpec``, its one typed view, with the CRD's defaults and
bounds from ``core/spec_fields.py``. Nothing here validates. Objects the
controller writes are built by ``builders.py`` as plain dicts in the shape the
API server expects.
"""

from __future__ import annotations

from typing import Any, TypedDict


class OwnerReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool
    blockOwnerDeletion: bool


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[OwnerReference]


class BrokerClusterStatus(TypedDict, total=False):
    phase: str
    active: str | None
    epoch: int
    failovers: int
    conflictsWith: str


class BrokerClusterBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]  # read only through spec.parse_spec, into its typed view ClusterSpec
    status: BrokerClusterStatus


class ContainerStateTerminated(TypedDict, total=False):
    exitCode: int
    reason: str


class ContainerState(TypedDict, total=False):
    running: dict[str, object]
    waiting: dict[str, object]
    terminated: ContainerStateTerminated


class ContainerStatus(TypedDict, total=False):
    name: str
    ready: bool
    restartCount: int
    state: ContainerState
    lastState: ContainerState


class PodCondition(TypedDict, total=False):
    type: str
    status: str


class PodStatus(TypedDict, total=False):
    phase: str
    podIP: str
    conditions: list[PodCondition]
    containerStatuses: list[ContainerStatus]


class ContainerPort(TypedDict, total=False):
    name: str
    containerPort: int


class EnvVar(TypedDict, total=False):
    name: str
    value: str


class Container(TypedDict, total=False):
    name: str
    ports: list[ContainerPort]
    env: list[EnvVar]  # read for BROKER_TLS_DIR (observed.serves_tls)


class PodSpec(TypedDict, total=False):
    containers: list[Container]
    nodeName: str
    hostname: str  # with subdomain: the pod's DNS name, which its certificate carries
    subdomain: str


class PodBody(TypedDict, total=False):
    metadata: ObjectMeta
    spec: PodSpec  # read for the broker's ports (observed) and node (the -active EndpointSlice)
    status: PodStatus


class ClaimResources(TypedDict, total=False):
    requests: dict[str, str]


class ClaimSpec(TypedDict, total=False):
    resources: ClaimResources
    storageClassName: str


class ClaimCondition(TypedDict, total=False):
    type: str  # Resizing, FileSystemResizePending, ControllerResizeError, NodeResizeError
    status: str


class ClaimStatus(TypedDict, total=False):
    phase: str
    capacity: dict[str, str]
    conditions: list[ClaimCondition]
    allocatedResourceStatuses: dict[str, str]  # e.g. storage: ControllerResizeInfeasible


class ClaimBody(TypedDict, total=False):
    """A journal PersistentVolumeClaim, down to what the retention policy (``claims.py``) and the
    volume growth (``claim_sizes.py``) read."""

    metadata: ObjectMeta
    spec: ClaimSpec
    status: ClaimStatus
