"""The Helm chart, installed with the real (Go-built) helm into the real API server.

What this proves that the operator's own e2e tests do not: the chart renders and
lints, refuses the two unsafe value combinations with a message, and the
operator it deploys runs *in-cluster* as a pod of the operator image on the sealed
cluster's real kubelet (its projected service-account token, so every API call goes
through the chart's RBAC) and brings a BrokerCluster to Healthy with broker pods of
its own, against simulator pods. A missing verb in the ClusterRole shows up here as
a cluster that never gets an active broker, and the API server's audit log shows
every call the operator made.

The render-only tests use the sealed cluster for its API server and helm alone.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from broker_operator.controller.peering import PEERING_OBJECT_WAIT_SECONDS
from local_cluster.cluster import REPO_ROOT, built_tools_dir
from local_cluster.control_plane import audit_events
from local_cluster.relay import BACKEND_IMAGE, CLOUD_IMAGE, SIM_PORT, simulator_objects
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import installed_crd, wait_for

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "charts" / "broker-failover"


def test_chart_lints_and_renders(sealed_cluster: SealedCluster) -> None:
    """The chart lints and renders; its CRD (a template, crds.create) is checked in
    test_crd_upgrade.py, which installs and upgrades it."""
    lint = sealed_cluster.helm("lint", str(CHART), check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = sealed_cluster.helm("template", "bf", str(CHART)).stdout
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(rendered) if doc}
    assert ("CustomResourceDefinition", "brokerclusters.broker.failover.dev") in kinds
    assert {"Deployment", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Service"} <= {
        kind for kind, _ in kinds
    }


def render(*values: str) -> list[dict[str, Any]]:
    """``helm template`` with the built helm (no cluster needed): the rendered documents."""
    helm = built_tools_dir() / "helm"
    rendered = subprocess.run(
        [str(helm), "template", "bf", str(CHART), *values], capture_output=True, text=True, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def render_pod_specs(*values: str) -> dict[str, dict[str, Any]]:
    """``helm template`` (the built helm; no cluster needed): every pod spec the chart renders, by
    where it comes from, including the executor pod template Spark reads from a ConfigMap."""
    specs: dict[str, dict[str, Any]] = {}
    for doc in render(*values):
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


def test_the_operator_is_not_restarted_while_it_waits_for_its_peering_object() -> None:
    # kopf answers /healthz only after its startup handlers, and announce_peer may wait
    # PEERING_OBJECT_WAIT_SECONDS for the peering object: the startup probe must outlast that.
    docs = render("--set", "operator.replicas=2", "--set", "operator.peering=bfp")
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    startup, liveness = container["startupProbe"], container["livenessProbe"]
    assert startup["httpGet"] == liveness["httpGet"]
    allowed = startup["periodSeconds"] * startup["failureThreshold"]
    assert allowed >= PEERING_OBJECT_WAIT_SECONDS + 20, startup  # the wait, the imports, the settle
    assert liveness.get("timeoutSeconds", 1) >= 5, liveness


def test_shards_render_a_deployment_peering_and_budget_each() -> None:
    docs = render(
        "--set", "operator.shards=3", "--set", "operator.replicas=2", "--set", "operator.peering=bfp",
    )  # fmt: skip
    deployments = [doc for doc in docs if doc["kind"] == "Deployment"]
    shards = {}
    for deployment in deployments:
        env = {
            e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        selector = deployment["spec"]["selector"]["matchLabels"]
        # The pods carry what the selector selects, and no other shard's Deployment selects them.
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        shards[deployment["metadata"]["name"]] = (env["OPERATOR_SHARD"], env["OPERATOR_PEERING"], selector)
    assert {name: shard[:2] for name, shard in shards.items()} == {
        f"bf-broker-failover-shard-{i}": (f"{i}/3", f"bfp-shard-{i}") for i in range(3)
    }
    assert len({tuple(sorted(selector.items())) for _, _, selector in shards.values()}) == 3
    # The default install watches the release namespace: a KopfPeering there per shard.
    peerings = sorted(doc["metadata"]["name"] for doc in docs if doc["kind"] == "KopfPeering")
    assert peerings == ["bfp-shard-0", "bfp-shard-1", "bfp-shard-2"]
    budgets = {
        doc["metadata"]["name"]: doc["spec"]["selector"]["matchLabels"]
        for doc in docs
        if doc["kind"] == "PodDisruptionBudget"
    }
    assert budgets == {
        name.replace("-shard-", "-shard-"): selector for name, (_, _, selector) in shards.items()
    }
    # One shard (the default) renders one Deployment with neither the shard label nor the variable.
    (single,) = [doc for doc in render() if doc["kind"] == "Deployment"]
    env = {e["name"] for e in single["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert single["metadata"]["name"] == "bf-broker-failover" and "OPERATOR_SHARD" not in env
    assert "broker.failover.dev/shard" not in single["spec"]["selector"]["matchLabels"]


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str | None]:
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_default_install_writes_only_in_the_release_namespace() -> None:
    """Issue 39: the narrow install is the default. Every namespaced rule is in a Role in the release
    namespace; the ClusterRole only reads the cluster-scoped things kopf, the drain handling and the
    journal claims' growth need (tests/unit/test_rbac_docs.py compares every rule with the docs)."""
    docs = render("--namespace", "brokers")
    placed = sorted(
        (doc["kind"], doc["metadata"].get("namespace"))
        for doc in docs
        if doc["kind"] in ("Role", "RoleBinding")
    )
    assert placed == [("Role", "brokers"), ("RoleBinding", "brokers")]
    (role,) = [doc for doc in docs if doc["kind"] == "Role"]
    assert any("secrets" in rule["resources"] for rule in role["rules"])
    (cluster_role,) = [doc for doc in docs if doc["kind"] == "ClusterRole"]
    for rule in cluster_role["rules"]:
        if rule["resources"] == ["storageclasses"]:  # read by name: may a journal claim grow?
            assert rule["verbs"] == ["get"], rule
            continue
        assert set(rule["verbs"]) <= {"list", "watch"}, rule
        assert set(rule["resources"]) <= {"customresourcedefinitions", "namespaces", "nodes"}, rule
    assert operator_env(docs)["OPERATOR_NAMESPACES"] == "brokers"
    assert not [doc for doc in docs if doc["kind"].startswith("ValidatingAdmissionPolicy")]
    # Endpoints mode reaches no host until the installer lists some (set, and empty).
    assert operator_env(docs)["OPERATOR_ENDPOINT_HOSTS"] == ""
    assert operator_env(docs)["OPERATOR_BROKER_POD_SECURITY"] == "restricted"
    # Brokers serve TLS by default (ARCHITECTURE.md "Channels and trust"); false is the opt-out.
    assert operator_env(docs)["OPERATOR_BROKER_TLS"] == "true"
    assert operator_env(render("--set", "operator.brokerTls=false"))["OPERATOR_BROKER_TLS"] == "false"
    listed = render("--set", "operator.endpointHosts={*.erp.example.com,10.20.0.0/16}")
    assert operator_env(listed)["OPERATOR_ENDPOINT_HOSTS"] == "*.erp.example.com,10.20.0.0/16"
    # Given namespaces: a Role in each, none in the release namespace unless listed.
    docs = render("--namespace", "brokers", "--set", "operator.watchNamespaces={erp,hr}")
    placed = sorted((doc["kind"], doc["metadata"].get("namespace")) for doc in docs if doc["kind"] == "Role")
    assert placed == [("Role", "erp"), ("Role", "hr")]
    assert operator_env(docs)["OPERATOR_NAMESPACES"] == "erp,hr"


def test_cluster_wide_renders_a_cluster_role_and_the_writes_guard() -> None:
    docs = render("--namespace", "brokers", "--set", "operator.clusterWide=true")
    assert not [doc for doc in docs if doc["kind"] in ("Role", "RoleBinding")]
    (cluster_role,) = [doc for doc in docs if doc["kind"] == "ClusterRole"]
    assert any("endpointslices" in rule["resources"] for rule in cluster_role["rules"])
    assert operator_env(docs)["OPERATOR_NAMESPACES"] == ""
    (policy,) = [doc for doc in docs if doc["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [doc for doc in docs if doc["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (condition,) = policy["spec"]["matchConditions"]
    assert "'system:serviceaccount:brokers:bf-broker-failover'" in condition["expression"]
    guarded = {
        resource
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for resource in rule["resources"]
    }
    assert {"endpointslices", "networkpolicies", "pods", "secrets", "services"} <= guarded
    # Cluster-wide with a namespace list is a contradiction: refused, saying so.
    helm = built_tools_dir() / "helm"
    both = ["--set", "operator.clusterWide=true", "--set", "operator.watchNamespaces={erp}"]
    refused = subprocess.run(
        [str(helm), "template", "bf", str(CHART), *both], capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0 and "operator.clusterWide watches every namespace" in refused.stderr
    # The guard can be left out (a cluster without admissionregistration.k8s.io/v1), never silently.
    docs = render(
        "--namespace", "brokers", "--set", "operator.clusterWide=true", "--set", "operator.writesGuard=false"
    )
    assert not [doc for doc in docs if doc["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (
            ["--set", "operator.replicas=2", "--set", "operator.standalone=true"],
            "operator.replicas > 1 needs peering (operator.standalone: false)",
        ),
        (["--set", "validator.enabled=true"], "validator.store.claimName must name the message-log claim"),
        # values.schema.json: a wrong type, a typo and a bad pattern are refused naming the field.
        (["--set", "operator.replicas=two"], "/operator/replicas"),
        (["--set", "operator.replicaz=2"], "additional properties 'replicaz' not allowed"),
        (["--set", "validator.executorMemory=1gb"], "/validator/executorMemory"),
        (["--set-string", r"validator.sparkConf.spark\.a=x\,y"], "/validator/sparkConf/spark.a"),
        (["--set-string", "validator.sparkConf.other=1"], "'other' does not match pattern"),
        (["--set", "operator.image.pullPolicy=Sometimes"], "/operator/image/pullPolicy"),
    ],
)
def test_unsafe_values_are_refused_with_the_reason(
    sealed_cluster: SealedCluster, values: list[str], complaint: str
) -> None:
    result = sealed_cluster.helm("template", "bf", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))


def test_the_api_server_accepts_every_example_and_the_rendered_chart(
    sealed_cluster: SealedCluster, release: str, crd: None
) -> None:
    """Server-side dry runs: the CRD's schema and CEL rules, and every object the chart renders."""
    assert len(EXAMPLES) >= 4
    for example in EXAMPLES:
        result = sealed_cluster.kubectl(
            "-n", release, "apply", "--dry-run=server", "-f", str(example), check=False
        )
        assert result.returncode == 0, f"{example.name}: {result.stderr}"
    # The chart peers by default: its KopfPeering needs kopf's CRD, which `helm install` takes
    # from the chart's crds/ and `helm template` leaves out. (The BrokerCluster CRD is a template,
    # rendered and dry-run applied here like the rest.)
    sealed_cluster.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds" / "kopf.dev_peerings.yaml"))
    for values in ([], ["--set", "validator.enabled=true", "--set", "validator.store.claimName=logs"]):
        rendered = sealed_cluster.helm("template", "bf", str(CHART), "--namespace", release, *values).stdout
        result = sealed_cluster.kubectl(
            "-n", release, "apply", "--dry-run=server", "-f", "-", input=rendered, check=False
        )
        assert result.returncode == 0, f"helm template {' '.join(values)}: {result.stderr}"


@pytest.fixture(scope="module")
def crd(sealed_cluster: SealedCluster) -> Iterator[None]:
    """The CRD while this module runs: applied once another module's deletion of it is over (the
    session's cluster is shared), deleted at the end."""
    with installed_crd(sealed_cluster):
        yield


@pytest.fixture
def release(sealed_cluster: SealedCluster) -> Iterator[str]:
    namespace = f"chart-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    wait_for(
        "default ServiceAccount", lambda: sealed_cluster.get_json(namespace, "serviceaccount", "default")
    )
    yield namespace
    sealed_cluster.helm("uninstall", "bf", "--namespace", namespace, "--wait", "--timeout=60s", check=False)
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def simulators(sealed_cluster: SealedCluster, release: str) -> dict[str, str]:
    """A backend and a cloud simulator as pods (their images) behind Services of their names, in
    the release's namespace (gone with it): brokers refuse to activate without them."""
    objects = [
        *simulator_objects("backend", BACKEND_IMAGE, []),
        *simulator_objects("cloud", CLOUD_IMAGE, []),
    ]
    sealed_cluster.kubectl(
        "-n", release, "apply", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )  # fmt: skip

    def ready(name: str) -> bool:
        conditions = ((sealed_cluster.get_json(release, "pod", name) or {}).get("status") or {}).get(
            "conditions"
        ) or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for("both simulator pods ready", lambda: ready("backend") and ready("cloud"), 120)
    # The brokers reach them by their Services' names, through CoreDNS and kube-proxy.
    return {name: f"http://{name}.{release}.svc:{SIM_PORT}" for name in ("backend", "cloud")}


def test_the_installed_operator_runs_a_cluster_through_the_charts_rbac(
    sealed_cluster: SealedCluster, release: str, simulators: dict[str, str], crd: None
) -> None:
    namespace = release
    installed = sealed_cluster.helm(
        "install", "bf", str(CHART),
        "--namespace", namespace,
        "--set", f"operator.watchNamespaces={{{namespace}}}",
        # The module's CRD (the crd fixture) is kubectl's, shared with other modules: not this release's.
        "--set", "crds.create=false",
        "--wait", "--timeout=120s",
        timeout=180,
    )  # fmt: skip
    # NOTES.txt tells the user how to see state, for this release's names.
    assert "kubectl get brokerclusters" in installed.stdout
    assert f"kubectl logs -n {namespace} deploy/bf-broker-failover" in installed.stdout
    (operator_pod,) = sealed_cluster.get_json(
        namespace, "pods", "-l", "app.kubernetes.io/component=operator"
    )["items"]
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
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(manifest))

    def healthy() -> Any:
        status = (sealed_cluster.get_json(namespace, "bc", "charted") or {}).get("status", {})
        return status if status.get("phase") == "Healthy" else None

    status = wait_for("BrokerCluster charted to become Healthy under the charted operator", healthy, 120)
    assert status["active"] == "charted-0"
    active_pods = sealed_cluster.get_json(namespace, "pods", "-l", "role=active")["items"]
    assert [pod["metadata"]["name"] for pod in active_pods] == ["charted-0"]
    # The policy admits the brokers' admin port from exactly the operator pod the chart runs.
    policy = sealed_cluster.get_json(namespace, "networkpolicy", "charted-brokers-ingress")
    (operator_peer,) = policy["spec"]["ingress"][0]["from"]
    assert operator_peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    selected = operator_peer["podSelector"]["matchLabels"]
    assert selected.items() <= operator_pod["metadata"]["labels"].items()
    assert selected["app.kubernetes.io/component"] == "operator"
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "charted", "--wait=true", "--timeout=60s")

    # Least privilege, checked against what the operator really asked the API server for.
    account = f"system:serviceaccount:{namespace}:bf-broker-failover"
    calls = audited_calls(sealed_cluster, account)
    refused = sorted(f"{verb} {resource}" for verb, resource, code in calls if code == 403)
    assert not refused, f"the chart's RBAC refused calls the operator makes: {refused}"
    used = {(verb, resource) for verb, resource, _ in calls}
    granted = granted_by_chart(sealed_cluster, namespace)
    assert granted - used - GRANTED_FOR_PATHS_THIS_TEST_DOES_NOT_TAKE == set(), "granted, never used"
    assert granted >= GRANTED_FOR_PATHS_THIS_TEST_DOES_NOT_TAKE


# What the chart grants for code paths this test does not take, each with the path.
GRANTED_FOR_PATHS_THIS_TEST_DOES_NOT_TAKE = {
    ("delete", "/pods"),  # a rolling update replaces a pod (reconcile.py, StepKind.DELETE_POD)
    ("get", "/pods"),  # whenScaled: Delete waits until a surplus pod is gone (claims.py)
    ("delete", "/persistentvolumeclaims"),  # spec.persistentVolumeClaimRetentionPolicy.whenScaled: Delete
    ("patch", "/persistentvolumeclaims"),  # a retention policy change re-owns claims; a larger size
    ("get", "storage.k8s.io/storageclasses"),  # a larger spec.storage.size (test_claim_growth.py)
    ("patch", "networking.k8s.io/networkpolicies"),  # spec.networkPolicy changed, or an operator restart
    ("delete", "networking.k8s.io/networkpolicies"),  # spec.networkPolicy.enabled set back to false
    ("update", "discovery.k8s.io/endpointslices"),  # the -active slice re-pointed: a later failover
    ("patch", "policy/poddisruptionbudgets"),  # drainWithoutStandby: Evict, a drain with no standby
    ("patch", "/secrets"),  # a token rotated: the brokers' verifier Secret rewritten (verifiers.py)
    # The epoch's compare-and-swap reads the object only when kopf's live view was behind (epochs.py).
    ("get", "broker.failover.dev/brokerclusters"),
    # Converting a -active Service of the selector era (test_active_service.py takes this path):
    ("patch", "/services"),
    ("delete", "/endpoints"),
    ("delete", "discovery.k8s.io/endpointslices"),
}


def audited_calls(cluster: SealedCluster, user: str) -> list[tuple[str, str, int]]:
    """(verb, group/resource[/subresource], HTTP code) of every request ``user`` made (audit log).

    The sealed cluster's API server writes it under the cluster's directory, on the machine's
    file system (``ControlPlane.audit_log``: ``<workdir>/logs/audit.log``, and the parts rotated
    out of it)."""
    calls = []
    for event in audit_events(cluster.workdir / "logs" / "audit.log"):
        ref = event.get("objectRef")
        if event["user"]["username"] != user or not ref:
            continue
        resource = f"{ref.get('apiGroup', '')}/{ref['resource']}" + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        calls.append((event["verb"], resource, event.get("responseStatus", {}).get("code", 0)))
    return calls


def granted_by_chart(cluster: SealedCluster, namespace: str) -> set[tuple[str, str]]:
    """(verb, group/resource) pairs the release's ClusterRole and its Role in ``namespace`` grant."""
    roles = [
        cluster.get_json(namespace, "clusterrole", "bf-broker-failover"),
        cluster.get_json(namespace, "role", "bf-broker-failover"),
    ]
    return {
        (verb, f"{group}/{resource}")
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
