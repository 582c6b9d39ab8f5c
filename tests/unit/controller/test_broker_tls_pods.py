"""Broker pods under ``spec.tls``: the mounted certificates, the environment, the probes, the hash."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker_operator.controller import builders, credentials, names
from broker_operator.controller.spec import ClusterSpec, parse_spec

OWNER: dict[str, Any] = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "orders", "namespace": "erp", "uid": "uid-1"},
}
SECRETS = {"server": "erp-broker-tls", "operatorClient": "erp-operator-tls"}
BACKEND_CLIENTS = {
    "caSecretRef": {"name": "sap-ca", "key": "bundle.pem"},
    "allowedSubjects": ["CN=SAP-ERP-PRD,O=Example", "CN=SAP-ERP-DR,O=Example"],
}
TLS_ENV = {
    "BROKER_TLS_DIR",
    "BROKER_CLIENT_CA_FILE",
    "BROKER_ALLOWED_CLIENT_SUBJECTS",
    "BROKER_UPSTREAM_CA_FILE",
}


def spec_with(**tls: Any) -> ClusterSpec:
    return parse_spec("orders", {"account": "a", "company": "c", "tls": tls})


def pod(spec: ClusterSpec, *, serve_tls: bool = True) -> dict[str, Any]:
    return builders.build_pod(OWNER, 0, spec, active=False, serve_tls=serve_tls)


def parts(built: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(env by name, volumes by name, mounts by volume name, the container) of a pod."""
    (container,) = built["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    volumes = {v["name"]: v for v in built["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    return env, volumes, mounts, container


def probe_schemes(container: dict[str, Any]) -> set[str | None]:
    return {container[probe]["httpGet"].get("scheme") for probe in ("readinessProbe", "livenessProbe")}


def test_mode_operator_mounts_the_operators_secret_whole_and_probes_speak_https() -> None:
    env, volumes, mounts, container = parts(pod(spec_with()))
    assert volumes["tls"] == {
        "name": "tls",
        "secret": {
            "secretName": "orders-tls",
            "items": [{"key": k, "path": k} for k in ("tls.crt", "tls.key", "ca.crt")],
        },
    }
    # A Secret volume, never a subPath: the kubelet's updates (rotations) must reach the broker.
    assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/broker/tls", "readOnly": True}
    assert env["BROKER_TLS_DIR"] == "/etc/broker/tls" == names.TLS_MOUNT
    assert env["BROKER_ADMIN_PORT"] == "8081"  # the broker refuses TLS without it
    assert probe_schemes(container) == {"HTTPS"}
    assert {container[p]["httpGet"]["port"] for p in ("readinessProbe", "livenessProbe")} == {"soap"}
    assert not TLS_ENV - {"BROKER_TLS_DIR"} & env.keys()
    assert "orders-ca" not in json.dumps(pod(spec_with()))  # the CA's key is never mounted
    assert names.ca_secret_name("orders") == "orders-ca" and names.tls_secret_name("orders") == "orders-tls"


def test_mode_secrets_projects_the_serving_pair_and_the_operators_ca() -> None:
    env, volumes, mounts, _container = parts(pod(spec_with(mode="Secrets", secrets=SECRETS)))
    assert volumes["tls"] == {
        "name": "tls",
        "projected": {
            "sources": [
                {
                    "secret": {
                        "name": "erp-broker-tls",
                        "items": [
                            {"key": "tls.crt", "path": "tls.crt"},
                            {"key": "tls.key", "path": "tls.key"},
                        ],
                    }
                },
                # What the admin port trusts: the CA of the operator's client certificate.
                {"secret": {"name": "erp-operator-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            ]
        },
    }
    assert "subPath" not in mounts["tls"] and env["BROKER_TLS_DIR"] == "/etc/broker/tls"


def test_backend_clients_mount_their_ca_as_a_file_and_list_the_subjects_one_per_line() -> None:
    env, volumes, mounts, container = parts(pod(spec_with(backendClients=BACKEND_CLIENTS)))
    assert volumes["backend-clients-ca"] == {
        "name": "backend-clients-ca",
        "secret": {"secretName": "sap-ca", "items": [{"key": "bundle.pem", "path": "ca.crt"}]},
    }
    assert mounts["backend-clients-ca"]["mountPath"] == "/etc/broker/backend-clients-ca"
    assert mounts["backend-clients-ca"]["readOnly"] is True
    assert env["BROKER_CLIENT_CA_FILE"] == "/etc/broker/backend-clients-ca/ca.crt"
    assert env["BROKER_ALLOWED_CLIENT_SUBJECTS"].splitlines() == BACKEND_CLIENTS["allowedSubjects"]
    # Probes present no certificate; the main port lets them through (broker_tls.py).
    assert probe_schemes(container) == {"HTTPS"}


def test_the_upstream_bundle_is_mounted_in_every_mode_and_before_the_brokers_serve_tls() -> None:
    for spec in (
        spec_with(upstreamCASecretRef={"name": "cloud-ca"}),
        spec_with(mode="Disabled", upstreamCASecretRef={"name": "cloud-ca"}),
    ):
        for serve_tls in (True, False):
            env, volumes, mounts, _container = parts(pod(spec, serve_tls=serve_tls))
            assert volumes["upstream-ca"]["secret"] == {
                "secretName": "cloud-ca",
                "items": [{"key": "ca.crt", "path": "ca.crt"}],
            }
            assert mounts["upstream-ca"]["mountPath"] == "/etc/broker/upstream-ca"
            assert env["BROKER_UPSTREAM_CA_FILE"] == "/etc/broker/upstream-ca/ca.crt"


@pytest.mark.parametrize(
    "tls",
    [
        {"mode": "Disabled"},
        {"mode": "Operator", "backendClients": BACKEND_CLIENTS},
        {"mode": "Secrets", "secrets": SECRETS},
    ],
    ids=["disabled", "operator-not-served-yet", "secrets-not-served-yet"],
)
def test_a_pod_that_serves_no_tls_is_the_plain_pod_of_before(tls: dict[str, Any]) -> None:
    # Disabled, or the operator not serving TLS yet (ControllerSettings.broker_tls): nothing of
    # TLS in the pod, HTTP probes, and the same template hash as a spec without spec.tls, so the
    # operator's upgrade to this version replaces no pod.
    served = tls["mode"] == "Disabled"
    plain = parse_spec("orders", {"account": "a", "company": "c"})
    env, volumes, _mounts, container = parts(pod(spec_with(**tls), serve_tls=served))
    assert not TLS_ENV & env.keys()
    assert not {"tls", "backend-clients-ca"} & volumes.keys()
    assert probe_schemes(container) == {None}
    assert builders.template_hash("orders", spec_with(**tls), serve_tls=served) == builders.template_hash(
        "orders", plain
    )


def test_the_template_hash_is_the_one_of_the_operator_before_spec_tls() -> None:
    # Computed by the operator of the commit before this one: an upgrade must not roll the pods.
    plain = parse_spec("orders", {"account": "a", "company": "c"})
    assert builders.template_hash("orders", plain) == "915b7ac4cc20f4a6"
    assert builders.template_hash("orders", plain, serve_tls=True) != "915b7ac4cc20f4a6"


def test_turning_tls_on_or_off_or_renaming_a_secret_rolls_the_pods_and_a_rotation_does_not() -> None:
    variants = [
        spec_with(mode="Disabled"),
        spec_with(),
        spec_with(mode="Secrets", secrets=SECRETS),
        spec_with(mode="Secrets", secrets={**SECRETS, "server": "erp-broker-tls-2"}),
        spec_with(backendClients=BACKEND_CLIENTS),
        spec_with(backendClients={**BACKEND_CLIENTS, "allowedSubjects": ["CN=SAP-ERP-PRD,O=Example"]}),
    ]
    hashes = [builders.template_hash("orders", spec, serve_tls=True) for spec in variants]
    assert len(set(hashes)) == len(variants)
    # A rotation changes the Secrets' content, never the spec: the pod names the Secrets and keys
    # only (no serial, no checksum annotation), so its template and hash stay what they were.
    built = pod(spec_with(mode="Secrets", secrets=SECRETS))
    assert built["metadata"]["annotations"] == {names.ANNOTATION_TEMPLATE_HASH: hashes[2]}
    assert "BEGIN" not in json.dumps(built)
    assert (
        builders.template_hash("orders", spec_with(mode="Secrets", secrets=SECRETS), serve_tls=True)
        == hashes[2]
    )


def test_the_secrets_of_spec_tls_must_opt_in_before_a_pod_mounts_them() -> None:
    spec = spec_with(
        mode="Secrets",
        secrets=SECRETS,
        backendClients=BACKEND_CLIENTS,
        upstreamCASecretRef={"name": "cloud-ca"},
    )
    named = {
        n.field: n.ref.name
        for n in credentials.named_secrets("orders", spec)
        if n.field.startswith("spec.tls")
    }
    assert named == {
        "spec.tls.secrets.server": "erp-broker-tls",
        "spec.tls.secrets.operatorClient": "erp-operator-tls",
        "spec.tls.backendClients.caSecretRef": "sap-ca",
        "spec.tls.upstreamCASecretRef": "cloud-ca",
    }
