"""A CRD upgrade through ``helm upgrade``, on a real kube-apiserver (issue 42).

A control plane alone (``control_plane_only``: etcd, kube-apiserver, controller-manager on
loopback, no node: pods are objects nothing runs, which is all this needs), the Go-built helm, and
``python -m broker_operator`` as its own process watching the release's namespace.

1. The chart as it was before: the BrokerCluster CRD in its ``crds/`` (installed once, owned by no
   release), here an older schema: revision ``REQUIRED_CRD_REVISION - 1`` and without
   ``status.activeEpoch``, which the API server then prunes from a status write; no ``crds``
   value (so ``--reuse-values`` below keeps none).
2. The operator started on it: ``CRDCurrent`` False (``CRDOutdated``, the fix in the message), one
   Warning event, and no pod, Service or Secret made for a BrokerCluster.
3. ``helm upgrade`` to this chart: refused at first (the CRD belongs to no release), accepted once
   the CRD is marked as the release's, as charts/README.md "CRDs" says; the new CRD is installed,
   the operator's condition turns True with a ``CRDUpgraded`` event, and the children are made.
4. A second release must leave the CRD to the first (``crds.create=false``); ``helm uninstall``
   keeps the CRD and the BrokerCluster (``helm.sh/resource-policy: keep``).

Waits are bounded failure limits, not performance assertions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_operator.controller.crd_revision import (
    ANNOTATION_CRD_REVISION,
    CONDITION_CRD_CURRENT,
    CRD_NAME,
    REQUIRED_CRD_REVISION,
)
from local_cluster.cluster import REPO_ROOT, built_tools_dir
from local_cluster.processes import ManagedProcess
from tests.e2e.support import CRD_FILE, PlaneAccess, control_plane_only, wait_for

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "charts" / "broker-failover"
NAMESPACE = "brokers"
RELEASE = "bf"
OLDER = REQUIRED_CRD_REVISION - 1


def older_chart(into: Path) -> Path:
    """This chart as it was before issue 42, with an older CRD: in ``crds/``, not a template, one
    revision down, without ``status.activeEpoch``; and no ``crds`` value."""
    chart = into / "broker-failover"
    shutil.copytree(CHART, chart, symlinks=False)  # the links' contents, as helm package takes them
    (chart / "templates" / "crds.yaml").unlink()
    shutil.rmtree(chart / "files")
    crd = yaml.safe_load(CRD_FILE.read_text())
    crd["metadata"]["annotations"] = {ANNOTATION_CRD_REVISION: str(OLDER)}
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del status["properties"]["activeEpoch"]
    (chart / "crds" / CRD_FILE.name).write_text(yaml.safe_dump(crd, sort_keys=False))
    values = yaml.safe_load((chart / "values.yaml").read_text())
    del values["crds"]
    (chart / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    schema = json.loads((chart / "values.schema.json").read_text())
    del schema["properties"]["crds"]
    (chart / "values.schema.json").write_text(json.dumps(schema, indent=2))
    return chart


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlaneAccess]:
    with control_plane_only(tmp_path_factory.mktemp("crd-upgrade")) as access:
        yield access


@pytest.fixture(scope="module")
def operator(plane: PlaneAccess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """The older chart installed, then the operator of this tree started on its CRD."""
    old = older_chart(tmp_path_factory.mktemp("older-chart"))
    plane.helm("install", RELEASE, str(old), "--namespace", NAMESPACE, "--create-namespace")
    plane.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    wait_for("default ServiceAccount", lambda: plane.get_json(NAMESPACE, "serviceaccount", "default"))
    argv = [sys.executable, "-m", "broker_operator", "--namespace", NAMESPACE, "--metrics-port", "0"]
    argv += ["--reconcile-seconds", "1", "--operator-id", "e2e-crd-upgrade"]
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "PYTHONUNBUFFERED": "1"}
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    process = ManagedProcess("operator", argv, log_path=log, env=env, cwd=REPO_ROOT)
    try:
        yield process
    finally:
        process.stop()
        print(process.log_tail(80))  # shown by pytest on failure


def crd_condition(plane: PlaneAccess, cluster: str) -> dict[str, Any]:
    status = (plane.get_json(NAMESPACE, "brokercluster", cluster) or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == CONDITION_CRD_CURRENT), {})


def events(plane: PlaneAccess, cluster: str, reason: str) -> list[dict[str, Any]]:
    listed = plane.get_json(NAMESPACE, "events") or {}
    return [
        e
        for e in listed.get("items") or []
        if e.get("involvedObject", {}).get("name") == cluster and e.get("reason") == reason
    ]


def names_of(plane: PlaneAccess, kind: str, cluster: str = "orders") -> list[str]:
    """The objects of ``kind`` named for the cluster (the chart's own, its operator pod, aside)."""
    items = (plane.get_json(NAMESPACE, kind) or {}).get("items") or []
    return sorted(n for n in (item["metadata"]["name"] for item in items) if cluster in n)


def status_keeps_active_epoch(plane: PlaneAccess, cluster: str) -> bool:
    """Write ``status.activeEpoch`` as the engine does and read it back: an older CRD prunes it."""
    plane.kubectl(
        "-n", NAMESPACE, "patch", "brokercluster", cluster, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"activeEpoch": 7}}),
    )  # fmt: skip
    status = (plane.get_json(NAMESPACE, "brokercluster", cluster) or {}).get("status") or {}
    return status.get("activeEpoch") == 7


def test_the_chart_renders_the_crd_file_unless_told_not_to() -> None:
    helm = str(built_tools_dir() / "helm")

    def rendered(*values: str) -> list[dict[str, Any]]:
        text = subprocess.run(
            [helm, "template", RELEASE, str(CHART), *values], capture_output=True, text=True, check=True
        ).stdout
        return [doc for doc in yaml.safe_load_all(text) if doc and doc["kind"] == "CustomResourceDefinition"]

    # One copy: what helm renders is the file in crds/, annotations and all.
    assert rendered() == [yaml.safe_load(CRD_FILE.read_text())]
    assert rendered("--set", "crds.create=false") == []


def test_an_outdated_crd_stops_the_operator_until_helm_upgrade_brings_the_new_one(
    plane: PlaneAccess, operator: ManagedProcess
) -> None:
    cluster = {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "orders"},
        "spec": {"account": "acme", "company": "1000", "replicas": 2},
    }
    plane.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(cluster))
    refused = wait_for(
        "CRDCurrent False on orders", lambda: crd_condition(plane, "orders").get("status") == "False"
    )
    assert refused
    condition = crd_condition(plane, "orders")
    assert condition["reason"] == "CRDOutdated"
    assert (
        f"revision {OLDER}" in condition["message"]
        and f"needs revision {REQUIRED_CRD_REVISION}" in condition["message"]
    )
    assert "helm upgrade" in condition["message"]
    (warning,) = wait_for("the CRDOutdated event", lambda: events(plane, "orders", "CRDOutdated"))
    assert warning["type"] == "Warning"
    assert f"needs revision {REQUIRED_CRD_REVISION}" in operator.log_tail(200)  # said at start, too
    assert not status_keeps_active_epoch(plane, "orders"), "the older CRD was meant to prune activeEpoch"
    assert names_of(plane, "pods") == [] and names_of(plane, "secrets") == []
    assert names_of(plane, "services") == [] and names_of(plane, "persistentvolumeclaims") == []

    # The CRD came from the old chart's crds/: no release owns it, and helm will not take it over.
    upgrade = ("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values")
    refused_upgrade = plane.helm(*upgrade, check=False)
    assert refused_upgrade.returncode != 0 and "cannot be imported" in refused_upgrade.stderr, (
        refused_upgrade.stderr
    )
    # charts/README.md, "CRDs": mark it as the release's, once, then upgrade as usual.
    plane.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")
    plane.kubectl(
        "annotate",
        "crd",
        CRD_NAME,
        f"meta.helm.sh/release-name={RELEASE}",
        f"meta.helm.sh/release-namespace={NAMESPACE}",
    )
    plane.helm(*upgrade)

    installed = plane.get_json("default", "crd", CRD_NAME)
    assert installed["metadata"]["annotations"][ANNOTATION_CRD_REVISION] == str(REQUIRED_CRD_REVISION)
    assert installed["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    wait_for("CRDCurrent True on orders", lambda: crd_condition(plane, "orders").get("status") == "True")
    assert crd_condition(plane, "orders")["reason"] == "CRDCurrent"
    wait_for("the CRDUpgraded event", lambda: events(plane, "orders", "CRDUpgraded"))
    # Reconciling again: the pods (objects only: no node runs them) and their Secrets.
    wait_for("orders' pods", lambda: names_of(plane, "pods") == ["orders-0", "orders-1"])
    assert "orders-broker-token" in names_of(plane, "secrets")
    assert status_keeps_active_epoch(plane, "orders")
    assert len(events(plane, "orders", "CRDOutdated")) == 1  # once, for all the refused passes

    # A second release leaves the CRD to the first: helm refuses to share it.
    other = ("install", "other", str(CHART), "--namespace", "other", "--create-namespace")
    taken = plane.helm(*other, check=False)
    assert taken.returncode != 0 and "cannot be imported" in taken.stderr, taken.stderr
    plane.helm(*other, "--set", "crds.create=false")
    plane.helm("uninstall", "other", "--namespace", "other")
    assert plane.get_json("default", "crd", CRD_NAME) is not None

    # Uninstall keeps the CRD, and so every BrokerCluster.
    plane.helm("uninstall", RELEASE, "--namespace", NAMESPACE)
    assert plane.get_json("default", "crd", CRD_NAME) is not None
    assert plane.get_json(NAMESPACE, "brokercluster", "orders") is not None
