"""How a BrokerCluster gives its brokers the backend's and the cloud's credentials.

``spec.backend.credentialsSecretRef`` / ``spec.cloud.credentialsSecretRef`` name a Secret whose
keys (``token``, or ``username`` and ``password``) the operator mounts into every broker pod and
names in ``BROKER_BACKEND_CREDENTIALS_DIR`` / ``BROKER_CLOUD_CREDENTIALS_DIR``; the brokers send
them as an ``Authorization`` header (``broker_service.target_credentials``). A URL with
``user:password@`` keeps working (discouraged, docs/crd.md): refusing it would stop a running
cluster at an operator upgrade.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_contracts import environment
from broker_operator.controller import builders
from broker_operator.controller.spec import SpecError, parse_spec

OWNER: dict[str, Any] = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "orders", "namespace": "erp", "uid": "uid-1"},
}
CRD = Path(__file__).resolve().parents[3] / "crds" / "broker.failover.dev_brokerclusters.yaml"


def spec_with(**connections: dict[str, Any]) -> dict[str, Any]:
    return {"account": "acme", "company": "1000", **connections}


def test_credentials_secret_refs_are_mounted_and_named_to_the_broker() -> None:
    spec = parse_spec(
        "orders",
        spec_with(
            backend={"url": "https://erp.example/broker", "credentialsSecretRef": {"name": "erp-login"}},
            cloud={
                "urlSecretRef": {"name": "endpoints", "key": "cloud"},
                "credentialsSecretRef": {"name": "cloud-key"},
            },
        ),
    )
    assert spec.backend.credentials_secret == "erp-login" and spec.cloud.credentials_secret == "cloud-key"
    pod = builders.build_pod(OWNER, 0, spec, active=False)
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for variable, secret in (
        (environment.BROKER_BACKEND_CREDENTIALS_DIR, "erp-login"),
        (environment.BROKER_CLOUD_CREDENTIALS_DIR, "cloud-key"),
    ):
        mount = mounts[env[variable]]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["secret"]["secretName"] == secret


def test_without_credentials_secret_refs_the_pod_is_as_before() -> None:
    # No new env or volume: the pod template hash of existing clusters stays, so no rollout.
    spec = parse_spec(
        "orders", spec_with(backend={"url": "https://erp.example"}, cloud={"url": "https://c.example"})
    )
    pod = builders.build_pod(OWNER, 0, spec, active=False)
    names = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert environment.BROKER_BACKEND_CREDENTIALS_DIR not in names
    assert environment.BROKER_CLOUD_CREDENTIALS_DIR not in names
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["journal", "token-verifiers", "message-log"]


@pytest.mark.parametrize("target", ["backend", "cloud"])
def test_the_crd_declares_credentials_secret_ref_for_both_targets(target: str) -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"][target]["properties"]["credentialsSecretRef"]["required"] == ["name"]


def test_a_url_with_credentials_keeps_working_and_a_bad_ref_is_refused() -> None:
    url = "https://sapuser:S3cretPW@erp.example/broker"
    assert parse_spec("orders", spec_with(backend={"url": url})).backend.url == url
    with pytest.raises(SpecError, match=r"spec.cloud.credentialsSecretRef must name a Secret"):
        parse_spec("orders", spec_with(cloud={"credentialsSecretRef": {"key": "x"}}))
