"""A real Prometheus beside a relay on the sealed local cluster, scraping and alerting as the chart says.

:func:`deploy_prometheus` renders the chart with its monitoring on (``helm template``, the same
release, namespace and values as the installed relay), turns the ServiceMonitor and PodMonitor into
scrape configs (:mod:`local_cluster.prometheus_config`), takes the PrometheusRule's ``spec.groups``
as the rules file unchanged, and runs Debian's Prometheus (image ``broker-failover/prometheus``,
``make images``) in the relay's namespace: a ServiceAccount with a Role to read pods, Services and
Endpoints there, a ConfigMap with ``prometheus.yml`` and ``rules.yml``, a Deployment and a Service.
Debian builds Prometheus without Kubernetes discovery, so a second container of the pod
(:mod:`local_cluster.kubernetes_sd`, in the operator's image for its Python) lists those objects and
writes the targets, with the ``__meta_kubernetes_*`` labels Prometheus's own discovery gives them,
as ``file_sd`` files; the monitors' relabelling applies to them as it is. The Prometheus
Operator's CRDs are not installed: nothing of the chart's monitoring is applied, only its rendering
read.

:class:`Prometheus` reads its HTTP API through the API server's service proxy
(``/api/v1/namespaces/<ns>/services/prometheus:9090/proxy/...``, ``kubectl get --raw``), so
nothing but the API server is called from outside the cluster's network.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from local_cluster import kubernetes_sd
from local_cluster.image_build import TAG as IMAGE_TAG
from local_cluster.prometheus_config import prometheus_config, rule_groups, with_file_discovery
from local_cluster.relay import CHART, Relay, wait_until
from local_cluster.sealed_cluster import SealedCluster

IMAGE = f"localhost/broker-failover/prometheus:{IMAGE_TAG}"
# The discovery beside it (local_cluster.kubernetes_sd) needs Python alone: the operator's image has it.
DISCOVERY_IMAGE = f"localhost/broker-failover/operator:{IMAGE_TAG}"
NAME = "prometheus"
PORT = 9090
CONFIG_DIR = "/etc/prometheus"
RULES_FILE = f"{CONFIG_DIR}/rules.yml"
TARGETS_DIR = "/targets"  # the file_sd files, an emptyDir the two containers share
MONITORING_ON = (
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.podMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
)


def rendered_monitoring(
    cluster: SealedCluster, release: str, namespace: str, values: dict[str, str]
) -> list[dict[str, Any]]:
    """The chart's documents as ``helm template`` renders them for ``release`` in ``namespace`` with
    ``values`` and the monitors and rules on: the operator's job name and namespace in the rules
    are then those of the installed release."""
    settings = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    for value in MONITORING_ON:
        settings += ["--set", value]
    text = cluster.helm("template", release, str(CHART), "--namespace", namespace, *settings).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def prometheus_objects(
    namespace: str, config: dict[str, Any], groups: list[dict[str, Any]], jobs: list[dict[str, Any]]
) -> list[Any]:
    """The ServiceAccount, Role, RoleBinding, ConfigMap, Deployment and Service of the Prometheus;
    ``config`` with ``file_sd_configs`` that the discovery container writes for ``jobs``
    (``prometheus_config.with_file_discovery``)."""
    labels = {"app.kubernetes.io/name": NAME}
    discovery = ["get", "list", "watch"]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": NAME},
        "data": {
            "prometheus.yml": yaml.safe_dump(config, sort_keys=False),
            "rules.yml": yaml.safe_dump({"groups": groups}, sort_keys=False),
            "kubernetes_sd.py": Path(kubernetes_sd.__file__).read_text(encoding="utf-8"),
            "jobs.json": json.dumps(jobs),
        },
    }
    restricted = {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    container = {
        "name": NAME,
        "image": IMAGE,
        "args": [
            f"--config.file={CONFIG_DIR}/prometheus.yml",
            "--storage.tsdb.path=/prometheus",
            "--storage.tsdb.retention.time=2h",
            f"--web.listen-address=:{PORT}",
        ],
        "ports": [{"name": "web", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {"path": "/-/ready", "port": PORT}, "periodSeconds": 1},
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "data", "mountPath": "/prometheus"},
            {"name": "targets", "mountPath": TARGETS_DIR, "readOnly": True},
        ],
        "securityContext": restricted,
    }
    discovery_container = {
        "name": "kubernetes-sd",
        "image": DISCOVERY_IMAGE,
        "command": ["python3.11", f"{CONFIG_DIR}/kubernetes_sd.py", f"{CONFIG_DIR}/jobs.json"],
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "targets", "mountPath": TARGETS_DIR},
        ],
        "securityContext": restricted,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    # Debian's nobody, as the image's USER.
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65534,
                        "runAsGroup": 65534,
                        "fsGroup": 65534,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container, discovery_container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": NAME}},
                        {"name": "data", "emptyDir": {}},
                        {"name": "targets", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": NAME},
            # What Kubernetes discovery reads, in this namespace only (the monitors name no other).
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "services", "endpoints"], "verbs": discovery},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": discovery},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
        },
        config_map,
        deployment,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, "labels": labels},
            "spec": {"selector": labels, "ports": [{"name": "web", "port": PORT, "targetPort": PORT}]},
        },
    ]


class PrometheusError(RuntimeError):
    """Prometheus's API answered with an error, or not at all."""


@dataclass
class Prometheus:
    cluster: SealedCluster
    namespace: str
    config: dict[str, Any]  # prometheus.yml as deployed
    groups: list[dict[str, Any]]  # the rules file's groups, the chart's PrometheusRule's spec.groups

    def api(self, path: str, **query: str) -> Any:
        """``GET /api/v1/<path>?<query>`` of Prometheus through the API server's service proxy, its
        ``data``."""
        url = f"/api/v1/namespaces/{self.namespace}/services/{NAME}:{PORT}/proxy/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        result = self.cluster.kubectl("get", "--raw", url, check=False, timeout=30)
        if result.returncode != 0:
            raise PrometheusError(f"GET {url}: {result.stderr.strip()}")
        reply = json.loads(result.stdout)
        if reply.get("status") != "success":
            raise PrometheusError(f"GET {url}: {reply}")
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now (a scalar as one sample without labels)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return list(data["result"])
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PrometheusError(f"{expr}: a {data['resultType']}, not a vector")

    def values(self, expr: str) -> list[float]:
        return [float(sample["value"][1]) for sample in self.query(expr)]

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert pending or firing now (``/api/v1/alerts``)."""
        return list(self.api("alerts")["alerts"])

    def alerts_named(self, name: str) -> list[dict[str, Any]]:
        return [alert for alert in self.alerts() if alert["labels"].get("alertname") == name]

    def active_targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def last_evaluation(self) -> str:
        """When the rule groups were last evaluated (RFC 3339), the latest of them."""
        groups = self.api("rules")["groups"]
        return max((str(group.get("lastEvaluation", "")) for group in groups), default="")

    def wait_evaluated(self, rounds: int, timeout: float = 60) -> None:
        """Wait (bounded) until the rules were evaluated ``rounds`` more times from now."""
        seen = {self.last_evaluation()}

        def evaluated() -> bool:
            seen.add(self.last_evaluation())
            return len(seen) > rounds

        wait_until(f"{rounds} evaluations of the rules", evaluated, timeout, 0.5)


def finite(values: list[float]) -> bool:
    return any(not math.isnan(value) and not math.isinf(value) for value in values)


def deploy_prometheus(
    relay: Relay, values: dict[str, str], *, interval: str = "2s", timeout: float = 180
) -> Prometheus:
    """Prometheus in ``relay``'s namespace with the chart's monitors (as scrape configs) and rules,
    rendered with ``values`` (the relay's helm values and whatever else, such as short ``for:``
    values); ``interval``: scrape and evaluation interval. Returns once it is ready and has loaded
    the rules."""
    documents = rendered_monitoring(relay.cluster, relay.release, relay.namespace, values)
    kubernetes_config = prometheus_config(documents, interval=interval, rules_file=RULES_FILE)
    config, jobs = with_file_discovery(kubernetes_config, TARGETS_DIR)
    groups = rule_groups(documents)
    items = prometheus_objects(relay.namespace, config, groups, jobs)
    relay.cluster.kubectl(
        "-n", relay.namespace, "apply", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )  # fmt: skip
    prometheus = Prometheus(relay.cluster, relay.namespace, config, groups)
    started = time.monotonic()

    def rules_loaded() -> bool:
        try:
            loaded = prometheus.api("rules")["groups"]
        except PrometheusError:
            return False
        return [group["name"] for group in loaded] == [group["name"] for group in groups]

    wait_until("Prometheus ready with the chart's rules loaded", rules_loaded, timeout, 1)
    print(f"prometheus: ready after {time.monotonic() - started:.1f}s", flush=True)
    return prometheus
