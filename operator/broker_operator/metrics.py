"""Prometheus metrics the failover engine updates; the controller serves them on ``/metrics``.

They live in prometheus_client's default registry, as is usual for that library, so
the controller (or the local runner) only has to start its HTTP exposition. Label
sets are kept small on purpose: per-cluster labels on counters and gauges, none on
the latency histogram, so 1,000 clusters stay a few thousand series.

This module only declares metrics and small helpers to update them; it starts no
server and reads no settings.
"""

from __future__ import annotations

import contextlib
from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from broker_operator.core.status import Phase

HEARTBEATS: Final = Counter(
    "broker_failover_heartbeats",
    "Heartbeat calls made, by cluster and outcome (active, inactive, unavailable, failed; late: a"
    " timeout while this operator's own event loop ran late; tls: a certificate that did not verify"
    " or the operator's refused; late and tls are not counted against the broker).",
    ["cluster", "outcome"],
)
HEARTBEAT_FAILURES: Final = Counter(
    "broker_failover_heartbeat_failures",
    "Heartbeat calls that got no answer (timeout, connection or SOAP fault), by cluster.",
    ["cluster"],
)
HEARTBEAT_LATENCY: Final = Histogram(
    "broker_failover_heartbeat_seconds",
    "Time from sending a Heartbeat to its answer or failure.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
FAILOVERS: Final = Counter(
    "broker_failover_failovers",
    "Completed changes of the active broker, by cluster and kind (Failover, Switchover, Failback, ...).",
    ["cluster", "kind"],
)
FAILOVER_DURATION: Final = Histogram(
    "broker_failover_failover_duration_seconds",
    "From the decision to move (failure detected or move planned) to the new active answering Active.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
EPOCH: Final = Gauge("broker_failover_epoch", "The highest epoch granted to the cluster.", ["cluster"])
PHASE: Final = Gauge(
    "broker_failover_phase", "1 for the cluster's current phase, 0 for the others.", ["cluster", "phase"]
)


def set_phase(cluster: str, phase: str) -> None:
    for candidate in Phase:
        PHASE.labels(cluster, candidate.value).set(1.0 if candidate.value == phase else 0.0)


class ClusterSeries:
    """One cluster's series that the engine updates at every heartbeat, each looked up once.

    ``labels()`` takes a lock and builds a key on every call, which at 2,000 clusters was a
    measurable share of the operator's CPU (docs/benchmarks.md). A series is created at its
    first update, as ``labels()`` would create it, so /metrics shows the same series.
    """

    def __init__(self, cluster: str) -> None:
        self._cluster = cluster
        self._outcomes: dict[str, Counter] = {}
        self._failures: Counter | None = None
        self._epoch: float | None = None

    def heartbeat(self, outcome: str, seconds: float) -> None:
        """One heartbeat's latency and outcome (one of ``HEARTBEAT_OUTCOMES``)."""
        HEARTBEAT_LATENCY.observe(seconds)
        counter = self._outcomes.get(outcome)
        if counter is None:
            counter = self._outcomes[outcome] = HEARTBEATS.labels(self._cluster, outcome)
        counter.inc()
        if outcome == "failed":
            if self._failures is None:
                self._failures = HEARTBEAT_FAILURES.labels(self._cluster)
            self._failures.inc()

    def epoch(self, epoch: int) -> None:
        """The cluster's epoch gauge, written when it changed."""
        if epoch != self._epoch:
            EPOCH.labels(self._cluster).set(epoch)
            self._epoch = epoch


# The label values the engine uses with the per-cluster metrics (engine.py), so that
# a deleted cluster's series can be dropped one by one (prometheus_client has no
# "remove by one label" call).
HEARTBEAT_OUTCOMES: Final = ("active", "inactive", "unavailable", "failed", "late", "tls")
CHANGES_OF_ACTIVE: Final = ("Failover", "Switchover", "Failback")


def forget_cluster(cluster: str) -> None:
    """Drop every series of a deleted cluster so /metrics does not grow without bound.

    Call it only after the cluster's engine stopped: a running loop would set its
    gauges again at its next step.
    """
    label_sets: list[tuple[Counter | Gauge, tuple[str, ...]]] = [
        (EPOCH, (cluster,)),
        (HEARTBEAT_FAILURES, (cluster,)),
        *((PHASE, (cluster, p.value)) for p in Phase),
        *((HEARTBEATS, (cluster, outcome)) for outcome in HEARTBEAT_OUTCOMES),
        *((FAILOVERS, (cluster, kind)) for kind in CHANGES_OF_ACTIVE),
    ]
    for metric, labels in label_sets:
        with contextlib.suppress(KeyError):  # never set: nothing to drop
            metric.remove(*labels)
