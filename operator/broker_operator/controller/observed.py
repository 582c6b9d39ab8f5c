"""What the controller has seen of one BrokerCluster's pods and claims, and what the engine needs.

The pod watch (a kopf event handler) and the heartbeat daemon run apart; this
per-cluster record is where the first leaves what it saw and the second reads
it: the engine's targets (who to heartbeat, at which IP, in which priority
order) and its pod facts (is the active's container dead, is its pod gone).
Targets and facts are derived here by pure functions so they can be tested
without kopf.

It holds no Kubernetes client and does no I/O; ``wake`` is the engine's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from broker_contracts import environment
from broker_operator.controller import names
from broker_operator.controller.bodies import ClaimBody, PodBody
from broker_operator.controller.claim_sizes import ResizeRefusal
from broker_operator.controller.rollout import PodView
from broker_operator.controller.spec import ClusterSpec
from broker_operator.core.model import BrokerTarget, PodFacts


def container_terminated(pod: PodBody) -> bool:
    """The broker container is not running: it exited, or it is waiting to restart after exiting.

    A container the kubelet restarts comes back Inactive (a broker never starts
    Active), so "terminated" here is exactly "this broker is surely not active".
    """
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") != names.BROKER_CONTAINER:
            continue
        state = status.get("state") or {}
        if "terminated" in state:
            return True
        if "waiting" in state and "terminated" in (status.get("lastState") or {}):
            return True  # crash loop back-off: dead between restarts
    return False


def pod_ready(pod: PodBody) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_ordinal(pod: PodBody) -> int | None:
    raw = (pod.get("metadata", {}).get("labels") or {}).get(names.LABEL_ORDINAL)
    return int(raw) if raw is not None and raw.isdigit() else None


def _broker_port(pod: PodBody, name: str) -> int:
    """The broker container's port called ``name``; the main port if it has none of that name."""
    for container in pod.get("spec", {}).get("containers") or []:
        if container.get("name") != names.BROKER_CONTAINER:
            continue
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("containerPort"):
                return int(port["containerPort"])
    return names.BROKER_PORT


def admin_port(pod: PodBody) -> int:
    """The port the operator calls a broker pod on: its container's ``admin`` port, else its only one.

    Read from each pod, not assumed from the operator's version: pods created before the admin port
    existed (an operator upgrade rolls them one at a time) serve Heartbeat on the main port, and a
    heartbeat to a port they do not have would look like a dead broker and fail over for nothing.
    """
    return _broker_port(pod, names.BROKER_ADMIN_PORT_NAME)


def main_port(pod: PodBody) -> int:
    """The broker container's SOAP port (``soap``): what the ``-active`` Service forwards to."""
    return _broker_port(pod, names.BROKER_PORT_NAME)


def serves_tls(pod: PodBody) -> bool:
    """Whether the pod's broker serves TLS: its container's environment names a TLS directory
    (``BROKER_TLS_DIR``, which ``broker_tls.tls_env`` sets exactly when the broker serves TLS).

    Read from each pod, like :func:`admin_port`, never from the spec or the operator's settings:
    while a change of ``spec.tls.mode`` (or an operator upgrade that turns TLS on) rolls the pods
    one at a time, some serve plain HTTP and some TLS, and each must be called the way it
    listens; a heartbeat in the wrong one fails, and would count toward a failover.
    """
    for container in pod.get("spec", {}).get("containers") or []:
        if container.get("name") != names.BROKER_CONTAINER:
            continue
        return any(
            env.get("name") == environment.BROKER_TLS_DIR and env.get("value")
            for env in container.get("env") or []
        )
    return False


def pod_dns_name(pod: PodBody, cluster_domain: str) -> str | None:
    """The pod's name under its headless Service, ``<hostname>.<subdomain>.<ns>.svc.<domain>``: the
    name its serving certificate carries (``pki.names``) and the operator verifies when it dials
    the pod's IP. From the pod's own ``hostname`` and ``subdomain`` (``builders`` sets both), as
    the cluster's DNS names it; None when it has no subdomain (nothing names it then)."""
    spec, meta = pod.get("spec", {}), pod.get("metadata", {})
    hostname = spec.get("hostname") or meta.get("name")
    subdomain, namespace = spec.get("subdomain"), meta.get("namespace")
    if not (hostname and subdomain and namespace):
        return None
    return f"{hostname}.{subdomain}.{namespace}.svc.{cluster_domain}"


def admin_soap_url(pod: PodBody) -> str | None:
    """The SOAP URL of a pod's Heartbeat and admin operations (``https`` when it serves TLS); None
    while it has no IP."""
    ip = pod.get("status", {}).get("podIP")
    return names.broker_soap_url(ip, admin_port(pod), tls=serves_tls(pod)) if ip else None


def expected_brokers(cluster: str, spec: ClusterSpec) -> dict[str, int]:
    """Every broker the cluster should have, by name, with its priority."""
    if spec.endpoints_mode:
        return {e.name: e.priority for e in spec.endpoints}
    return {names.pod_name(cluster, ordinal): ordinal for ordinal in range(spec.replicas)}


def targets_for(spec: ClusterSpec, pods: Mapping[str, PodBody]) -> list[BrokerTarget]:
    """The engine's targets: endpoints as written, or every managed pod that has an IP yet (with
    the DNS name its certificate must carry, when it serves TLS)."""
    if spec.endpoints_mode:
        return [BrokerTarget(e.name, e.url, e.priority) for e in spec.endpoints]
    targets = []
    for name, pod in pods.items():
        ordinal = pod_ordinal(pod)
        url = admin_soap_url(pod)
        if ordinal is None or url is None or pod.get("metadata", {}).get("deletionTimestamp"):
            continue  # no address yet (or on its way out): nothing to heartbeat
        server_name = pod_dns_name(pod, spec.tls.cluster_domain) if serves_tls(pod) else None
        targets.append(BrokerTarget(name, url, ordinal, tls_server_name=server_name))
    return sorted(targets, key=lambda t: t.priority)


AUTOSCALER_DELETION_TAINT = "ToBeDeletedByClusterAutoscaler"


def node_draining(node: Mapping[str, Any]) -> bool:
    """A node being emptied: cordoned (``kubectl drain`` cordons first), or marked for deletion by
    the cluster autoscaler, which taints rather than cordons."""
    spec = node.get("spec") or {}
    taints = spec.get("taints") or []
    return bool(spec.get("unschedulable")) or any(t.get("key") == AUTOSCALER_DELETION_TAINT for t in taints)


def pod_node(pod: PodBody) -> str | None:
    return pod.get("spec", {}).get("nodeName") or None


def facts_for(
    pods: Mapping[str, PodBody],
    expected: Mapping[str, object],
    draining_nodes: AbstractSet[str] = frozenset(),
) -> dict[str, PodFacts]:
    """Pod facts for every expected broker name; a name without a pod is ``exists=False``."""
    return {
        name: PodFacts(
            exists=name in pods,
            container_terminated=name in pods and container_terminated(pods[name]),
            node_draining=name in pods and pod_node(pods[name]) in draining_nodes,
        )
        for name in expected
    }


def pod_views(pods: Mapping[str, PodBody]) -> list[PodView]:
    views = []
    for name, pod in pods.items():
        ordinal = pod_ordinal(pod)
        if ordinal is None:
            continue
        meta = pod.get("metadata", {})
        views.append(
            PodView(
                name=name,
                ordinal=ordinal,
                template_hash=(meta.get("annotations") or {}).get(names.ANNOTATION_TEMPLATE_HASH),
                ready=pod_ready(pod),
                terminating=bool(meta.get("deletionTimestamp")),
            )
        )
    return views


@dataclass
class ClusterObservations:
    """The latest body of every managed pod of one cluster, keyed by pod name."""

    pods: dict[str, PodBody] = field(default_factory=dict)
    # Set by the heartbeat daemon while its engine runs: re-evaluate at once.
    wake: Callable[[], None] | None = None
    # Set by the daemon: push new targets to a running engine when an IP appears or changes.
    retarget: Callable[[], None] | None = None
    # Set by the daemon: the -active Service's EndpointSlice was deleted or written by someone
    # else; write it again now.
    repoint: Callable[[], None] | None = None
    # Set by the daemon while its engine runs (the heartbeat client's): broker name -> the serial of
    # the serving certificate it presented in the latest handshake, and broker name -> why TLS with
    # it fails now (redacted). The certificates controller reports them (status.tls.served[], a
    # Warning event per distinct problem) on its passes; the engine never waits for that.
    served_serials: Callable[[], Mapping[str, str]] | None = None
    tls_problems: Callable[[], Mapping[str, str]] | None = None
    # Also the heartbeat client's, for a CA key replacement (pki.replacement): broker name -> the
    # version of the CA bundle its admin port named in its latest reply, and the client certificate
    # (PEM) the heartbeats present now.
    loaded_bundles: Callable[[], Mapping[str, str]] | None = None
    presented_certificate: Callable[[], bytes | None] | None = None
    # The resourceVersion of the engine's own last write of that slice: a watch event of any
    # other version is someone else's write (or one the engine has not heard back from yet).
    slice_version: str | None = None
    # The latest body of every journal claim of the cluster, by name (the retention policy's input).
    claims: dict[str, ClaimBody] = field(default_factory=dict)
    # Resizes of those claims the API server refused, by claim (claim_growth.py): not asked again
    # until due, or until spec.storage.size changes.
    resize_refusals: dict[str, ResizeRefusal] = field(default_factory=dict)
    # Children the reconciler created or found, so that it does not re-create them every pass.
    ensured: set[str] = field(default_factory=set)
    ensured_generation: int | None = None
    # A switchover the rollout asked for; it overrides spec.preferredActive until it is done.
    switchover_target: str | None = None
    # The last message reported per event reason: the create handler and the timer may run on the
    # same stale body at once, and a person should see a conflict once, not once per reconcile.
    reported: dict[str, str] = field(default_factory=dict)
    # The nodes being drained, the node watch's (one set the controller shares with every cluster).
    draining_nodes: AbstractSet[str] = frozenset()
    # The minAvailable the active's PodDisruptionBudget was last given, as evictable (None: not
    # known since the operator started).
    budget_evictable: bool | None = None

    def runs_on(self, node: str) -> bool:
        """Whether a pod of this cluster is on ``node``."""
        return any(pod_node(pod) == node for pod in self.pods.values())

    def first_report(self, reason: str, message: str) -> bool:
        """True the first time ``message`` is reported for ``reason`` (since the last other message)."""
        if self.reported.get(reason) == message:
            return False
        self.reported[reason] = message
        return True

    def observe(self, name: str, pod: PodBody | None) -> tuple[bool, bool]:
        """Record a pod event (None = deleted); return (targets may have changed, death may have changed)."""
        before = self.pods.get(name)
        if pod is None:
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        # The URL, not only the IP: a pod replaced under its name may come back with an admin port.
        url_before = admin_soap_url(before) if before is not None else None
        url_after = admin_soap_url(pod) if pod is not None else None
        dead_before = before is None or container_terminated(before)
        dead_after = pod is None or container_terminated(pod)
        return url_before != url_after or (before is None) != (pod is None), dead_before != dead_after
