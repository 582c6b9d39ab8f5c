"""The e2e's Prometheus configuration (local_cluster.prometheus_config, local_cluster.kubernetes_sd)
says what the chart's monitors say.

The scrape configs are derived from the rendered ServiceMonitor and PodMonitor, so the two cannot
drift; this checks the derivation: ``promtool check config`` accepts it, a broker pod as
``controller/builders.py`` makes it and the chart's metrics Service come out of the emulated
discovery and the relabelling as the targets the chart's alerts expect (``job``,
``brokercluster``, ``brokercluster_namespace``, ``broker``), and a field the translation does not
know fails it instead of being dropped.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_operator.controller import builders, names
from broker_operator.controller.spec import parse_spec
from local_cluster.kubernetes_sd import discover
from local_cluster.prometheus_config import (
    UnsupportedMonitorFieldError,
    prometheus_config,
    rule_groups,
    with_file_discovery,
)
from tests.monitoring.chart import NAMESPACE, RELEASE, documents, one, promtool

pytestmark = pytest.mark.needs("tools")  # helm (make tools) and promtool (make monitoring-packages)

ON = (
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.podMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
)


def relabel(labels: dict[str, str], steps: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus's relabelling (``replace``, ``keep``, ``drop``, anchored RE2 regexes, which
    Python's ``re`` reads alike for these), then its defaults: None for a dropped target."""
    labels = dict(labels)
    for step in steps:
        value = step.get("separator", ";").join(
            labels.get(name, "") for name in step.get("source_labels", [])
        )
        match = re.fullmatch(step.get("regex", "(.*)"), value)
        action = step.get("action", "replace")
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            groups = [match.group(0), *match.groups()]
            replacement = step.get("replacement", "$1")
            labels[step["target_label"]] = re.sub(
                r"\$\{?(\d+)\}?", lambda m, groups=groups: groups[int(m[1])] or "", replacement
            )
    return {name: value for name, value in labels.items() if not name.startswith("__meta_")}


def targets(
    config: dict[str, Any], job: str, listed: dict[str, list[dict[str, Any]]]
) -> list[dict[str, str]]:
    [scrape] = [scrape for scrape in config["scrape_configs"] if scrape["job_name"].startswith(job)]
    [discovery] = scrape["kubernetes_sd_configs"]
    found = []
    for group in discover(discovery["role"], listed):
        labels = relabel({"__address__": group["targets"][0], **group["labels"]}, scrape["relabel_configs"])
        if labels is not None:
            found.append(labels)
    return found


def broker_pod(ordinal: int) -> dict[str, Any]:
    owner = {
        "apiVersion": "v1",
        "kind": "BrokerCluster",
        "metadata": {"name": "orders", "namespace": NAMESPACE},
    }
    pod = builders.build_pod(
        owner, ordinal, parse_spec("orders", {"account": "acme", "company": "1000"}), active=False
    )
    pod["metadata"]["namespace"] = NAMESPACE
    pod["status"] = {"podIP": f"10.0.0.{ordinal + 10}", "phase": "Running"}
    return pod


def test_the_config_passes_promtool_and_the_rules_are_the_prometheus_rules_groups(tmp_path: Path) -> None:
    docs = documents(*ON)
    config, jobs = with_file_discovery(
        prometheus_config(docs, interval="2s", rules_file=str(tmp_path / "r.yml")), str(tmp_path)
    )
    assert [job["role"] for job in jobs] == ["pod", "endpoints"]
    assert all(job["namespaces"] == [NAMESPACE] for job in jobs)
    (tmp_path / "r.yml").write_text(yaml.safe_dump({"groups": rule_groups(docs)}))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    checked = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert rule_groups(docs) == one(docs, "PrometheusRule")["spec"]["groups"]


def test_broker_pods_become_targets_with_their_brokerclusters_labels() -> None:
    config = prometheus_config(documents(*ON), interval="2s", rules_file="r.yml")
    other = {"metadata": {"name": "backend", "namespace": NAMESPACE, "labels": {"app": "backend"}},
             "spec": {"containers": [{"name": "main", "ports": [{"containerPort": 8080}]}]},
             "status": {"podIP": "10.0.0.99", "phase": "Running"}}  # fmt: skip
    found = targets(config, "podMonitor/", {"pods": [broker_pod(0), broker_pod(1), other]})
    assert [t["__address__"] for t in found] == [
        f"10.0.0.10:{names.BROKER_PORT}",
        f"10.0.0.11:{names.BROKER_PORT}",
    ]
    [scrape] = [scrape for scrape in config["scrape_configs"] if scrape["job_name"].startswith("podMonitor/")]
    assert (scrape["scheme"], scrape["tls_config"]) == ("https", {"insecure_skip_verify": True})
    wanted = {"brokercluster": "orders", "brokercluster_namespace": NAMESPACE, "broker": "orders-0"}
    assert wanted.items() <= found[0].items()
    assert found[0]["pod"] == "orders-0"


def test_the_operators_pod_behind_the_metrics_service_is_the_alerts_job() -> None:
    docs = documents(*ON)
    config = prometheus_config(docs, interval="2s", rules_file="r.yml")
    service = one(docs, "Service")
    deployment = one(docs, "Deployment")
    pod = {
        "metadata": {
            "name": "op-1",
            "namespace": NAMESPACE,
            "labels": deployment["spec"]["template"]["metadata"]["labels"],
        },
        "spec": deployment["spec"]["template"]["spec"],
        "status": {"podIP": "10.0.0.5", "phase": "Running"},
    }
    [port] = service["spec"]["ports"]
    number = next(
        p["containerPort"]
        for c in pod["spec"]["containers"]
        for p in c.get("ports", [])
        if p["name"] == port["targetPort"]
    )
    endpoints = {
        "metadata": {"name": service["metadata"]["name"], "namespace": NAMESPACE},
        "subsets": [{"addresses": [{"ip": "10.0.0.5", "targetRef": {"kind": "Pod", "name": "op-1"}}],
                     "ports": [{"name": port["name"], "port": number}]}],
    }  # fmt: skip
    [target] = targets(
        config, "serviceMonitor/", {"pods": [pod], "services": [service], "endpoints": [endpoints]}
    )
    assert target["job"] == f"{RELEASE}-broker-failover-metrics"  # the alerts' ${operatorJob}
    assert (target["namespace"], target["pod"], target["__address__"]) == (
        NAMESPACE,
        "op-1",
        f"10.0.0.5:{number}",
    )
    rules = yaml.safe_dump(rule_groups(docs))
    assert f'job="{target["job"]}", namespace="{NAMESPACE}"' in rules


def test_a_monitor_field_the_translation_does_not_know_fails_it() -> None:
    monitor = one(documents(*ON), "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["metricRelabelings"] = [{"action": "drop"}]
    with pytest.raises(UnsupportedMonitorFieldError, match="metricRelabelings"):
        prometheus_config([monitor], interval="2s", rules_file="r.yml")
