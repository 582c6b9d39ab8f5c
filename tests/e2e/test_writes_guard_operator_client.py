"""The chart's writes guard admits ``<cluster>-operator-client`` as narrowly as ``<cluster>-tls`` (issue 41).

Mode Operator keeps the operator's client certificate in a ``kubernetes.io/tls`` Secret of its own,
``<cluster>-operator-client`` (``controller/tls_secrets.py``), so that RBAC can grant the users of
``kubectl broker held`` that Secret without the CA's key. Cluster-wide, the guard
(``charts/broker-failover/templates/writes-guard.yaml``) lets the operator create a
``kubernetes.io/tls`` Secret only under its cluster's names, with the ownership label. Here, on the
same real kube-apiserver as ``test_writes_guard.py`` (its fixture: the chart installed
cluster-wide, kubectl impersonating the operator's ServiceAccount): admitted under
``<cluster>-operator-client`` with both labels, refused under another cluster's name, a partial
suffix, or without the ownership label, and renewable by merge patch.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.test_writes_guard import OURS, REFUSED_BY_POLICY, VICTIM, PlaneAccess, as_operator, guarded

pytestmark = pytest.mark.e2e
__all__ = ["guarded"]  # the module-scoped fixture, used by name below

OWNERSHIP = {"broker.failover.dev/cluster": "orders", "broker.failover.dev/certificates-owner": "uid-1"}
REFUSED_TLS = "kubernetes.io/tls Secrets named <cluster>-tls or <cluster>-operator-client"


def tls_secret(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": VICTIM, "labels": labels},
        "stringData": {"tls.crt": "x", "tls.key": "y", "ca.crt": "z"},
    }


def test_the_operator_client_secret_is_admitted_under_its_clusters_name_with_the_ownership_label(
    guarded: PlaneAccess,
) -> None:
    for name, labels in (
        ("checkout-operator-client", {**OURS, **OWNERSHIP}),  # another cluster's name
        ("orders-operator-client", OURS),  # no ownership label
        ("orders-operator", {**OURS, **OWNERSHIP}),  # not the whole suffix
        ("orders-operator-client-x", {**OURS, **OWNERSHIP}),  # more than the name
    ):
        refused = as_operator(guarded, "create", "-f", "-", body=tls_secret(name, labels))
        assert refused.returncode != 0, name
        assert REFUSED_TLS in refused.stderr, (name, refused.stderr)
    unlabelled = as_operator(
        guarded, "create", "-f", "-", body=tls_secret("orders-operator-client", OWNERSHIP)
    )
    assert unlabelled.returncode != 0 and REFUSED_BY_POLICY in unlabelled.stderr
    admitted = as_operator(
        guarded, "create", "-f", "-", body=tls_secret("orders-operator-client", {**OURS, **OWNERSHIP})
    )
    assert admitted.returncode == 0, admitted.stderr
    # A renewal is a conditional merge patch: admitted while it stays the operator's.
    patched = as_operator(
        guarded, "patch", "secret", "-n", VICTIM, "orders-operator-client", "--type=merge", "-p",
        json.dumps({"stringData": {"tls.crt": "renewed"}}),
    )  # fmt: skip
    assert patched.returncode == 0, patched.stderr
