"""The Grafana dashboard the chart ships (files/dashboard.json in a ConfigMap for Grafana's sidecar):
every query parses, as Prometheus itself parses it, and reads only metrics the code defines.

Grafana is not available here (docs/monitoring.md), so the queries are checked the way Prometheus
would see them: Grafana's variables replaced by what Grafana sends, each query made a recording
rule, and ``promtool check rules`` over them. That every panel returns data after traffic is the
real-Prometheus e2e's to show.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring.chart import (
    CHART,
    dashboard,
    defined_metric_names,
    documents,
    metric_names_in,
    one,
    promtool,
)

pytestmark = pytest.mark.needs("tools")  # helm (make tools) and promtool (make monitoring-packages)

# What Grafana puts in place of its variables before a query reaches Prometheus.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "1h",
    "$brokercluster_namespace": "shop|erp",
    "$brokercluster": ".*",
    "$operator_namespace": "broker-failover",
}


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel, rows' nested panels included."""
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found += [(inner["title"], target["expr"]) for target in inner.get("targets", [])]
    return found


def as_prometheus_sees_it(expr: str) -> str:
    for variable in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(variable, GRAFANA_VARIABLES[variable])
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


def test_the_config_map_is_the_file_labelled_for_grafanas_sidecar() -> None:
    config_map = one(documents("monitoring.grafanaDashboard.enabled=true"), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"]["broker-failover.json"] == (
        CHART / "files" / "dashboard.json"
    ).read_text().rstrip("\n")
    moved = one(
        documents(
            "monitoring.grafanaDashboard.enabled=true",
            "monitoring.grafanaDashboard.namespace=grafana",
            "monitoring.grafanaDashboard.labels.grafana_dashboard=null",
            "monitoring.grafanaDashboard.labels.dashboards=brokers",
        ),
        "ConfigMap",
    )
    assert moved["metadata"]["namespace"] == "grafana"
    assert moved["metadata"]["labels"]["dashboards"] == "brokers"
    assert "grafana_dashboard" not in moved["metadata"]["labels"]


def test_every_query_parses(tmp_path: Path) -> None:
    board = dashboard()
    rules = [
        {"record": f"dashboard:query_{index}", "expr": as_prometheus_sees_it(expr)}
        for index, (_title, expr) in enumerate(queries(board))
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_a_broken_query_fails_the_check(tmp_path: Path) -> None:
    """The check above can fail: promtool refuses a query with a missing parenthesis."""
    path = tmp_path / "broken.yaml"
    rule = {"record": "dashboard:broken", "expr": "sum by (a) (rate(x_total[1m])"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [rule]}]}))
    result = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0


def test_every_metric_a_panel_reads_is_defined_by_the_code() -> None:
    defined = defined_metric_names()
    unknown = {
        title: sorted(metric_names_in(expr) - defined)
        for title, expr in queries(dashboard())
        if metric_names_in(expr) - defined
    }
    assert unknown == {}
    assert all(metric_names_in(expr) for _title, expr in queries(dashboard()))


def test_the_panels_the_issue_asks_for_are_there() -> None:
    """Per cluster: phase, active broker and epoch, failovers, heartbeats and their failures and
    latency, messages accepted, confirmed and held by direction, the validator's verdict; per
    operator process: CPU, clusters driven, API requests."""
    read = {metric for _title, expr in queries(dashboard()) for metric in metric_names_in(expr)}
    assert read >= {
        "broker_failover_phase",
        "broker_active",
        "broker_failover_epoch",
        "broker_failover_failovers_total",
        "broker_failover_heartbeats_total",
        "broker_failover_heartbeat_failures_total",
        "broker_failover_heartbeat_seconds_bucket",
        "broker_messages_accepted_total",
        "broker_messages_confirmed_total",
        "broker_messages_held",
        "broker_failover_ordering_verdict",
        "process_cpu_seconds_total",
        "broker_failover_clusters_driven",
        "broker_failover_kube_requests_total",
    }
    # Every query of a per-cluster metric is narrowed by the dashboard's two variables.
    per_process = {
        "broker_failover_clusters_driven",
        "broker_failover_kube_requests_total",
        "broker_failover_reconciles_total",
        "broker_failover_heartbeat_seconds_bucket",
        "broker_failover_failover_duration_seconds_bucket",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    }
    for title, expr in queries(dashboard()):
        if metric_names_in(expr) - per_process:
            assert 'brokercluster_namespace=~"$brokercluster_namespace"' in expr, title
            assert 'brokercluster=~"$brokercluster"' in expr, title
        else:
            assert 'namespace=~"$operator_namespace"' in expr, title
