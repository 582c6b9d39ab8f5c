"""The chart's ServiceMonitor and PodMonitor as plain Prometheus scrape configs (issue 43).

The local cluster has no Prometheus Operator, so a Prometheus there cannot read the chart's
monitors. Instead of writing its scrape configs by hand (which would drift from the chart), they
are derived here from the monitors ``helm template`` renders, the way the Prometheus Operator
generates them (its ``pkg/prometheus/promcfg.go``): Kubernetes service discovery (role
``endpoints`` for a ServiceMonitor, ``pod`` for a PodMonitor) in the monitor's namespaces, ``keep``
steps for its selector and port, the target labels the operator sets (``namespace``, ``service``,
``pod``, ``container``, ``job``, ``endpoint``), then the monitor's own ``relabelings``.

Only the fields the chart's monitors use are translated; any other field raises
:class:`UnsupportedMonitorFieldError`, so a monitor that grows one fails the e2e test here rather than
being scraped differently from what a real Prometheus Operator would do.
"""

from __future__ import annotations

import re
from typing import Any

# The endpoint fields translated below; anything else in a rendered endpoint is refused.
ENDPOINT_FIELDS = frozenset(
    {"port", "path", "scheme", "interval", "scrapeTimeout", "tlsConfig", "relabelings", "honorLabels"}
)
TLS_FIELDS = {"insecureSkipVerify": "insecure_skip_verify"}
RELABEL_FIELDS = {
    "sourceLabels": "source_labels",
    "targetLabel": "target_label",
    "separator": "separator",
    "regex": "regex",
    "replacement": "replacement",
    "modulus": "modulus",
}


class UnsupportedMonitorFieldError(ValueError):
    """A rendered monitor has a field this translation does not know."""


def quote_meta(text: str) -> str:
    """``text`` as a regular expression matching it alone (Go's ``regexp.QuoteMeta``, which the
    Prometheus Operator uses: ``-`` stays as it is)."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def sanitized(label: str) -> str:
    """A Kubernetes label name as Prometheus's discovery spells it in ``__meta_*`` labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _namespaces(monitor: dict[str, Any]) -> dict[str, Any]:
    """The discovery's ``namespaces``: the selector's names, every namespace for ``any``, else the
    monitor's own (as the Prometheus Operator does)."""
    selector = monitor["spec"].get("namespaceSelector") or {}
    if selector.get("any"):
        return {}
    names = selector.get("matchNames") or [monitor["metadata"]["namespace"]]
    return {"namespaces": {"names": list(names)}}


def _selector_keeps(selector: dict[str, Any], role: str) -> list[dict[str, Any]]:
    """``keep`` steps for a label selector on the discovered objects' labels (``role``: ``service``
    or ``pod``)."""
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise UnsupportedMonitorFieldError(f"selector fields {sorted(unknown)}")
    steps: list[dict[str, Any]] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        name = sanitized(key)
        steps.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_{role}_label_{name}",
                    f"__meta_kubernetes_{role}_labelpresent_{name}",
                ],
                "regex": f"({quote_meta(value)});true",
            }
        )
    for expression in selector.get("matchExpressions") or []:
        if expression["operator"] != "Exists":
            raise UnsupportedMonitorFieldError(f"matchExpressions operator {expression['operator']!r}")
        steps.append(
            {
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_{role}_labelpresent_{sanitized(expression['key'])}"],
                "regex": "true",
            }
        )
    return steps


def _relabelings(endpoint: dict[str, Any]) -> list[dict[str, Any]]:
    steps = []
    for step in endpoint.get("relabelings") or []:
        unknown = set(step) - set(RELABEL_FIELDS) - {"action"}
        if unknown:
            raise UnsupportedMonitorFieldError(f"relabeling fields {sorted(unknown)}")
        translated = {RELABEL_FIELDS[key]: value for key, value in step.items() if key != "action"}
        translated["action"] = str(step.get("action", "replace")).lower()
        steps.append(translated)
    return steps


def _endpoint_settings(endpoint: dict[str, Any]) -> dict[str, Any]:
    unknown = set(endpoint) - ENDPOINT_FIELDS
    if unknown:
        raise UnsupportedMonitorFieldError(f"endpoint fields {sorted(unknown)}")
    if endpoint.get("honorLabels"):
        raise UnsupportedMonitorFieldError("honorLabels: true")
    settings: dict[str, Any] = {
        "honor_labels": False,
        "metrics_path": endpoint.get("path", "/metrics"),
        "scheme": endpoint.get("scheme", "http"),
    }
    if "interval" in endpoint:
        settings["scrape_interval"] = endpoint["interval"]
    if "scrapeTimeout" in endpoint:
        settings["scrape_timeout"] = endpoint["scrapeTimeout"]
    tls = endpoint.get("tlsConfig") or {}
    if unknown_tls := set(tls) - set(TLS_FIELDS):
        raise UnsupportedMonitorFieldError(f"tlsConfig fields {sorted(unknown_tls)}")
    if tls:
        settings["tls_config"] = {TLS_FIELDS[key]: value for key, value in tls.items()}
    return settings


def drop_finished_pods() -> dict[str, Any]:
    """A pod that has finished is no target (the Prometheus Operator drops them likewise)."""
    return {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}


def service_monitor_scrape_config(monitor: dict[str, Any]) -> dict[str, Any]:
    """The scrape config of a ServiceMonitor with one endpoint (the chart's has one)."""
    meta, spec = monitor["metadata"], monitor["spec"]
    [endpoint] = spec["endpoints"]
    port = endpoint["port"]
    relabel = [
        *_selector_keeps(spec["selector"], "service"),
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port},
        drop_finished_pods(),
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        # The job is the Service's name: what the chart's alerts select the operator by.
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
        {"target_label": "endpoint", "replacement": port},
        *_relabelings(endpoint),
    ]
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
        **_endpoint_settings(endpoint),
        "kubernetes_sd_configs": [{"role": "endpoints", **_namespaces(monitor)}],
        "relabel_configs": relabel,
    }


def pod_monitor_scrape_config(monitor: dict[str, Any]) -> dict[str, Any]:
    """The scrape config of a PodMonitor with one endpoint (the chart's has one)."""
    meta, spec = monitor["metadata"], monitor["spec"]
    [endpoint] = spec["podMetricsEndpoints"]
    port = endpoint["port"]
    relabel = [
        *_selector_keeps(spec["selector"], "pod"),
        drop_finished_pods(),
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        {"target_label": "endpoint", "replacement": port},
        *_relabelings(endpoint),
    ]
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        **_endpoint_settings(endpoint),
        "kubernetes_sd_configs": [{"role": "pod", **_namespaces(monitor)}],
        "relabel_configs": relabel,
    }


def scrape_configs(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ServiceMonitor's and PodMonitor's scrape config among rendered ``documents``."""
    configs = []
    for doc in documents:
        if doc.get("kind") == "ServiceMonitor":
            configs.append(service_monitor_scrape_config(doc))
        elif doc.get("kind") == "PodMonitor":
            configs.append(pod_monitor_scrape_config(doc))
    return configs


def prometheus_config(documents: list[dict[str, Any]], *, interval: str, rules_file: str) -> dict[str, Any]:
    """``prometheus.yml`` for the rendered monitors, evaluating ``rules_file`` every ``interval``
    (also the scrape interval of a monitor that names none)."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [rules_file],
        "scrape_configs": scrape_configs(documents),
    }


def rule_groups(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered PrometheusRule's ``spec.groups``, exactly: a rules file of them is what the
    Prometheus Operator hands its Prometheus."""
    [rule] = [doc for doc in documents if doc.get("kind") == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def with_file_discovery(
    config: dict[str, Any], directory: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``config`` with each job's ``kubernetes_sd_configs`` replaced by a ``file_sd_configs`` file in
    ``directory``, and the jobs :mod:`local_cluster.kubernetes_sd` is to write those files for
    (Debian's Prometheus has no Kubernetes discovery; the relabelling stays as it is)."""
    jobs = []
    scrapes = []
    for index, scrape in enumerate(config["scrape_configs"]):
        [discovery] = scrape["kubernetes_sd_configs"]
        names = (discovery.get("namespaces") or {}).get("names")
        if not names:
            raise UnsupportedMonitorFieldError("namespaceSelector any: the emulated discovery needs names")
        file = f"{directory}/{index}.json"
        jobs.append({"file": file, "role": discovery["role"], "namespaces": list(names)})
        translated = {key: value for key, value in scrape.items() if key != "kubernetes_sd_configs"}
        translated["file_sd_configs"] = [{"files": [file], "refresh_interval": "2s"}]
        scrapes.append(translated)
    return {**config, "scrape_configs": scrapes}, jobs
