"""Builders of the objects a BrokerCluster owns: broker pods, journal PVCs, the headless Service
and the ``-active`` PodDisruptionBudget (the ``-active`` Service is ``active_service_shape.py``'s,
its EndpointSlice ``active_service.py``'s, the NetworkPolicy ``network_policy.py``'s, the token and
verifier Secrets ``verifiers.py``'s).

Pure functions from (cluster name, ``ClusterSpec``) to the dicts the API server
takes, so every field can be unit-tested without Kubernetes. Pods are built
directly rather than through a StatefulSet so that the operator, not a
controller it cannot steer, decides when each pod is replaced (standbys first,
the active last, after a switchover; see ``rollout.py``).

Broker pods run as the chart's own pods do (its operator Deployment and validator
CronJob): as user and group 10001, the broker image's user, never root, with a
read-only root filesystem, no privilege escalation, no capabilities and the
runtime's default seccomp profile, so they pass the "restricted" Pod Security
Standard. ``fsGroup`` 10001 makes the journal claim and the message-log claim the
broker's on storage whose driver applies it (an NFS store must be writable by
10001 itself: charts/README.md). The broker writes to those two volumes
only (the journal, the stored epoch, the segments), so there is no /tmp volume:
a writable path it does not need would only hide a stray write.
``spec.podSecurityContext`` and ``spec.securityContext`` replace these defaults
whole (docs/crd.md), for platforms that assign their own user ids.

TLS (``spec.tls``) comes from ``broker_tls.py``: the mounted certificates, ``BROKER_TLS_DIR``
and HTTPS probes. Whether pods serve it is the caller's ``serve_tls`` as well as the spec's mode:
``ControllerSettings.broker_tls``, on by default, is the install-wide opt-out (with it off, a
broker serving TLS would refuse the operator's plain-HTTP heartbeats, so none does). The upstream
CA bundle (the brokers' trust as clients) does not depend on it.

Where pods run is ``placement.py``'s (the default spread over hosts and zones, the spec's scheduling
fields); the pod's image, pull secrets, ServiceAccount, labels, annotations and default requests are
``pod_fields.py``'s, from the spec and the operator's ``PodDefaults``.

Every builder stamps the owner reference itself (``kopf.build_owner_reference``)
so that deleting the BrokerCluster garbage-collects its children. Nothing here
creates, patches or reads anything.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final, cast

import kopf

from broker_contracts import environment
from broker_contracts.logs import DEFAULT_LOG_SETTINGS, LogSettings
from broker_operator.controller import broker_tls, names, placement
from broker_operator.controller.bodies import OwnerReference
from broker_operator.controller.names import cluster_labels
from broker_operator.controller.pod_fields import (
    BUILT_IN_DEFAULTS,
    PodDefaults,
    broker_image,
    container_resources,
    given_pod_fields,
    pod_annotations,
    pod_identity,
    pod_labels,
)
from broker_operator.controller.spec import ClusterSpec, Connection

Manifest = dict[str, Any]

# The broker image's user and group (broker_image/Dockerfile: USER 10001:10001); the validator
# runs as the same ids, so both read and write the shared message-log store.
BROKER_UID: Final = 10001
DEFAULT_POD_SECURITY_CONTEXT: Final[Mapping[str, Any]] = {
    "runAsNonRoot": True,
    "runAsUser": BROKER_UID,
    "runAsGroup": BROKER_UID,
    "fsGroup": BROKER_UID,
    # The message-log store is shared and holds many segments: re-own it recursively only when its
    # root is not the group's yet, not on every pod start (as the chart's validator does).
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
DEFAULT_CONTAINER_SECURITY_CONTEXT: Final[Mapping[str, Any]] = {
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def owned_meta(owner: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> Manifest:
    return {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "labels": dict(labels),
        "ownerReferences": [dict(kopf.build_owner_reference(owner))],  # type: ignore[arg-type]
    }


def _connection_env(variable: str, connection: Connection) -> list[Manifest]:
    if connection.url_secret is not None:
        ref = {"name": connection.url_secret.name, "key": connection.url_secret.key}
        return [{"name": variable, "valueFrom": {"secretKeyRef": ref}}]
    if connection.url is not None:
        return [{"name": variable, "value": connection.url}]
    return []


def _credential_mounts(spec: ClusterSpec) -> list[tuple[str, str, str, Connection]]:
    """(env variable, mount path, volume, connection) for each target given a credentials Secret.

    The whole Secret is mounted (no ``items``): the broker takes ``token`` or ``username`` and
    ``password``, whichever it holds. Only targets that name one get a volume, so the pods of a
    cluster without them (and their template hash) are as before.
    """
    given = (
        (
            environment.BROKER_BACKEND_CREDENTIALS_DIR,
            names.BACKEND_CREDENTIALS_MOUNT,
            names.BACKEND_CREDENTIALS_VOLUME,
            spec.backend,
        ),
        (
            environment.BROKER_CLOUD_CREDENTIALS_DIR,
            names.CLOUD_CREDENTIALS_MOUNT,
            names.CLOUD_CREDENTIALS_VOLUME,
            spec.cloud,
        ),
    )
    return [entry for entry in given if entry[3].credentials_secret]


def pod_security_context(spec: ClusterSpec) -> Manifest:
    """The broker pod's securityContext: ``spec.podSecurityContext`` if given, else the default."""
    given = spec.pod_security_context
    return copy.deepcopy(dict(DEFAULT_POD_SECURITY_CONTEXT if given is None else given))


def container_security_context(spec: ClusterSpec) -> Manifest:
    """The broker container's securityContext: ``spec.securityContext`` if given, else the default."""
    given = spec.container_security_context
    return copy.deepcopy(dict(DEFAULT_CONTAINER_SECURITY_CONTEXT if given is None else given))


def serves_tls(spec: ClusterSpec, serve_tls: bool) -> bool:
    """Whether the brokers serve TLS: the spec's mode is not Disabled, and the operator is ready to
    call them over TLS (``serve_tls``; see the module's docstring)."""
    return serve_tls and spec.tls.enabled


def broker_container(
    cluster: str, spec: ClusterSpec, *, serve_tls: bool = False, defaults: PodDefaults = BUILT_IN_DEFAULTS
) -> Manifest:
    """The broker container, configured through the broker CLI's environment variables."""
    serving = serves_tls(spec, serve_tls)
    env: list[Manifest] = [
        # The broker listens on its pod IP; the operator heartbeats exactly that address.
        {"name": environment.BROKER_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": environment.BROKER_PORT, "value": str(names.BROKER_PORT)},
        # Heartbeat and the admin operations on a port of their own, so the NetworkPolicy can
        # admit them from the operator only (see build_network_policy).
        {"name": environment.BROKER_ADMIN_PORT, "value": str(names.BROKER_ADMIN_PORT)},
        {"name": environment.BROKER_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": environment.BROKER_CLUSTER, "value": cluster},
        {"name": environment.BROKER_ACCOUNT, "value": spec.account},
        {"name": environment.BROKER_COMPANY, "value": spec.company},
        {"name": environment.BROKER_DATA_DIR, "value": names.DATA_MOUNT},
        {"name": environment.BROKER_MESSAGE_LOG_DIR, "value": spec.message_log_mount},
        # The tokens' verifiers, never the tokens (verifiers.py): a broker cannot call its peers.
        {
            "name": environment.BROKER_TOKEN_VERIFIER_FILE,
            "value": f"{names.TOKEN_MOUNT}/{names.OPERATOR_VERIFIER_KEY}",
        },
        {
            "name": environment.BROKER_BACKEND_TOKEN_VERIFIER_FILE,
            "value": f"{names.TOKEN_MOUNT}/{names.BACKEND_VERIFIER_KEY}",
        },
        # "5", not "5.0" (the value is part of the template hash), and every digit of a decimal
        # lease such as 2.5 (":g" would keep six).
        {"name": environment.BROKER_LEASE_SECONDS, "value": f"{spec.heartbeat.lease_seconds:.17g}"},
        # The cap of a handover renewal's lease: what a successor waits out (core/handover.py).
        {
            "name": environment.BROKER_MAX_LEASE_SECONDS,
            "value": f"{spec.heartbeat.granted_handover_seconds:.17g}",
        },
        {"name": environment.BROKER_MAX_DELIVERIES, "value": str(spec.max_deliveries)},
        {"name": environment.BROKER_ON_POISON, "value": spec.on_poison},
        *_connection_env(environment.BROKER_BACKEND_URL, spec.backend),
        *_connection_env(environment.BROKER_CLOUD_URL, spec.cloud),
        *(
            {"name": variable, "value": mount}
            for variable, mount, _volume, _connection in _credential_mounts(spec)
        ),
        *broker_tls.tls_env(spec.tls, serving=serving),
    ]
    probe_port = names.BROKER_PORT_NAME
    scheme = broker_tls.probe_scheme(serving=serving)
    return {
        "name": names.BROKER_CONTAINER,
        "image": broker_image(spec, defaults),
        "imagePullPolicy": spec.image_pull_policy,
        "env": env,
        "ports": [
            {"name": names.BROKER_PORT_NAME, "containerPort": names.BROKER_PORT, "protocol": "TCP"},
            # The operator finds this port by its name on each pod (observed.admin_port).
            {
                "name": names.BROKER_ADMIN_PORT_NAME,
                "containerPort": names.BROKER_ADMIN_PORT,
                "protocol": "TCP",
            },
        ],
        # Probes stay on the main port: the kubelet is not the operator. Over TLS they use HTTPS
        # and verify nothing (broker_tls.py says why that is fine).
        # /readyz is "process up and journal open", independent of Active: a standby is ready.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": probe_port, **scheme},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": probe_port, **scheme},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "resources": container_resources(spec),
        "securityContext": container_security_context(spec),
        "volumeMounts": [
            {"name": names.JOURNAL_VOLUME, "mountPath": names.DATA_MOUNT},
            {"name": names.VERIFIER_VOLUME, "mountPath": names.TOKEN_MOUNT, "readOnly": True},
            # Only this cluster's part of the shared store (issue 39): every cluster's brokers and
            # the validator share one claim and one uid, so the mount is the boundary. The broker
            # writes <message_log_mount>/<cluster>/<broker>/, inside this mount, and sees neither
            # other clusters' segments nor the validator's checkpoint and reports (.validator/).
            # The kubelet makes the directory with the claim root's mode and group.
            {
                "name": names.MESSAGE_LOG_VOLUME,
                "mountPath": f"{spec.message_log_mount.rstrip('/')}/{cluster}",
                "subPath": cluster,
            },
            *(
                {"name": volume, "mountPath": mount, "readOnly": True}
                for _variable, mount, volume, _connection in _credential_mounts(spec)
            ),
            *broker_tls.tls_mounts(spec.tls, serving=serving),
        ],
    }


def pod_volumes(cluster: str, ordinal: int, spec: ClusterSpec, *, serve_tls: bool = False) -> list[Manifest]:
    verifier_keys = (names.OPERATOR_VERIFIER_KEY, names.BACKEND_VERIFIER_KEY)
    message_log: Manifest = (
        {"persistentVolumeClaim": {"claimName": spec.message_log_claim}}
        if spec.message_log_claim
        else {"emptyDir": {}}
    )
    return [
        {
            "name": names.JOURNAL_VOLUME,
            "persistentVolumeClaim": {"claimName": names.journal_claim_name(cluster, ordinal)},
        },
        {
            "name": names.VERIFIER_VOLUME,
            "secret": {
                "secretName": names.verifier_secret_name(cluster),
                "items": [{"key": key, "path": key} for key in verifier_keys],
            },
        },
        {"name": names.MESSAGE_LOG_VOLUME, **message_log},
        *(
            {"name": volume, "secret": {"secretName": connection.credentials_secret}}
            for _variable, _mount, volume, connection in _credential_mounts(spec)
        ),
        *broker_tls.tls_volumes(cluster, spec.tls, serving=serves_tls(spec, serve_tls)),
    ]


def template_hash(
    cluster: str, spec: ClusterSpec, *, serve_tls: bool = False, defaults: PodDefaults = BUILT_IN_DEFAULTS
) -> str:
    """A digest of everything in a pod that comes from the spec; a changed spec changes it.

    The ordinal and the role label are left out: they differ between pods of the
    same template, and the role moves on every failover without a restart. The pod's
    securityContext is in: a changed ``spec.podSecurityContext`` replaces the pods. So are the
    scheduling fields the spec sets, but not the default spread: pods made before the operator
    spread them keep their hash and are not replaced by an upgrade of the operator alone; nor
    the handover lease's cap, for the same reason. TLS is in through the volumes, mounts,
    environment and probes it adds (so turning it on or off replaces the pods one at a time), but
    no certificate is: the pod names its Secrets only, and a rotation changes nothing here.
    Issue 42: the image is in as the pod runs it (``spec.image`` or the operator's), so a changed
    ``--broker-image`` rolls the clusters without an image of their own; the pod knobs the spec sets
    are in when set (``pod_fields.given_pod_fields``); the default zone spread, the default requests
    and the operator's pull secrets are not (``pod_fields.py`` says why).
    """
    container = broker_container(cluster, spec, serve_tls=serve_tls, defaults=defaults)
    container["resources"] = dict(spec.resources)  # as written: the default requests are out (issue 42)
    # Out of the hash: the handover lease's cap (issue 40). An operator upgrade that added it must
    # not replace every broker pod (a switchover per cluster, the pause the handover exists to
    # avoid), and a pod without it, or with an older value, is safe: the operator never asks for
    # more than handoverLeaseSeconds, and the broker grants no more than its own cap.
    container["env"] = [e for e in container["env"] if e["name"] != environment.BROKER_MAX_LEASE_SECONDS]
    template: Manifest = {
        "container": container,
        "volumes": pod_volumes(cluster, 0, spec, serve_tls=serve_tls),
        "securityContext": pod_security_context(spec),
    }
    scheduling = placement.given_scheduling(cluster, spec)
    if scheduling:
        template["scheduling"] = scheduling
    pod = given_pod_fields(spec)
    if pod:
        template["pod"] = pod
    encoded = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def with_log_environment(container: Manifest, log: LogSettings) -> Manifest:
    """``container`` with the operator's log format and level as the broker's (issue 42).

    Added to the pod, not to ``broker_container``, so that the template hash never covers it: the
    setting is install-wide, and a change of it, or the operator upgrade that first set it, must
    not replace every broker pod of every cluster (a switchover each). A pod takes the operator's
    current setting when it is next made (a rollout, a drain, a deleted pod); a container that
    restarts in place keeps its pod's.
    """
    extra = [{"name": name, "value": value} for name, value in log.environment().items()]
    return {**container, "env": [*container["env"], *extra]}


def build_pod(
    owner: Mapping[str, Any],
    ordinal: int,
    spec: ClusterSpec,
    *,
    active: bool,
    serve_tls: bool = False,
    defaults: PodDefaults = BUILT_IN_DEFAULTS,
    zones: str | None = None,
    log: LogSettings = DEFAULT_LOG_SETTINGS,
) -> Manifest:
    """Broker pod ``<cluster>-<ordinal>``; it starts Inactive whatever its role label says.

    ``zones``: how this pod is spread over zones, decided when it is made (``placement.zone_spread``;
    None: over hosts only)."""
    cluster = owner["metadata"]["name"]
    name = names.pod_name(cluster, ordinal)
    labels = {
        **cluster_labels(cluster),
        names.LABEL_ORDINAL: str(ordinal),
        names.LABEL_ROLE: names.ROLE_ACTIVE if active else names.ROLE_STANDBY,
    }
    metadata = owned_meta(owner, name, pod_labels(spec, labels))
    own = {
        names.ANNOTATION_TEMPLATE_HASH: template_hash(cluster, spec, serve_tls=serve_tls, defaults=defaults)
    }
    metadata["annotations"] = pod_annotations(spec, own)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "hostname": name,
            "subdomain": names.headless_service_name(cluster),
            # A restarted broker comes back Inactive with its stored epoch; only a heartbeat
            # activates it, so restarting in place is always safe.
            "restartPolicy": "Always",
            # SIGTERM makes the broker deactivate and drain before it exits 0.
            "terminationGracePeriodSeconds": 30,
            # The broker never calls the Kubernetes API: a mounted ServiceAccount token would only
            # be a credential for whoever took the pod over.
            "automountServiceAccountToken": False,
            **pod_identity(spec, defaults),
            "securityContext": pod_security_context(spec),
            **placement.pod_scheduling(cluster, spec, zones),
            "containers": [
                with_log_environment(
                    broker_container(cluster, spec, serve_tls=serve_tls, defaults=defaults), log
                )
            ],
            "volumes": pod_volumes(cluster, ordinal, spec, serve_tls=serve_tls),
        },
    }


def build_journal_claim(owner: Mapping[str, Any], ordinal: int, spec: ClusterSpec) -> Manifest:
    """The PVC for pod ``ordinal``'s journal and stored epoch; it outlives the pod.

    Owned by the BrokerCluster (so garbage-collected with it) only when
    ``persistentVolumeClaimRetentionPolicy.whenDeleted`` is Delete; ``claims.py`` keeps the owner
    reference of existing claims in line with the policy.
    """
    cluster = owner["metadata"]["name"]
    claim_spec: Manifest = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": spec.storage_size}},
    }
    if spec.storage_class is not None:
        claim_spec["storageClassName"] = spec.storage_class
    labels = {**cluster_labels(cluster), names.LABEL_ORDINAL: str(ordinal)}
    metadata = owned_meta(owner, names.journal_claim_name(cluster, ordinal), labels)
    metadata["ownerReferences"] = claim_owner_references(owner, spec)
    if not metadata["ownerReferences"]:
        del metadata["ownerReferences"]  # retained: nothing garbage-collects it
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": claim_spec}


def claim_owner_references(owner: Mapping[str, Any], spec: ClusterSpec) -> list[OwnerReference]:
    """The owner references of this cluster that a journal claim should carry under the spec's policy."""
    if not spec.claim_retention.delete_when_deleted:
        return []
    return [cast(OwnerReference, dict(kopf.build_owner_reference(owner)))]  # type: ignore[arg-type]


def _service_port() -> Manifest:
    return {"name": names.BROKER_PORT_NAME, "port": names.BROKER_PORT, "targetPort": names.BROKER_PORT_NAME}


def build_headless_service(owner: Mapping[str, Any]) -> Manifest:
    """``<cluster>-brokers``: stable DNS names for every broker pod, ready or not."""
    cluster = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_meta(owner, names.headless_service_name(cluster), cluster_labels(cluster)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": cluster_labels(cluster),
            "ports": [_service_port()],
        },
    }


def build_active_disruption_budget(owner: Mapping[str, Any], *, evictable: bool) -> Manifest:
    """``<cluster>-active``: the eviction API refuses (429) to evict the pod labelled active, so a
    drain waits while the operator switches over to a standby on another node; the label then
    moves and the old pod is evicted like any standby. ``evictable`` (spec.drainWithoutStandby:
    Evict, and no standby can take over) lets the eviction through.

    An active that is not Ready may always be evicted (``unhealthyPodEvictionPolicy``): it serves
    nothing, and keeping it would only block the drain. ``minAvailable`` as a number, not
    ``maxUnavailable``: for the latter the disruption controller needs the pods' owner to have a
    scale subresource, which a BrokerCluster has not, and without it the budget never allows anything.
    """
    cluster = owner["metadata"]["name"]
    selector = {**cluster_labels(cluster), names.LABEL_ROLE: names.ROLE_ACTIVE}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owned_meta(owner, names.disruption_budget_name(cluster), cluster_labels(cluster)),
        "spec": {
            "minAvailable": 0 if evictable else 1,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
