"""The chart's writes guard (``operator.clusterWide``) on a real kube-apiserver (issue 39, finding 4).

Cluster-wide, the operator's ClusterRole may write EndpointSlices, NetworkPolicies, pods, Services
and Secrets in every namespace, so a compromised operator could point any Service at a pod of its
own. The chart's ValidatingAdmissionPolicy admits those writes only for objects the operator labels
as its own. Here the chart is installed cluster-wide with the built helm into a control plane
alone (etcd, kube-apiserver, controller-manager on loopback; no kubelet: nothing has to run), and
kubectl acts as the operator's ServiceAccount by impersonation, so RBAC and admission see exactly
that account. Every write without the label is refused by the policy (its message says so, RBAC
allows it), and the same write with the label is admitted.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from local_cluster.cluster import REPO_ROOT
from tests.e2e.support import PlaneAccess, control_plane_only, wait_for

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "charts" / "broker-failover"
RELEASE_NAMESPACE = "broker-failover"
VICTIM = "shop"  # a namespace of somebody else's, with a Service the operator has no business with
OPERATOR = f"system:serviceaccount:{RELEASE_NAMESPACE}:bf-broker-failover"
OURS = {"app.kubernetes.io/managed-by": "broker-failover-operator"}
REFUSED_BY_POLICY = "the broker-failover operator writes only objects labelled"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlaneAccess]:
    with control_plane_only(tmp_path_factory.mktemp("writes-guard")) as access:
        access.kubectl("create", "namespace", VICTIM)
        access.helm(
            "install", "bf", str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace",
            "--set", "operator.clusterWide=true",
        )  # fmt: skip
        shop_service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "checkout", "namespace": VICTIM},
            "spec": {"ports": [{"port": 80}]},  # no selector: its endpoints are whatever slices say
        }
        access.kubectl("apply", "-f", "-", input=json.dumps(shop_service))
        # The policy reaches the admission plugin a moment after it is created: a server-side dry
        # run (admission runs, nothing is stored) shows when it refuses.
        wait_for(
            "the writes guard to refuse an unlabelled EndpointSlice",
            lambda: (
                REFUSED_BY_POLICY
                in as_operator(
                    access, "create", "--dry-run=server", "-f", "-", body=endpoint_slice({})
                ).stderr
            ),
            timeout=60,
        )
        yield access


def as_operator(
    access: PlaneAccess, *args: str, body: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    return access.kubectl(
        f"--as={OPERATOR}", *args, input=json.dumps(body) if body is not None else None, check=False
    )


def endpoint_slice(labels: dict[str, str]) -> dict[str, Any]:
    """A slice that would send the shop's checkout Service to an address of the writer's choosing."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "checkout-hijack",
            "namespace": VICTIM,
            "labels": {"kubernetes.io/service-name": "checkout", **labels},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.99.0.66"]}],
        "ports": [{"port": 80, "protocol": "TCP"}],
    }


def network_policy(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": VICTIM, "labels": labels},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }


def test_the_chart_installs_the_policy_with_no_type_errors(guarded: PlaneAccess) -> None:
    def checked() -> dict[str, Any] | None:
        found = guarded.kubectl(
            "get", "validatingadmissionpolicy", "bf-broker-failover-writes-guard", "-o", "json"
        )
        status = json.loads(found.stdout).get("status") or {}
        return status if "typeChecking" in status else None

    status = wait_for("the API server's type check of the policy", checked, timeout=60)
    assert status["typeChecking"].get("expressionWarnings") in (None, [])
    binding = json.loads(
        guarded.kubectl(
            "get", "validatingadmissionpolicybinding", "bf-broker-failover-writes-guard", "-o", "json"
        ).stdout
    )
    assert binding["spec"]["validationActions"] == ["Deny"]
    # RBAC alone would allow every write below: the refusals are the policy's.
    for verb, resource in [
        ("create", "endpointslices.discovery.k8s.io"),
        ("create", "networkpolicies.networking.k8s.io"),
        ("delete", "networkpolicies.networking.k8s.io"),
        ("create", "secrets"),
    ]:
        allowed = guarded.kubectl(
            "auth", "can-i", verb, resource, "-n", VICTIM, f"--as={OPERATOR}", check=False
        )
        assert allowed.stdout.strip() == "yes", (verb, resource)


def test_an_endpoint_slice_without_the_operators_label_is_refused_and_with_it_admitted(
    guarded: PlaneAccess,
) -> None:
    refused = as_operator(guarded, "create", "-f", "-", body=endpoint_slice({}))
    assert refused.returncode != 0 and REFUSED_BY_POLICY in refused.stderr
    assert "endpointslices shop/checkout-hijack is not one" in refused.stderr
    assert (
        guarded.kubectl("get", "endpointslice", "-n", VICTIM, "checkout-hijack", check=False).returncode != 0
    )
    admitted = as_operator(guarded, "create", "-f", "-", body=endpoint_slice(OURS))
    assert admitted.returncode == 0, admitted.stderr
    # An update that drops the label is refused: the old object was the operator's, the new is not.
    current = json.loads(
        guarded.kubectl("get", "endpointslice", "-n", VICTIM, "checkout-hijack", "-o", "json").stdout
    )
    del current["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    relabel = as_operator(guarded, "replace", "-f", "-", body=current)  # an update: what RBAC grants
    assert relabel.returncode != 0 and REFUSED_BY_POLICY in relabel.stderr


def test_a_network_policy_without_the_operators_label_is_neither_written_nor_deleted(
    guarded: PlaneAccess,
) -> None:
    refused = as_operator(guarded, "create", "-f", "-", body=network_policy("lockdown", {}))
    assert refused.returncode != 0 and REFUSED_BY_POLICY in refused.stderr
    # The shop's own policy, made by its admin: the operator may not delete it (that would open it).
    guarded.kubectl("apply", "-f", "-", input=json.dumps(network_policy("shop-isolation", {})))
    deleted = as_operator(guarded, "delete", "networkpolicy", "-n", VICTIM, "shop-isolation")
    assert deleted.returncode != 0 and REFUSED_BY_POLICY in deleted.stderr
    assert guarded.kubectl("get", "networkpolicy", "-n", VICTIM, "shop-isolation").returncode == 0
    admitted = as_operator(guarded, "create", "-f", "-", body=network_policy("orders-brokers-ingress", OURS))
    assert admitted.returncode == 0, admitted.stderr
    removed = as_operator(guarded, "delete", "networkpolicy", "-n", VICTIM, "orders-brokers-ingress")
    assert removed.returncode == 0, removed.stderr


def test_the_operator_creates_only_opaque_secrets(guarded: PlaneAccess) -> None:
    """A service-account-token Secret would have the token controller fill in another account's
    token, which the operator's get on Secrets could then read."""
    token_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": "steal-default",
            "namespace": VICTIM,
            "labels": OURS,
            "annotations": {"kubernetes.io/service-account.name": "default"},
        },
    }
    refused = as_operator(guarded, "create", "-f", "-", body=token_secret)
    assert refused.returncode != 0 and "creates only Opaque Secrets" in refused.stderr
    opaque = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": "orders-broker-token", "namespace": VICTIM, "labels": OURS},
        "stringData": {"token": "x"},
    }
    assert as_operator(guarded, "create", "-f", "-", body=opaque).returncode == 0
    unlabelled = {**opaque, "metadata": {"name": "other", "namespace": VICTIM}}
    refused_unlabelled = as_operator(guarded, "create", "-f", "-", body=unlabelled)
    assert refused_unlabelled.returncode != 0 and REFUSED_BY_POLICY in refused_unlabelled.stderr


REFUSED_TLS = "kubernetes.io/tls Secrets named <cluster>-tls or <cluster>-operator-client"
OWNERSHIP = {"broker.failover.dev/cluster": "orders", "broker.failover.dev/certificates-owner": "uid-1"}


def tls_secret(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": VICTIM, "labels": labels},
        "stringData": {"tls.crt": "x", "tls.key": "y", "ca.crt": "z"},
    }


@pytest.mark.parametrize(
    ("admitted_name", "refused"),
    [
        pytest.param(
            "orders-tls",
            (
                ("orders-tls", OURS),  # no ownership label
                ("checkout-tls", {**OURS, **OWNERSHIP}),  # another name than the cluster's
                ("orders-ca", {**OURS, **OWNERSHIP}),  # the CA's name: that one is Opaque
            ),
            id="serving",
        ),
        pytest.param(
            "orders-operator-client",  # issue 41: its own Secret, so RBAC can grant it without the CA
            (
                ("checkout-operator-client", {**OURS, **OWNERSHIP}),  # another cluster's name
                ("orders-operator-client", OURS),  # no ownership label
                ("orders-operator", {**OURS, **OWNERSHIP}),  # not the whole suffix
                ("orders-operator-client-x", {**OURS, **OWNERSHIP}),  # more than the name
            ),
            id="operator-client",
        ),
    ],
)
def test_a_tls_secret_is_created_only_under_its_clusters_name_with_the_ownership_label(
    guarded: PlaneAccess, admitted_name: str, refused: tuple[tuple[str, dict[str, str]], ...]
) -> None:
    """Mode Operator's ``<cluster>-tls`` and ``<cluster>-operator-client`` are ``kubernetes.io/tls``
    (cert-manager's shape): admitted under those names with the ownership label, refused under any
    other name or without the label, and renewable by merge patch while they stay the operator's."""
    for name, labels in refused:
        answer = as_operator(guarded, "create", "-f", "-", body=tls_secret(name, labels))
        assert answer.returncode != 0, name
        assert (
            "kubernetes.io/tls Secrets named <cluster>-tls or <cluster>-operator-client" in answer.stderr
        ), (
            name,
            answer.stderr,
        )
    unlabelled = as_operator(guarded, "create", "-f", "-", body=tls_secret(admitted_name, OWNERSHIP))
    assert unlabelled.returncode != 0 and REFUSED_BY_POLICY in unlabelled.stderr
    admitted = as_operator(
        guarded, "create", "-f", "-", body=tls_secret(admitted_name, {**OURS, **OWNERSHIP})
    )
    assert admitted.returncode == 0, admitted.stderr
    # A renewal is a conditional merge patch, which RBAC grants.
    patched = as_operator(
        guarded, "patch", "secret", "-n", VICTIM, admitted_name, "--type=merge", "-p",
        json.dumps({"stringData": {"tls.crt": "renewed"}}),
    )  # fmt: skip
    assert patched.returncode == 0, patched.stderr


def test_other_users_are_not_held_by_the_policy(guarded: PlaneAccess) -> None:
    """The policy matches the operator's account only: the shop's admin writes as before."""
    body = {**endpoint_slice({}), "metadata": {**endpoint_slice({})["metadata"], "name": "checkout-admin"}}
    written = guarded.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert written.returncode == 0, written.stderr


def test_the_default_namespaced_install_is_accepted_and_grants_nothing_beyond_its_namespace(
    guarded: PlaneAccess,
) -> None:
    """The default install (a second release, its own namespace) on the same API server: the API
    server takes every object, and its account may write in its namespace but not in another."""
    # A second release on the cluster: the first owns the CRD, which helm lets one release own.
    guarded.helm(
        "install", "narrow", str(CHART), "--namespace", "narrow", "--create-namespace",
        "--set", "crds.create=false",
    )  # fmt: skip
    account = "system:serviceaccount:narrow:narrow-broker-failover"
    for namespace, expected in (("narrow", "yes"), (VICTIM, "no")):
        for verb, resource in (
            ("create", "endpointslices.discovery.k8s.io"),
            ("get", "secrets"),
            ("create", "pods"),
        ):
            answer = guarded.kubectl(
                "auth", "can-i", verb, resource, "-n", namespace, f"--as={account}", check=False
            )
            assert answer.stdout.strip() == expected, (namespace, verb, resource)
