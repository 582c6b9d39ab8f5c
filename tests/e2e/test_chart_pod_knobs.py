"""The chart's registry, pull Secret, pod and logging values (issue 42), by where ``helm template`` puts them.

Render-only: the built helm (``make tools``) and no cluster. Every new value is set at once and
followed to the object it must reach: the operator's Deployment and ServiceAccount, the variables
the operator hands on to broker pods (``OPERATOR_BROKER_IMAGE``, ``OPERATOR_BROKER_IMAGE_PULL_SECRETS``),
the validator's CronJob pod and ServiceAccount, and the executor pod template Spark reads from a
ConfigMap. The defaults must still render the images ``make images`` builds and nothing else new
in any pod. ``test_chart_private_registry.py`` installs the same values on the local cluster.
"""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.cluster import REPO_ROOT, built_tools_dir
from local_cluster.image_build import IMAGES

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "charts" / "broker-failover"
BUILT = {spec.reference for spec in IMAGES}
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64

# Every value issue 42 added, set to something other than its default.
EVERY_VALUE: dict[str, Any] = {
    "image": {"registry": "registry.example.test/bf"},
    "imagePullSecrets": ["regcred", {"name": "mirror-cred"}],
    "priorityClassName": "bf-high",
    "podAnnotations": {"team": "brokers", "shared": "global"},
    "podLabels": {"cost-center": "42", "tier": "global"},
    "logging": {"format": "json", "level": "DEBUG"},
    "operator": {
        "image": {"repository": "operator", "tag": "1.2.3", "digest": DIGEST_A},
        "defaultBrokerImage": {"repository": "brokers/broker", "tag": "2.0.0"},
        "priorityClassName": "bf-operator",
        "podAnnotations": {"shared": "operator"},
        "podLabels": {"tier": "operator"},
        "brokerImages": ["registry.example.test/bf/*"],
    },
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/operator"}},
    "validator": {
        "enabled": True,
        "store": {"claimName": "logs"},
        "executors": 2,
        "image": {"digest": DIGEST_B},
        "podAnnotations": {"shared": "validator"},
        "podLabels": {"tier": "validator"},
        "nodeSelector": {"pool": "batch"},
        "tolerations": [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "v@p.iam.gserviceaccount.com"}},
    },
}
VALIDATOR_ON = {"validator": {"enabled": True, "store": {"claimName": "logs"}, "executors": 2}}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(built_tools_dir() / "helm"), *args], capture_output=True, text=True, check=False, timeout=60
    )


def values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def render(tmp_path: Path, values: dict[str, Any], *flags: str) -> dict[str, dict[str, Any]]:
    """The rendered objects by ``Kind/name``, plus the executor pod template as ``ExecutorPod``."""
    result = helm("template", "bf", str(CHART), "-f", values_file(tmp_path, values), *flags)
    assert result.returncode == 0, result.stderr
    objects = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(result.stdout) if d}
    executor = objects.get("ConfigMap/bf-broker-failover-validator-executor")
    if executor:
        objects["ExecutorPod"] = yaml.safe_load(executor["data"]["executor-pod-template.yaml"])
    return objects


def refusal(tmp_path: Path, values: dict[str, Any]) -> str:
    result = helm("template", "bf", str(CHART), "-f", values_file(tmp_path, values))
    assert result.returncode != 0, "rendered values the chart must refuse"
    return result.stderr


def operator_pod(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return dict(objects["Deployment/bf-broker-failover"]["spec"]["template"])


def validator_pod(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return dict(objects["CronJob/bf-broker-failover-validator"]["spec"]["jobTemplate"]["spec"]["template"])


def env_of(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_every_new_value_lands_where_it_belongs(tmp_path: Path) -> None:
    objects = render(tmp_path, EVERY_VALUE)
    pulls = [{"name": "regcred"}, {"name": "mirror-cred"}]

    operator = operator_pod(objects)
    (container,) = operator["spec"]["containers"]
    assert container["image"] == f"registry.example.test/bf/operator:1.2.3@{DIGEST_A}"
    assert operator["spec"]["imagePullSecrets"] == pulls
    assert operator["spec"]["priorityClassName"] == "bf-operator"  # the component's wins
    labels = operator["metadata"]["labels"]
    assert (labels["tier"], labels["cost-center"], labels["app.kubernetes.io/component"]) == (
        "operator", "42", "operator",
    )  # fmt: skip
    assert operator["metadata"]["annotations"] == {"team": "brokers", "shared": "operator"}
    env = env_of(container)
    assert (env["BROKER_FAILOVER_LOG_FORMAT"], env["BROKER_FAILOVER_LOG_LEVEL"]) == ("json", "DEBUG")
    # What the operator gives the broker pods: the default image under the registry, the Secrets.
    assert env["OPERATOR_BROKER_IMAGE"] == "registry.example.test/bf/brokers/broker:2.0.0"
    assert env["OPERATOR_BROKER_IMAGE_PULL_SECRETS"] == "regcred,mirror-cred"
    assert objects["ServiceAccount/bf-broker-failover"]["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/operator"
    }

    driver = validator_pod(objects)
    executor = objects["ExecutorPod"]
    (driver_container,) = driver["spec"]["containers"]
    (executor_container,) = executor["spec"]["containers"]
    image = f"registry.example.test/bf/validator@{DIGEST_B}"
    assert driver_container["image"] == image
    assert env_of(driver_container)["VALIDATOR_IMAGE"] == image  # the executors' image
    # The driver and the executors carry the same placement, Secrets and pod metadata.
    for where, pod in (("driver", driver), ("executor", executor)):
        spec = pod["spec"]
        assert spec["imagePullSecrets"] == pulls, where
        assert spec["priorityClassName"] == "bf-high", where  # the global one: none of its own
        assert spec["nodeSelector"] == {"pool": "batch"}, where
        assert spec["tolerations"] == EVERY_VALUE["validator"]["tolerations"], where
        assert spec["affinity"] == EVERY_VALUE["validator"]["affinity"], where
        assert pod["metadata"]["annotations"] == {"team": "brokers", "shared": "validator"}, where
        assert {"tier": "validator", "cost-center": "42"}.items() <= pod["metadata"]["labels"].items(), where
    for container in (driver_container, executor_container):
        env = env_of(container)
        assert (env["BROKER_FAILOVER_LOG_FORMAT"], env["BROKER_FAILOVER_LOG_LEVEL"]) == ("json", "DEBUG")
    # Pull Secrets reach executors through the template, not a Spark property in VALIDATOR_SPARK_CONF.
    assert "VALIDATOR_SPARK_CONF" not in env_of(driver_container)
    assert objects["ServiceAccount/bf-broker-failover-validator"]["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "v@p.iam.gserviceaccount.com"
    }


def test_the_defaults_render_the_built_images_and_nothing_new_in_any_pod(tmp_path: Path) -> None:
    objects = render(tmp_path, VALIDATOR_ON)
    operator, driver, executor = operator_pod(objects), validator_pod(objects), objects["ExecutorPod"]
    (container,) = operator["spec"]["containers"]
    env = env_of(container)
    images = {
        container["image"],
        driver["spec"]["containers"][0]["image"],
        str(env["OPERATOR_BROKER_IMAGE"]),
    }
    assert images == {
        f"localhost/broker-failover/{name}:0.1.0" for name in ("operator", "validator", "broker")
    }
    assert images <= BUILT
    assert env["OPERATOR_BROKER_IMAGE_PULL_SECRETS"] == ""
    assert (env["BROKER_FAILOVER_LOG_FORMAT"], env["BROKER_FAILOVER_LOG_LEVEL"]) == ("text", "INFO")
    for where, pod in (("operator", operator), ("driver", driver), ("executor", executor)):
        new = {"imagePullSecrets", "priorityClassName", "nodeSelector", "tolerations"} & set(pod["spec"])
        assert not new, where
        assert "annotations" not in pod["metadata"], where
        # Only the chart's own labels, as before.
        owners = {key.split("/")[0] for key in pod["metadata"]["labels"]}
        assert owners <= {"app.kubernetes.io", "helm.sh"}, where
    assert "affinity" not in driver["spec"] and "affinity" not in executor["spec"]
    # The operator's default affinity stays: replicas prefer different nodes.
    assert "podAntiAffinity" in operator["spec"]["affinity"]
    for account in ("ServiceAccount/bf-broker-failover", "ServiceAccount/bf-broker-failover-validator"):
        assert "annotations" not in objects[account]["metadata"], account


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        # A registry host in the repository: as written (the values of earlier charts).
        ({"repository": "registry.example.com/bf/operator"}, "registry.example.com/bf/operator:0.1.0"),
        ({"repository": "localhost/broker-failover/operator"}, "localhost/broker-failover/operator:0.1.0"),
        ({"repository": "localhost:5000/operator", "tag": "dev"}, "localhost:5000/operator:dev"),
        # No registry host: under image.registry (it used to mean Docker Hub).
        ({"repository": "team/operator"}, "registry.example.test/bf/team/operator:0.1.0"),
        ({"repository": "operator", "digest": DIGEST_A}, f"registry.example.test/bf/operator@{DIGEST_A}"),
    ],
)  # fmt: skip
def test_a_repository_goes_under_the_registry_unless_it_names_one(
    tmp_path: Path, image: dict[str, str], expected: str
) -> None:
    objects = render(
        tmp_path, {"image": {"registry": "registry.example.test/bf"}, "operator": {"image": image}}
    )
    assert operator_pod(objects)["spec"]["containers"][0]["image"] == expected


@pytest.mark.parametrize(
    "pattern",
    [
        "registry.example.test/bf/*",
        "registry.example.test/*/broker:?.?.?",
        "registry.example.test/bf/broker:[0-9]*",
        "registry.example.test/bf/broker:[!0-9]*",
        "registryXexample.test/bf/*",  # a dot is a dot, as in fnmatch
        "registry.example.test/bf/broker",
        "*/broker:2.0.0",
    ],
)
def test_the_default_broker_image_is_checked_against_broker_images_as_the_operator_would(
    tmp_path: Path, pattern: str
) -> None:
    """The chart refuses a default broker image ``operator.brokerImages`` would refuse, using the
    operator's own rule (``fnmatch.fnmatchcase``, pod_security.BrokerImages) as the oracle."""
    values = {
        "image": {"registry": "registry.example.test/bf"},
        "operator": {"defaultBrokerImage": {"tag": "2.0.0"}, "brokerImages": [pattern]},
    }
    image = "registry.example.test/bf/broker:2.0.0"
    result = helm("template", "bf", str(CHART), "-f", values_file(tmp_path, values))
    if fnmatch.fnmatchcase(image, pattern):
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0
        assert f"operator.defaultBrokerImage ({image}) matches none of operator.brokerImages" in result.stderr


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        # The selectors and the brokers' NetworkPolicy find the operator by these labels.
        (
            {"podLabels": {"app.kubernetes.io/component": "x"}},
            "podLabels: app.kubernetes.io/component is one",
        ),
        (
            {"operator": {"podLabels": {"app.kubernetes.io/instance": "x"}}},
            "app.kubernetes.io/instance is one",
        ),
        ({"operator": {"image": {"digest": "sha256:short"}}}, "/operator/image/digest"),
        ({"logging": {"format": "yaml"}}, "/logging/format"),
        ({"logging": {"level": "TRACE"}}, "/logging/level"),
        ({"imagePullSecrets": [{"name": "regcred", "namespace": "x"}]}, "/imagePullSecrets/0"),
        ({"image": {"registry": ""}}, "/image/registry"),
        ({"podLabels": {"tier": 42}}, "/podLabels/tier"),
        ({"validator": {"nodeSelector": {"pool": 1}}}, "/validator/nodeSelector/pool"),
    ],
)
def test_wrong_values_are_refused_naming_them(tmp_path: Path, values: dict[str, Any], complaint: str) -> None:
    assert complaint in refusal(tmp_path, values)


def test_helm_lint_passes_with_every_value_set(tmp_path: Path) -> None:
    result = helm("lint", str(CHART), "-f", values_file(tmp_path, EVERY_VALUE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout
