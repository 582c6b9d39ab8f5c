"""The Helm chart, installed with the real (Go-built) helm into the real API server.

What this proves that the operator's own e2e tests do not: the chart renders and
lints, refuses the two unsafe value combinations with a message, and the
operator it deploys runs *in-cluster* (the node agent gives the pod a
service-account token, so every API call goes through the chart's RBAC) and
brings a BrokerCluster to Healthy with broker pods of its own. A missing verb in
the ClusterRole shows up here as a cluster that never gets an active broker.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.cluster import REPO_ROOT, LocalCluster, built_tools_dir
from tests.e2e.support import free_port, get_json, wait_for

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "charts" / "broker-failover"
VENV_BIN = REPO_ROOT / ".venv" / "bin"


def test_chart_lints_and_renders_the_crd_from_crds_folder(kube_cluster: LocalCluster) -> None:
    lint = kube_cluster.helm("lint", str(CHART), check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = kube_cluster.helm("template", "bf", str(CHART), "--include-crds").stdout
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(rendered) if doc}
    assert ("CustomResourceDefinition", "brokerclusters.broker.failover.dev") in kinds
    assert {"Deployment", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Service"} <= {
        kind for kind, _ in kinds
    }
    # One copy of the CRD: the chart's is the file in crds/, not a drifting duplicate.
    crd = next(
        doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "CustomResourceDefinition"
    )
    source = yaml.safe_load((REPO_ROOT / "crds" / "broker.failover.dev_brokerclusters.yaml").read_text())
    assert crd == source


def render_pod_specs(*values: str) -> dict[str, dict[str, Any]]:
    """``helm template`` (the built helm; no cluster needed): every pod spec the chart renders, by
    where it comes from, including the executor pod template Spark reads from a ConfigMap."""
    helm = built_tools_dir() / "helm"
    rendered = subprocess.run(
        [str(helm), "template", "bf", str(CHART), *values], capture_output=True, text=True, check=True
    ).stdout
    specs: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(rendered):
        if not doc:
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "Deployment":
            specs[where] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "CronJob":
            specs[where] = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        elif doc["kind"] == "ConfigMap":
            for key, text in doc["data"].items():
                embedded = yaml.safe_load(text)
                if isinstance(embedded, dict) and embedded.get("kind") == "Pod":
                    specs[f"{where}/{key}"] = embedded["spec"]
    return specs


def test_every_pod_the_chart_renders_is_non_root_with_a_read_only_root() -> None:
    """The "restricted" Pod Security Standard's fields, as the operator gives the broker pods
    (tests/unit/controller/test_builders.py): uid/gid 10001, no escalation, no capabilities, the
    runtime's seccomp profile, a read-only root with an emptyDir for /tmp."""
    specs = render_pod_specs(
        "--set", "validator.enabled=true", "--set", "validator.store.claimName=logs",
        "--set", "validator.executors=2",
    )  # fmt: skip
    assert set(specs) == {
        "Deployment/bf-broker-failover",
        "CronJob/bf-broker-failover-validator",
        "ConfigMap/bf-broker-failover-validator-executor/executor-pod-template.yaml",
    }
    for where, spec in specs.items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, where
        assert (pod["runAsUser"], pod["runAsGroup"]) == (10001, 10001), where
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, where
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            assert container["securityContext"] == {
                "readOnlyRootFilesystem": True,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }, where
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], where
    # The validator's pods write into the store the brokers write: the same group owns it.
    validator = [where for where in specs if "validator" in where]
    assert [specs[where]["securityContext"]["fsGroup"] for where in validator] == [10001, 10001]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (["--set", "operator.replicas=2"], "operator.replicas > 1 needs operator.peering"),
        (["--set", "validator.enabled=true"], "validator.store.claimName must name the message-log claim"),
        # values.schema.json: a wrong type, a typo and a bad pattern are refused naming the field.
        (["--set", "operator.replicas=two"], "/operator/replicas"),
        (["--set", "operator.replicaz=2"], "additional properties 'replicaz' not allowed"),
        (["--set", "validator.executorMemory=1gb"], "/validator/executorMemory"),
        (["--set", "operator.image.pullPolicy=Sometimes"], "/operator/image/pullPolicy"),
    ],
)
def test_unsafe_values_are_refused_with_the_reason(
    kube_cluster: LocalCluster, values: list[str], complaint: str
) -> None:
    result = kube_cluster.helm("template", "bf", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))


def test_the_api_server_accepts_every_example_and_the_rendered_chart(
    kube_cluster: LocalCluster, release: str
) -> None:
    """Server-side dry runs: the CRD's schema and CEL rules, and every object the chart renders."""
    kube_cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "broker.failover.dev_brokerclusters.yaml"))
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/brokerclusters.broker.failover.dev", "--timeout=60s"
    )
    assert len(EXAMPLES) >= 4
    for example in EXAMPLES:
        result = kube_cluster.kubectl(
            "-n", release, "apply", "--dry-run=server", "-f", str(example), check=False
        )
        assert result.returncode == 0, f"{example.name}: {result.stderr}"
    for values in ([], ["--set", "validator.enabled=true", "--set", "validator.store.claimName=logs"]):
        rendered = kube_cluster.helm("template", "bf", str(CHART), "--namespace", release, *values).stdout
        result = kube_cluster.kubectl(
            "-n", release, "apply", "--dry-run=server", "-f", "-", input=rendered, check=False
        )
        assert result.returncode == 0, f"helm template {' '.join(values)}: {result.stderr}"


@pytest.fixture
def release(kube_cluster: LocalCluster) -> Iterator[str]:
    namespace = f"chart-{uuid.uuid4().hex[:6]}"
    kube_cluster.kubectl("create", "namespace", namespace)
    wait_for("default ServiceAccount", lambda: get_json(kube_cluster, namespace, "serviceaccount", "default"))
    yield namespace
    kube_cluster.helm("uninstall", "bf", "--namespace", namespace, "--wait", "--timeout=60s", check=False)
    kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def simulators(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A backend and a cloud simulator on loopback: brokers refuse to activate without them."""
    ports = {"backend": free_port(), "cloud": free_port()}
    processes = [
        subprocess.Popen(
            [str(VENV_BIN / f"{name}-simulator"), "--host", "127.0.0.1", "--port", str(port)],
            stdout=(tmp_path / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, port in ports.items()
    ]
    try:
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    finally:
        for process in processes:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def test_the_installed_operator_runs_a_cluster_through_the_charts_rbac(
    kube_cluster: LocalCluster, release: str, simulators: dict[str, str]
) -> None:
    namespace = release
    kube_cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "broker.failover.dev_brokerclusters.yaml"))
    installed = kube_cluster.helm(
        "install", "bf", str(CHART),
        "--namespace", namespace,
        "--set", f"operator.watchNamespaces={{{namespace}}}",
        # Pods share this host's network here: ports must be free on it.
        "--set", f"operator.metricsPort={free_port()}",
        "--set", f"operator.healthPort={free_port()}",
        "--wait", "--timeout=120s",
    )  # fmt: skip
    # NOTES.txt tells the user how to see state, for this release's names.
    assert "kubectl get brokerclusters" in installed.stdout
    assert f"kubectl logs -n {namespace} deploy/bf-broker-failover" in installed.stdout
    (operator_pod,) = get_json(kube_cluster, namespace, "pods", "-l", "app.kubernetes.io/component=operator")[
        "items"
    ]
    assert operator_pod["spec"]["serviceAccountName"] == "bf-broker-failover"

    manifest = {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "charted"},
        "spec": {
            "account": "acme",
            "company": "7000",
            "replicas": 2,
            "backend": {"url": simulators["backend"]},
            "cloud": {"url": simulators["cloud"]},
            # The policy's create goes through the chart's RBAC, and the chart tells the operator
            # who it is (OPERATOR_POD_NAMESPACE, OPERATOR_POD_LABELS) for the policy to admit.
            "networkPolicy": {"enabled": True},
        },
    }
    kube_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(manifest))

    def healthy() -> Any:
        status = (get_json(kube_cluster, namespace, "bc", "charted") or {}).get("status", {})
        return status if status.get("phase") == "Healthy" else None

    status = wait_for("BrokerCluster charted to become Healthy under the charted operator", healthy, 120)
    assert status["active"] == "charted-0"
    active_pods = get_json(kube_cluster, namespace, "pods", "-l", "role=active")["items"]
    assert [pod["metadata"]["name"] for pod in active_pods] == ["charted-0"]
    # The policy admits the brokers' admin port from exactly the operator pod the chart runs.
    policy = get_json(kube_cluster, namespace, "networkpolicy", "charted-brokers-ingress")
    (operator_peer,) = policy["spec"]["ingress"][0]["from"]
    assert operator_peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    selected = operator_peer["podSelector"]["matchLabels"]
    assert selected.items() <= operator_pod["metadata"]["labels"].items()
    assert selected["app.kubernetes.io/component"] == "operator"
    kube_cluster.kubectl("-n", namespace, "delete", "bc", "charted", "--wait=true", "--timeout=60s")

    # Least privilege, checked against what the operator really asked the API server for.
    account = f"system:serviceaccount:{namespace}:bf-broker-failover"
    calls = audited_calls(kube_cluster, account)
    refused = sorted(f"{verb} {resource}" for verb, resource, code in calls if code == 403)
    assert not refused, f"the chart's RBAC refused calls the operator makes: {refused}"
    used = {(verb, resource) for verb, resource, _ in calls}
    granted = granted_by_chart(kube_cluster, namespace)
    assert granted - used - GRANTED_FOR_PATHS_THIS_TEST_DOES_NOT_TAKE == set(), "granted, never used"
    assert granted >= GRANTED_FOR_PATHS_THIS_TEST_DOES_NOT_TAKE


# What the chart grants for code paths this test does not take, each with the path.
GRANTED_FOR_PATHS_THIS_TEST_DOES_NOT_TAKE = {
    ("delete", "/pods"),  # a rolling update replaces a pod (reconcile.py, StepKind.DELETE_POD)
    ("get", "/pods"),  # whenScaled: Delete waits until a surplus pod is gone (claims.py)
    ("delete", "/persistentvolumeclaims"),  # spec.persistentVolumeClaimRetentionPolicy.whenScaled: Delete
    ("patch", "/persistentvolumeclaims"),  # a retention policy change re-owns existing claims
    ("patch", "networking.k8s.io/networkpolicies"),  # spec.networkPolicy changed, or an operator restart
    ("delete", "networking.k8s.io/networkpolicies"),  # spec.networkPolicy.enabled set back to false
}


def audited_calls(cluster: LocalCluster, user: str) -> list[tuple[str, str, int]]:
    """(verb, group/resource[/subresource], HTTP code) of every request ``user`` made (audit log)."""
    calls = []
    for line in cluster.control_plane.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef")
        if event["user"]["username"] != user or not ref:
            continue
        resource = f"{ref.get('apiGroup', '')}/{ref['resource']}" + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        calls.append((event["verb"], resource, event.get("responseStatus", {}).get("code", 0)))
    return calls


def granted_by_chart(cluster: LocalCluster, namespace: str) -> set[tuple[str, str]]:
    """(verb, group/resource) pairs the release's ClusterRole and its Role in ``namespace`` grant."""
    roles = [
        get_json(cluster, namespace, "clusterrole", "bf-broker-failover"),
        get_json(cluster, namespace, "role", "bf-broker-failover"),
    ]
    return {
        (verb, f"{group}/{resource}")
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
