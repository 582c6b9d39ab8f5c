"""Typed views of the Kubernetes bodies the controller reads: the BrokerCluster and its pods.

kopf hands bodies over as mappings; these ``TypedDict``s name the fields the
controller actually reads (down to those and no further), so that mypy catches
a misspelt ``unavailabilityCode`` instead of a failover silently reading None.
They mirror ``crds/broker.failover.dev_brokerclusters.yaml``; the CRD is the
authority. Nothing here validates: see ``spec.py`` for that. Objects the
controller writes are built by ``builders.py`` as plain dicts in the shape the
API server expects.
"""

from __future__ import annotations

from typing import TypedDict


class SecretKeyRef(TypedDict, total=False):
    name: str
    key: str


class EndpointEntry(TypedDict):
    name: str
    url: str
    priority: int


class ConnectionSpec(TypedDict, total=False):
    url: str
    urlSecretRef: SecretKeyRef


class AuthSpec(TypedDict, total=False):
    tokenSecretRef: SecretKeyRef
    backendTokenSecretRef: SecretKeyRef


class StorageSpec(TypedDict, total=False):
    size: str
    storageClassName: str


class HeartbeatSpec(TypedDict, total=False):
    intervalSeconds: int
    timeoutSeconds: int
    failureThreshold: int
    leaseSeconds: int
    standbyProbeSeconds: int


class DeliverySpec(TypedDict, total=False):
    maxDeliveries: int
    onPoison: str


class MessageLogSpec(TypedDict, total=False):
    claimName: str
    mountPath: str
    schedule: str


class ResourceRequirements(TypedDict, total=False):
    requests: dict[str, str | int]
    limits: dict[str, str | int]


class BrokerClusterSpec(TypedDict, total=False):
    account: str
    company: str
    replicas: int
    endpoints: list[EndpointEntry]
    image: str
    imagePullPolicy: str
    resources: ResourceRequirements
    storage: StorageSpec
    backend: ConnectionSpec
    cloud: ConnectionSpec
    auth: AuthSpec
    heartbeat: HeartbeatSpec
    failback: str
    failbackStableSeconds: int
    preferredActive: str
    delivery: DeliverySpec
    messageLog: MessageLogSpec


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
    spec: BrokerClusterSpec
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


class PodBody(TypedDict, total=False):
    metadata: ObjectMeta
    status: PodStatus
