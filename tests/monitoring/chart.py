"""What the monitoring tests share: the chart rendered by the real helm, promtool, and the metric
names the code defines.

``helm`` is the one ``make tools`` builds, ``promtool`` Debian's (``make monitoring-packages``);
under ``make test`` both come in the first prerequisite group, ``tools`` (the modules are marked
``needs("tools")``). Nothing here mocks either: the rules promtool checks are the ones
``helm template`` renders, and the metric names are read from the registries the operator and the
brokers serve, not from a list kept by hand.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from local_cluster.cluster import REPO_ROOT, built_tools_dir

CHART = REPO_ROOT / "charts" / "broker-failover"
RUNBOOKS = REPO_ROOT / "docs" / "runbooks"
RELEASE, NAMESPACE = "bf", "bf-system"
SEVERITIES = frozenset({"critical", "warning", "info"})  # the monitoring-mixins style guide's


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool not found: `make monitoring-packages` installs Debian's prometheus package"
    return found


def render(*values: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``helm template bf charts/broker-failover -n bf-system --set VALUE ...``."""
    helm = built_tools_dir() / "helm"
    assert helm.exists(), f"{helm} not built: `make tools` builds it"
    argv = [str(helm), "template", RELEASE, str(CHART), "-n", NAMESPACE]
    for value in values:
        argv += ["--set", value]
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120)


@cache
def _rendered(values: tuple[str, ...]) -> str:
    return render(*values).stdout


def documents(*values: str) -> list[dict[str, Any]]:
    """The rendered documents, parsed anew on each call (a test may change what it gets)."""
    return [doc for doc in yaml.safe_load_all(_rendered(values)) if doc]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} rendered"
    return found[0]


def rule_groups(*values: str) -> list[dict[str, Any]]:
    """The PrometheusRule's ``spec.groups`` as the chart renders them, with the rules on."""
    rule = one(documents("monitoring.prometheusRule.enabled=true", *values), "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alerts(*values: str) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in rule_groups(*values) for rule in group["rules"]}


def write_rules(groups: list[dict[str, Any]], path: Path) -> Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def dashboard() -> dict[str, Any]:
    import json

    config_map = one(documents("monitoring.grafanaDashboard.enabled=true"), "ConfigMap")
    loaded: dict[str, Any] = json.loads(config_map["data"]["broker-failover.json"])
    return loaded


# ---- metric names ----------------------------------------------------------------------------

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created", ""),
    "gauge": ("",),
    "info": ("_info",),
}


@cache
def defined_metric_names() -> frozenset[str]:
    """Every sample name the operator's default registry (the engine's and the controller's metrics,
    prometheus_client's process and Python collectors) and a broker's registry can export, plus
    ``up``, which Prometheus adds to every target."""
    from prometheus_client import REGISTRY

    import broker_operator.metrics  # noqa: F401  (registers the operator's metrics)
    from broker_service.metrics import BrokerMetrics

    names = {"up"}
    for registry in (REGISTRY, BrokerMetrics().registry):
        for family in registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
            names.update(sample.name for sample in family.samples)
    return frozenset(names)


_KEYWORDS = frozenset(
    [
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "atan2",
        "inf",
        "nan",
    ]
)
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords,
    label names or values, durations or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, function arguments
    text = re.sub(r"\{[^}]*\}", " ", text)  # matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if not call and name not in _KEYWORDS:
            names.add(name)
    return names
