"""The chart's alerts and dashboard on a real Prometheus scraping the real operator and brokers (issue 43).

On the session's sealed cluster: the relay (chart, example BrokerCluster, simulator pods;
``local_cluster.relay``) in a namespace of its own, and beside it Debian's Prometheus
(``local_cluster.prometheus``) discovering the operator's metrics Service and the broker pods with
the scrape configs derived from the chart's rendered ServiceMonitor and PodMonitor, and evaluating
exactly the rendered PrometheusRule's groups, every 2 s. The alerts a scenario needs get short
``for:`` values through the chart's ``monitoring.prometheusRule.for.<Alert>``; the defaults stay.
Every observation is read from Prometheus's HTTP API through the API server's service proxy.

The tests run in file order, one scenario each, on one relay and one Prometheus (module scope):
a healthy cluster shows no alert at all; kill -9 of the active shows the failover in the metrics
but no storm; the operator scaled to 0 raises BrokerFailoverOperatorDown; every broker pod deleted
and kept down raises BrokerClusterNoActiveBroker; a Failed verdict raises
BrokerClusterOrderingVerdictFailed; a poisoned stream raises BrokerHeldMessagesGrowing; and
finally every dashboard query returns data (last, so that the series only a fault makes exist).
Split brain is not here: the system prevents it; tests/monitoring/alerts.test.yaml proves that
alert with promtool series (docs/monitoring.md).

Waits are bounded failure limits, not performance assertions; timings are printed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from broker_validator.report_schema import Report
from broker_validator.status import record_ordering
from local_cluster.prometheus import Prometheus, PrometheusError, deploy_prometheus, finite
from local_cluster.relay import CHART, CLUSTER_NAME, Relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import relay_in_new_namespace, wait_for

pytestmark = pytest.mark.e2e

STREAMS, PER_STREAM = 2, 200
# A message the cloud always refuses, past what the backend sends at first: the stream is poisoned
# only when test_a_poisoned_stream produces up to it.
POISON_STREAM, POISON_SEQ = "orders-0000", PER_STREAM + 20
# The scenarios' alerts reach firing within seconds; the others keep the chart's defaults.
SHORT_FOR = {
    "BrokerClusterNoActiveBroker": "6s",
    "BrokerFailoverOperatorDown": "6s",
    "BrokerHeldMessagesGrowing": "6s",
}
INTERVAL = "2s"  # scrape and evaluation


@dataclass
class Stack:
    relay: Relay
    prometheus: Prometheus
    started: float

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    @property
    def cluster_labels(self) -> dict[str, str]:
        """The labels naming the relay's BrokerCluster on its series and alerts."""
        return {"brokercluster": CLUSTER_NAME, "brokercluster_namespace": self.relay.namespace}

    @property
    def brokers(self) -> list[str]:
        """The broker pods' names, from the BrokerCluster's replicas (the example's)."""
        replicas = int(self.relay.get("brokercluster", CLUSTER_NAME)["spec"]["replicas"])
        return [f"{CLUSTER_NAME}-{ordinal}" for ordinal in range(replicas)]

    @property
    def selector(self) -> str:
        return f'brokercluster="{CLUSTER_NAME}", brokercluster_namespace="{self.relay.namespace}"'


@pytest.fixture(scope="module")
def stack(sealed_cluster: SealedCluster) -> Iterator[Stack]:
    started = time.monotonic()
    poison = f"--poison={POISON_STREAM}:{POISON_SEQ}:always"
    with relay_in_new_namespace(
        sealed_cluster, "prom", streams=STREAMS, messages_per_stream=PER_STREAM, backend_extra_args=[poison]
    ) as relay:
        print(f"relay Healthy after {time.monotonic() - started:.1f}s", flush=True)
        values = {
            # As deploy_relay installed the release; the rest only changes the monitoring's rendering.
            "operator.watchNamespaces": f"{{{relay.namespace}}}",
            "monitoring.serviceMonitor.interval": INTERVAL,
            "monitoring.podMonitor.interval": INTERVAL,
            **{f"monitoring.prometheusRule.for.{alert}": value for alert, value in SHORT_FOR.items()},
        }
        prometheus = deploy_prometheus(relay, values, interval=INTERVAL)
        yield Stack(relay, prometheus, started)


def alert_of(stack: Stack, name: str, labels: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    """Wait (bounded) for alert ``name`` pending or firing with ``labels`` (among others); return it."""

    def found() -> dict[str, Any] | None:
        for alert in stack.prometheus.alerts_named(name):
            if labels.items() <= alert["labels"].items() and alert["state"] in ("pending", "firing"):
                return alert
        return None

    began = time.monotonic()
    alert: dict[str, Any] = wait_for(f"alert {name} with {labels}", found, timeout=timeout, interval=1)
    stack.say(f"{name} {alert['state']} after {time.monotonic() - began:.1f}s: {alert['labels']}")
    return alert


def wait_alert_gone(stack: Stack, name: str, timeout: float = 120) -> None:
    began = time.monotonic()
    wait_for(f"alert {name} resolved", lambda: not stack.prometheus.alerts_named(name), timeout, 1)
    stack.say(f"{name} resolved after {time.monotonic() - began:.1f}s")


def wait_healthy(stack: Stack, timeout: float = 240) -> None:
    """The BrokerCluster Healthy in its status and in Prometheus: a running operator's phase, and
    one broker reporting itself active (a status alone may be the one a stopped operator left)."""
    began = time.monotonic()
    wait_for(
        "the BrokerCluster Healthy with an active broker",
        lambda: (s := stack.relay.status()).get("phase") == "Healthy" and s.get("active"),
        timeout,
        1,
    )
    selector = stack.selector
    for expr in (
        f'broker_failover_phase{{{selector}, phase="Healthy"}} == 1',
        f"sum(broker_active{{{selector}}}) == 1",
    ):
        wait_for(f"{expr} in Prometheus", lambda expr=expr: stack.prometheus.query(expr), timeout, 1)
    stack.say(f"BrokerCluster Healthy after {time.monotonic() - began:.1f}s")


def one_value(stack: Stack, expr: str) -> float:
    values = stack.prometheus.values(expr)
    assert len(values) == 1, f"{expr}: {values}"
    return values[0]


def test_a_healthy_cluster_shows_no_alert(stack: Stack) -> None:
    relay, prometheus, selector = stack.relay, stack.prometheus, stack.selector
    relay.backend("/sim/start", {})
    wait_for("traffic confirmed", lambda: int(relay.backend("/sim/status")["confirmed"]) > 0, timeout=120)

    def targets_up() -> dict[str, dict[str, str]] | None:
        targets = prometheus.active_targets()
        if not targets or any(target["health"] != "up" for target in targets):
            return None
        return {target["labels"].get("pod", ""): target["labels"] for target in targets}

    brokers = stack.brokers
    targets = wait_for("the operator's and the brokers' targets up", targets_up, timeout=120, interval=1)
    assert len(targets) == len(brokers) + 1, targets
    for broker in brokers:
        # The PodMonitor's relabelling, as a Prometheus Operator would apply it.
        assert {**stack.cluster_labels, "broker": broker}.items() <= targets[broker].items(), targets
    [operator_pod] = set(targets) - set(brokers)
    metrics_service = f"{relay.release}-broker-failover-metrics"
    assert targets[operator_pod]["job"] == metrics_service  # what the alerts' ${operatorJob} names
    stack.say(f"targets up: {sorted(targets)}")

    # What a settled cluster looks like to the rules: one broker reports itself active, the phase
    # is Healthy, the operator finished reconciles (NotReconciling needs an increase to see).
    settled = [
        f"sum(broker_active{{{selector}}}) == 1",
        f'broker_failover_phase{{{selector}, phase="Healthy"}} == 1',
        'sum(increase(broker_failover_reconciles_total{outcome="ok"}[1m])) > 0',
    ]
    for expr in settled:
        wait_for(f"{expr} in Prometheus", lambda expr=expr: prometheus.query(expr), timeout=120, interval=1)
    relay.wait_all_confirmed()
    prometheus.wait_evaluated(3)
    seen = []
    for _ in range(5):  # ten seconds of evaluations, each read
        seen += prometheus.alerts()
        time.sleep(2)
    assert seen == [], f"a healthy cluster has alerts: {json.dumps(seen, indent=1)}"
    stack.say("healthy: no alert pending or firing over five evaluations")


def test_kill_9_of_the_active_shows_the_failover_but_no_storm(stack: Stack) -> None:
    relay, prometheus, selector = stack.relay, stack.prometheus, stack.selector
    failovers = f'sum(broker_failover_failovers_total{{{selector}, kind="Failover"}})'
    # Made at 0 when the cluster's engine starts (docs/monitoring.md), so it is there before any.
    before = one_value(stack, failovers)
    old = relay.status()["active"]
    relay.kill_9(old)
    stack.say(f"killed {old} (active)")
    new = wait_for(
        "another broker made active",
        lambda: (active := relay.status().get("active")) not in (None, old) and active,
        timeout=120,
    )
    stack.say(f"{new} active")
    wait_for(
        "the failover counted in Prometheus",
        lambda: one_value(stack, failovers) > before,
        timeout=60,
        interval=1,
    )
    wait_for(
        f"{new} reporting broker_active 1 in Prometheus",
        lambda: prometheus.query(f'broker_active{{{selector}, broker="{new}"}} == 1'),
        timeout=60,
        interval=1,
    )
    prometheus.wait_evaluated(3)
    storm = f'sum(increase(broker_failover_failovers_total{{{selector}, kind=~"Failover|Failback"}}[30m]))'
    assert one_value(stack, storm) < 3
    assert prometheus.alerts_named("BrokerClusterFailoverStorm") == []
    stack.say(f"failovers {before:.0f} -> {one_value(stack, failovers):.0f}; no storm alert")
    wait_healthy(stack)


def operator_deployment(relay: Relay) -> str:
    return f"{relay.release}-broker-failover"


def test_the_operator_scaled_to_zero_raises_operator_down(stack: Stack) -> None:
    relay = stack.relay
    deployment = operator_deployment(relay)
    relay.cluster.kubectl("-n", relay.namespace, "scale", "deployment", deployment, "--replicas=0")
    stack.say(f"scaled {deployment} to 0")
    try:
        alert = alert_of(stack, "BrokerFailoverOperatorDown", {"severity": "critical"})
        # An alert about the operator, not a BrokerCluster: it counts the operator's pods up, and
        # its labels are its own (the count keeps none of the targets').
        assert alert["labels"] == {"alertname": "BrokerFailoverOperatorDown", "severity": "critical"}
        assert relay.namespace in alert["annotations"]["description"]
    finally:
        relay.cluster.kubectl("-n", relay.namespace, "scale", "deployment", deployment, "--replicas=1")
    relay.cluster.kubectl(
        "-n", relay.namespace, "rollout", "status", f"deployment/{deployment}", "--timeout=180s", timeout=200
    )
    wait_alert_gone(stack, "BrokerFailoverOperatorDown")
    wait_healthy(stack)


def broker_pods(relay: Relay) -> list[str]:
    pods = relay.get("pods", "-l", f"broker.failover.dev/cluster={CLUSTER_NAME}") or {}
    return [pod["metadata"]["name"] for pod in pods.get("items") or []]


def test_every_broker_pod_deleted_and_kept_down_raises_no_active(stack: Stack) -> None:
    """The operator stays up and makes the pods again, as it should; a ResourceQuota of no pods in
    the namespace keeps it from doing so (its creations are refused), so the brokers stay down."""
    relay = stack.relay
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-more-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    relay.cluster.kubectl("-n", relay.namespace, "apply", "-f", "-", input=json.dumps(quota))
    try:
        # The quota admission refuses everything until the quota controller has counted the
        # namespace's pods; once it has, it refuses only new pods.
        wait_for(
            "the quota counted",
            lambda: ((relay.get("resourcequota", "no-more-pods") or {}).get("status") or {}).get("used"),
            timeout=60,
        )
        relay.cluster.kubectl(
            "-n", relay.namespace, "delete", "pods", "-l", f"broker.failover.dev/cluster={CLUSTER_NAME}",
            "--timeout=120s", timeout=150,
        )  # fmt: skip
        stack.say("every broker pod deleted")
        alert = alert_of(stack, "BrokerClusterNoActiveBroker", stack.cluster_labels)
        assert alert["labels"]["severity"] == "critical"
        assert broker_pods(relay) == [], "a broker pod came back while the quota held"
        stack.say(f"phase {relay.status().get('phase')}")
    finally:
        relay.cluster.kubectl("-n", relay.namespace, "delete", "resourcequota", "no-more-pods", check=False)
    wait_healthy(stack)
    wait_alert_gone(stack, "BrokerClusterNoActiveBroker")


def ordering_report(result: str, violations: int) -> Report:
    """A validator report with what ``record_ordering`` reads: when, and the relay's verdict."""
    generated = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    clusters = {CLUSTER_NAME: {"result": result, "violations": violations}}
    return cast(Report, {"generatedAt": generated, "clusters": clusters})


def test_a_failed_ordering_verdict_raises_verdict_failed(stack: Stack) -> None:
    """The verdict is written by the validator's own ``record_ordering`` from a report saying Failed,
    standing in for a Spark run over a store with a planted violation: that run (the CronJob, its
    executor pods, the planted duplicate found) and its write are tested in test_validator_k8s; here
    what matters is what follows the write: the operator exports it and the alert fires."""
    relay = stack.relay
    record_ordering(
        ordering_report("Failed", 2), relay.namespace, "planted", api_client_factory=relay.cluster.api_client
    )
    stack.say("status.ordering: Failed, 2 violations")
    alert = alert_of(stack, "BrokerClusterOrderingVerdictFailed", stack.cluster_labels)
    assert alert["labels"]["severity"] == "critical"
    assert one_value(stack, f"broker_failover_ordering_violations{{{stack.selector}}}") == 2
    record_ordering(
        ordering_report("Passed", 0), relay.namespace, "clean", api_client_factory=relay.cluster.api_client
    )
    wait_alert_gone(stack, "BrokerClusterOrderingVerdictFailed")


def test_a_poisoned_stream_raises_held_messages_growing(stack: Stack) -> None:
    relay, prometheus, selector = stack.relay, stack.prometheus, stack.selector
    # The backend sends on up to the poison message, which the cloud refuses every time: after
    # spec.delivery.maxDeliveries the active broker holds it and blocks the stream (BlockStream).
    relay.backend("/sim/produce", {"count": POISON_SEQ - PER_STREAM + 5, "stream": POISON_STREAM})
    stack.say(f"produced up to {POISON_STREAM} seq {POISON_SEQ}, the poisoned message")
    holders = wait_for(
        "a message held in Prometheus",
        lambda: prometheus.query(f'broker_messages_held{{{selector}, direction="outbound"}} == 1'),
        timeout=120,
        interval=1,
    )
    [holder] = [sample["metric"]["broker"] for sample in holders]
    labels = {**stack.cluster_labels, "broker": holder, "direction": "outbound"}
    alert = alert_of(stack, "BrokerHeldMessagesGrowing", labels)
    assert alert["labels"]["severity"] == "warning"
    assert one_value(stack, f'sum(broker_streams_blocked{{{selector}, direction="outbound"}})') == 1


# What Grafana puts in place of its variables: the relay's BrokerCluster and operator, and a rate
# window over the whole module (its scenarios ran within it), as Grafana widens $__rate_interval
# with the time range shown.
def grafana_variables(stack: Stack) -> dict[str, str]:
    return {
        "$__rate_interval": "30m",
        "$__interval": "30s",
        "$__range": "1h",
        "$brokercluster_namespace": stack.relay.namespace,
        "$brokercluster": CLUSTER_NAME,
        "$operator_namespace": stack.relay.namespace,
    }


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads((CHART / "files" / "dashboard.json").read_text(encoding="utf-8"))
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found += [(inner["title"], target["expr"]) for target in inner.get("targets", [])]
    return found


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    """Last: the failover counters and durations, the heartbeat failures, the verdict and the held
    messages have series once the scenarios above have run; every query must then return a
    finite value from this Prometheus."""
    variables = grafana_variables(stack)
    queries = dashboard_queries()
    assert queries
    empty = []
    for title, template in queries:
        expr = template
        for variable in sorted(variables, key=len, reverse=True):
            expr = expr.replace(variable, variables[variable])
        assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
        try:
            values = stack.prometheus.values(expr)
        except PrometheusError as error:
            empty.append((title, expr, str(error)))
            continue
        if not finite(values):
            empty.append((title, expr, values))
    assert empty == [], "dashboard queries without data:\n" + "\n".join(map(str, empty))
    stack.say(f"{len(queries)} dashboard queries, each with data")
