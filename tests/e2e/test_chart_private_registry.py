"""The chart installed from a private registry's names, with a pull Secret, on the sealed cluster (issue 42).

A user pushes our images to a registry of their own and installs with ``image.registry`` and
``imagePullSecrets``. Here the "registry" is ``registry.example.test/bf``: the images ``make
images`` built are imported into the node's containerd under those names (``ctr images tag``), and
the cluster has no route out, so a pod that named any other image, or that the kubelet tried to
pull, would never start. The operator's pod must run ``registry.example.test/bf/operator:0.1.0``
with the pull Secret, its PriorityClass, pod labels and annotations, and its ServiceAccount must
carry the IRSA-style annotation; the API server admits all of it. ``logging.format: json`` must
turn the operator's log, and through the operator the brokers', into JSON lines. The operator it
runs then brings a BrokerCluster with no ``spec.image`` to Healthy: its brokers run the chart's
broker image from the same registry (the operator's ``OPERATOR_BROKER_IMAGE``, admitted by
``operator.brokerImages`` limited to that registry) with the pull Secret
(``OPERATOR_BROKER_IMAGE_PULL_SECRETS``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from local_cluster.cluster import REPO_ROOT
from local_cluster.relay import BACKEND_IMAGE, CLOUD_IMAGE, SIM_PORT, simulator_objects
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import installed_crd, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CHART = REPO_ROOT / "charts" / "broker-failover"
REGISTRY = "registry.example.test/bf"
TAG = "0.1.0"
PULL_SECRET = "regcred"


@pytest.fixture(scope="module")
def crd(sealed_cluster: SealedCluster) -> Iterator[None]:
    with installed_crd(sealed_cluster):
        yield


@pytest.fixture
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    name = f"registry-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: sealed_cluster.get_json(name, "serviceaccount", "default"))
    yield name
    sealed_cluster.helm("uninstall", "bf", "--namespace", name, "--wait", "--timeout=60s", check=False)
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def priority_class(sealed_cluster: SealedCluster, namespace: str) -> Iterator[str]:
    name = f"bf-{namespace}"
    manifest = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
    sealed_cluster.kubectl("apply", "-f", "-", input=json.dumps({**manifest, "value": 1000}))
    yield name
    sealed_cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found", check=False)


def preload_under_the_registry(cluster: SealedCluster) -> None:
    """Our images under the private registry's names, as if pulled from it once: present, so a
    pod with ``IfNotPresent`` starts without a pull (and the sealed cluster could not pull)."""
    for image in ("operator", "broker"):
        cluster.tag_image(f"localhost/broker-failover/{image}:{TAG}", f"{REGISTRY}/{image}:{TAG}")


def start_simulators(cluster: SealedCluster, namespace: str) -> dict[str, str]:
    """A backend and a cloud simulator behind Services of their names: brokers need both to activate."""
    objects = [*simulator_objects("backend", BACKEND_IMAGE, []), *simulator_objects("cloud", CLOUD_IMAGE, [])]
    listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=listing)
    return {name: f"http://{name}.{namespace}.svc:{SIM_PORT}" for name in ("backend", "cloud")}


def pulled_messages(cluster: SealedCluster, namespace: str, pod: str) -> list[str]:
    """The kubelet's ``Pulled`` events of a pod: "already present on machine" when nothing was pulled."""
    events = cluster.get_json(
        namespace, "events", f"--field-selector=involvedObject.name={pod},reason=Pulled"
    ) or {"items": []}
    return [str(event.get("message", "")) for event in events["items"]]


def started_from(cluster: SealedCluster, namespace: str, pod: dict[str, Any], image: str) -> None:
    """The pod's one container runs, started from ``image`` without a pull. The kubelet's
    ``Pulled`` event names the image of the spec; ``status.image`` would not do, as it names any
    one of the tags the runtime holds for that image (the localhost/ one and the registry's)."""
    name = pod["metadata"]["name"]
    assert pod["spec"]["containers"][0]["image"] == image, name
    (status,) = pod["status"]["containerStatuses"]
    assert "running" in status["state"], status
    # The kubelet records its events asynchronously: the container may be running a moment before.
    messages = wait_for(
        f"the kubelet's Pulled event of {name}", lambda: pulled_messages(cluster, namespace, name)
    )
    assert all(f'image "{image}" already present on machine' in m for m in messages), messages


def json_log_levels(cluster: SealedCluster, namespace: str, pod: str) -> set[str]:
    """The levels of a pod's log lines, each of which must be one JSON object (logging.format json)."""
    lines = [line for line in cluster.kubectl("-n", namespace, "logs", pod).stdout.splitlines() if line]
    assert lines, f"{pod} logged nothing"
    return {str(json.loads(line)["level"]) for line in lines}


def test_an_install_from_a_private_registry_runs_its_images_with_the_pull_secret(
    sealed_cluster: SealedCluster, namespace: str, priority_class: str, crd: None
) -> None:
    preload_under_the_registry(sealed_cluster)
    # The Secret a real registry would need; the node never uses it, as nothing is pulled.
    sealed_cluster.kubectl(
        "-n", namespace, "create", "secret", "docker-registry", PULL_SECRET,
        "--docker-server=registry.example.test", "--docker-username=bf", "--docker-password=not-a-password",
    )  # fmt: skip
    simulators = start_simulators(sealed_cluster, namespace)
    sealed_cluster.helm(
        "install", "bf", str(CHART),
        "--namespace", namespace,
        # The module's CRD (the crd fixture) is kubectl's, shared with other modules: not this release's.
        "--set", "crds.create=false",
        "--set", f"image.registry={REGISTRY}",
        "--set", f"imagePullSecrets={{{PULL_SECRET}}}",
        "--set", f"priorityClassName={priority_class}",
        "--set", "podAnnotations.example\\.test/owner=brokers-team",
        "--set", "operator.podLabels.tier=control",
        "--set", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/bf",
        "--set", f"operator.brokerImages={{{REGISTRY}/*}}",
        "--set", "logging.format=json",
        "--set", "logging.level=DEBUG",
        "--wait", "--timeout=120s",
        timeout=180,
    )  # fmt: skip

    (operator,) = sealed_cluster.get_json(namespace, "pods", "-l", "app.kubernetes.io/component=operator")[
        "items"
    ]
    spec = operator["spec"]
    (container,) = spec["containers"]
    assert container["imagePullPolicy"] == "IfNotPresent"
    # Present under that name, so the kubelet pulled nothing (it could not have: no route out).
    started_from(sealed_cluster, namespace, operator, f"{REGISTRY}/operator:{TAG}")
    assert spec["imagePullSecrets"] == [{"name": PULL_SECRET}]
    # The API server resolved the PriorityClass the chart named into the pod's priority.
    assert (spec["priorityClassName"], spec["priority"]) == (priority_class, 1000)
    assert operator["metadata"]["labels"]["tier"] == "control"
    assert operator["metadata"]["annotations"]["example.test/owner"] == "brokers-team"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["BROKER_FAILOVER_LOG_FORMAT"], env["BROKER_FAILOVER_LOG_LEVEL"]) == ("json", "DEBUG")
    assert "DEBUG" in json_log_levels(sealed_cluster, namespace, operator["metadata"]["name"])
    account = sealed_cluster.get_json(namespace, "serviceaccount", "bf-broker-failover")
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == "arn:aws:iam::1:role/bf"

    # The operator it runs makes broker pods of the same registry, admitted by operator.brokerImages:
    # a BrokerCluster that names no image runs the chart's, with the chart's pull Secret.
    manifest = {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "private"},
        "spec": {
            "account": "acme",
            "company": "7000",
            "replicas": 2,
            "backend": {"url": simulators["backend"]},
            "cloud": {"url": simulators["cloud"]},
        },
    }
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(manifest))

    def healthy() -> Any:
        status = (sealed_cluster.get_json(namespace, "bc", "private") or {}).get("status", {})
        return status if status.get("phase") == "Healthy" else None

    status = wait_for("BrokerCluster private to become Healthy from the private registry", healthy, 150)
    assert status["active"] in ("private-0", "private-1")
    brokers = sealed_cluster.get_json(namespace, "pods", "-l", "broker.failover.dev/cluster=private")["items"]
    assert sorted(pod["metadata"]["name"] for pod in brokers) == ["private-0", "private-1"]
    for pod in brokers:
        started_from(sealed_cluster, namespace, pod, f"{REGISTRY}/broker:{TAG}")
        assert pod["spec"]["imagePullSecrets"][0] == {"name": PULL_SECRET}, pod["spec"]["imagePullSecrets"]
        # The chart's logging values reach the brokers through the operator.
        assert json_log_levels(sealed_cluster, namespace, pod["metadata"]["name"]), pod["metadata"]["name"]
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "private", "--wait=true", "--timeout=60s")
