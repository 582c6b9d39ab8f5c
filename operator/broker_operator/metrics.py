"""Prometheus metrics of the operator: the failover engine's, the controller's, and what status says.

They live in prometheus_client's default registry, as is usual for that library, so the
controller (or the local runner) only has to start its HTTP exposition; the process and Python
collectors of that registry (``process_cpu_seconds_total``, ...) come with it.

**Which BrokerCluster.** Every per-cluster series carries ``brokercluster_namespace`` and
``brokercluster`` (:data:`CLUSTER_LABELS`). Not ``cluster``: multi-cluster Prometheus setups add
that label to every series for the Kubernetes cluster, and the name alone let two same-named
BrokerClusters of two namespaces share series (deleting one dropped the other's). Not
``namespace``: the ServiceMonitor's target label of that name says where the operator's own pod
runs, and taking it over would need ``honorLabels``, which lets a target overwrite every target
label and which a plain scrape config does not set (``exported_namespace`` then). The broker pods'
series get the same two labels from the PodMonitor's relabelling (docs/monitoring.md).

**Bounded labels.** Per cluster: ``outcome`` (:data:`HEARTBEAT_OUTCOMES`), ``kind``
(:data:`CHANGES_OF_ACTIVE`), ``phase`` (``Phase``), ``broker`` (a cluster's brokers: at most 16
endpoints or 9 replicas), ``verdict`` (:data:`VERDICTS`), ``certificate``
(:data:`CERTIFICATE_NAMES`); values read from status outside those sets are not exported. Per
process: ``outcome`` of a reconcile, the ``verb`` and HTTP ``code`` of a Kubernetes call. The
latency histograms have no label, so 1,000 clusters stay a few thousand series. No label or value
carries a credential, a URL or a message text.

**Dropping a deleted cluster's series.** Every per-cluster series is made through :func:`_child`,
which notes its label values in a ledger per cluster; :func:`forget_cluster` removes exactly
those (prometheus_client has no "remove by one label"). A series is made at its first update, as
``labels()`` would make it, except the failover counters, made at 0 when a cluster's engine
starts, so that ``increase()`` sees the first failover too (a counter that appears at 1 shows no
increase).

**From status.** :func:`record_status` turns a BrokerCluster's ``status.ordering`` (the
validator's verdict) and ``status.tls.certificates`` (each certificate's ``notAfter``) into
gauges; the controller calls it from every reconcile, on the event loop like every other update.

This module only declares metrics and small helpers to update them; it starts no server and
reads no settings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, NamedTuple

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from broker_operator.core.status import Phase, parse_time

CLUSTER_LABELS: Final = ("brokercluster_namespace", "brokercluster")


class ClusterKey(NamedTuple):
    """Which BrokerCluster a series belongs to; ``namespace`` is empty where there is none (the
    local runner, the benchmarks)."""

    namespace: str
    name: str


HEARTBEATS: Final = Counter(
    "broker_failover_heartbeats",
    "Heartbeat calls made, by cluster and outcome (active, inactive, unavailable, failed; late: a"
    " timeout while this operator's own event loop ran late; tls: a certificate that did not verify"
    " or the operator's refused; late and tls are not counted against the broker).",
    [*CLUSTER_LABELS, "outcome"],
)
HEARTBEAT_FAILURES: Final = Counter(
    "broker_failover_heartbeat_failures",
    "Heartbeat calls that got no answer (timeout, connection or SOAP fault), by cluster and broker.",
    [*CLUSTER_LABELS, "broker"],
)
HEARTBEAT_LATENCY: Final = Histogram(
    "broker_failover_heartbeat_seconds",
    "Time from sending a Heartbeat to its answer or failure.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
FAILOVERS: Final = Counter(
    "broker_failover_failovers",
    "Completed changes of the active broker, by cluster and kind (Failover, Switchover, Failback).",
    [*CLUSTER_LABELS, "kind"],
)
FAILOVER_DURATION: Final = Histogram(
    "broker_failover_failover_duration_seconds",
    "From the decision to move (failure detected or move planned) to the new active answering Active.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
EPOCH: Final = Gauge("broker_failover_epoch", "The highest epoch granted to the cluster.", CLUSTER_LABELS)
PHASE: Final = Gauge(
    "broker_failover_phase",
    "1 for the cluster's current phase as the engine sees it, 0 for the others.",
    [*CLUSTER_LABELS, "phase"],
)
ORDERING_VERDICT: Final = Gauge(
    "broker_failover_ordering_verdict",
    "1 for the ordering validator's last verdict on the cluster (status.ordering.result), 0 for the"
    " other; absent until the validator recorded one.",
    [*CLUSTER_LABELS, "verdict"],
)
ORDERING_CHECKED: Final = Gauge(
    "broker_failover_ordering_checked_timestamp_seconds",
    "When the ordering validator last checked the cluster (status.ordering.lastCheckTime), Unix time.",
    CLUSTER_LABELS,
)
ORDERING_VIOLATIONS: Final = Gauge(
    "broker_failover_ordering_violations",
    "Violations the ordering validator's last check found (status.ordering.violations).",
    CLUSTER_LABELS,
)
CERTIFICATE_NOT_AFTER: Final = Gauge(
    "broker_failover_certificate_not_after_seconds",
    "When each certificate of the cluster expires (status.tls.certificates[].notAfter), Unix time.",
    [*CLUSTER_LABELS, "certificate"],
)
CLUSTERS_DRIVEN: Final = Gauge(
    "broker_failover_clusters_driven",
    "BrokerClusters this operator process drives now (its shard, and it the handling peer).",
)
RECONCILES: Final = Counter(
    "broker_failover_reconciles",
    "Reconciles of a BrokerCluster's children by this process, by outcome (ok, error).",
    ["outcome"],
)
KUBE_REQUESTS: Final = Counter(
    "broker_failover_kube_requests",
    "The controller's own Kubernetes API calls (not kopf's watches and patches), by verb and HTTP"
    " code (2xx: any success; error: no HTTP answer).",
    ["verb", "code"],
)
RECONCILIATION_PAUSED: Final = Gauge(
    "broker_failover_reconciliation_paused",
    "1 while the cluster's reconciliation is paused (annotation broker.failover.dev/pause-reconciliation):"
    " heartbeats and lease renewals go on, failovers, switchovers and failbacks wait.",
    CLUSTER_LABELS,
)

# The label values the engine and status use, so that nothing else can become a series.
HEARTBEAT_OUTCOMES: Final = ("active", "inactive", "unavailable", "failed", "late", "tls")
CHANGES_OF_ACTIVE: Final = ("Failover", "Switchover", "Failback")
VERDICTS: Final = ("Passed", "Failed")
# status.tls.certificates[].name, as the CRD's enum (controller/certificate_report.py).
CERTIFICATE_NAMES: Final = frozenset({"ca", "server", "operatorClient", "backendClientsCA", "upstreamCA"})
KUBE_VERBS: Final = frozenset({"get", "read", "list", "create", "patch", "replace", "delete"})

# Every per-cluster series made so far, by cluster: what forget_cluster removes. Touched on the
# event loop only (the engine, the daemons, the reconciles), never by the scrape thread.
_LEDGER: dict[ClusterKey, set[tuple[MetricWrapperBase, tuple[str, ...]]]] = {}


def _child(metric: Any, key: ClusterKey, *values: str) -> Any:
    """``metric.labels(namespace, name, *values)``, noted in the cluster's ledger."""
    labels = (key.namespace, key.name, *values)
    _LEDGER.setdefault(key, set()).add((metric, labels))
    return metric.labels(*labels)


def _remove(metric: MetricWrapperBase, key: ClusterKey, *values: str) -> None:
    labels = (key.namespace, key.name, *values)
    with contextlib.suppress(KeyError):  # never made: nothing to drop
        metric.remove(*labels)
    _LEDGER.get(key, set()).discard((metric, labels))


class ClusterSeries:
    """One cluster's series that the engine updates, each looked up once.

    ``labels()`` takes a lock and builds a key on every call, which at 2,000 clusters was a
    measurable share of the operator's CPU (docs/benchmarks.md). Made when an engine starts: the
    failover counters appear then, at 0.
    """

    def __init__(self, key: ClusterKey) -> None:
        self._key = key
        self._outcomes: dict[str, Counter] = {}
        self._failures: dict[str, Counter] = {}
        self._failovers = {kind: _child(FAILOVERS, key, kind) for kind in CHANGES_OF_ACTIVE}
        self._epoch: float | None = None
        self._paused: bool | None = None

    def heartbeat(self, outcome: str, seconds: float, broker: str) -> None:
        """One heartbeat's latency and outcome (one of ``HEARTBEAT_OUTCOMES``) to ``broker``."""
        HEARTBEAT_LATENCY.observe(seconds)
        counter = self._outcomes.get(outcome)
        if counter is None:
            counter = self._outcomes[outcome] = _child(HEARTBEATS, self._key, outcome)
        counter.inc()
        if outcome == "failed":
            failures = self._failures.get(broker)
            if failures is None:
                failures = self._failures[broker] = _child(HEARTBEAT_FAILURES, self._key, broker)
            failures.inc()

    def epoch(self, epoch: int) -> None:
        """The cluster's epoch gauge, written when it changed."""
        if epoch != self._epoch:
            _child(EPOCH, self._key).set(epoch)
            self._epoch = epoch

    def phase(self, phase: str) -> None:
        """1 for ``phase``, 0 for the others (call it when the phase changed)."""
        for candidate in Phase:
            _child(PHASE, self._key, candidate.value).set(1.0 if candidate.value == phase else 0.0)

    def paused(self, paused: bool) -> None:
        """The cluster's pause gauge, written when it changed."""
        if paused != self._paused:
            _child(RECONCILIATION_PAUSED, self._key).set(1.0 if paused else 0.0)
            self._paused = paused

    def failover(self, kind: str, seconds: float | None) -> None:
        """A completed change of the active (``kind`` one of ``CHANGES_OF_ACTIVE``)."""
        counter = self._failovers.get(kind)
        if counter is not None:
            counter.inc()
        if seconds is not None:
            FAILOVER_DURATION.observe(seconds)


def record_status(key: ClusterKey, status: Mapping[str, Any]) -> None:
    """The validator's last verdict and the certificates' ends, from a BrokerCluster's status.

    A verdict or an end that status no longer has (or never had in a readable form) is dropped,
    so the gauges say what status says now, no more.
    """
    ordering = status.get("ordering") or {}
    result = ordering.get("result") if isinstance(ordering, Mapping) else None
    if result in VERDICTS:
        for verdict in VERDICTS:
            _child(ORDERING_VERDICT, key, verdict).set(1.0 if verdict == result else 0.0)
        _set_or_remove(ORDERING_CHECKED, key, _timestamp(ordering.get("lastCheckTime")))
        violations = ordering.get("violations")
        _set_or_remove(ORDERING_VIOLATIONS, key, float(violations) if isinstance(violations, int) else None)
    else:
        for verdict in VERDICTS:
            _remove(ORDERING_VERDICT, key, verdict)
        _remove(ORDERING_CHECKED, key)
        _remove(ORDERING_VIOLATIONS, key)
    ends = dict(_certificate_ends(status.get("tls")))
    for name in CERTIFICATE_NAMES:
        _set_or_remove(CERTIFICATE_NOT_AFTER, key, ends.get(name), name)


def _set_or_remove(metric: Gauge, key: ClusterKey, value: float | None, *values: str) -> None:
    if value is None:
        _remove(metric, key, *values)
    else:
        _child(metric, key, *values).set(value)


def _timestamp(text: Any) -> float | None:
    return parse_time(text) if isinstance(text, str) else None


def _certificate_ends(tls: Any) -> Iterator[tuple[str, float]]:
    certificates = tls.get("certificates") if isinstance(tls, Mapping) else None
    for entry in certificates if isinstance(certificates, list) else ():
        if isinstance(entry, Mapping) and entry.get("name") in CERTIFICATE_NAMES:
            end = _timestamp(entry.get("notAfter"))
            if end is not None:
                yield str(entry["name"]), end


def forget_cluster(key: ClusterKey) -> None:
    """Drop every series of a cluster this process no longer drives, so /metrics neither grows
    without bound nor shows a phase another process now decides.

    Call it only after the cluster's engine stopped: a running loop would set its gauges again
    at its next step.
    """
    for metric, labels in _LEDGER.pop(key, set()):
        with contextlib.suppress(KeyError):  # removed already
            metric.remove(*labels)


@contextlib.contextmanager
def kube_request(call: Callable[..., Any], args: tuple[Any, ...]) -> Iterator[None]:
    """Count one Kubernetes API call of the controller by its verb and HTTP code.

    ``call`` is the client's method (``patch_namespaced_service``), or a wrapper whose first
    argument is (``kube._raw_json``); the verb is its name's first word, ``other`` if unknown.
    """
    name = getattr(call, "__name__", "")
    if name.split("_", 1)[0] not in KUBE_VERBS and args and callable(args[0]):
        name = getattr(args[0], "__name__", "")
    verb = name.split("_", 1)[0]
    verb = verb if verb in KUBE_VERBS else "other"
    try:
        yield
    except Exception as error:
        status = getattr(error, "status", None)  # kubernetes' ApiException; no import for it here
        code = str(status) if isinstance(status, int) and 100 <= status < 600 else "error"
        KUBE_REQUESTS.labels(verb, code).inc()
        raise
    KUBE_REQUESTS.labels(verb, "2xx").inc()  # the client does not say which
