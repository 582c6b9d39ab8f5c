"""A larger ``spec.storage.size`` on the local cluster: the real API server, provisioner and chart RBAC.

kind's local-path provisioner cannot grow a volume: its classes do not set ``allowVolumeExpansion``
and nothing resizes what it provisions. On the relay's cluster (default class ``standard``) a larger
size must leave the claims as they are and say why: ``StorageResized`` False, reason
``ExpansionNotAllowed``, naming the class; one Warning event; the traffic unaffected (no failover,
nothing lost). The operator reads the class through the chart's ClusterRole (``get`` of
``storageclasses``), so a missing rule would show as ``StorageClassUnreadable`` here.

Then a class of the same provisioner that allows expansion, made for this test: a second
BrokerCluster's claim in it is asked for the larger size, and the real API server admits the
request (the chart's Role patches claims; the API server's admission checks the class). Nothing
grows the hostPath volume behind it (kube-controller-manager's expand controller waits for an
external resizer, and local-path has none), so the condition stays ``Resizing``, naming what the
claim holds.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from local_cluster.relay import CLUSTER_NAME, Relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import relay_in_new_namespace, wait_for
from tests.e2e.test_upgrade import event_counts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CONDITION = "StorageResized"
GROWN = "grown"  # the second BrokerCluster, on the class that allows expansion


@pytest.fixture(scope="module")
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    with relay_in_new_namespace(sealed_cluster, "grow", streams=2, messages_per_stream=100) as relay:
        yield relay


def storage_condition(relay: Relay, cluster: str = CLUSTER_NAME) -> dict[str, Any] | None:
    status = (relay.get("brokercluster", cluster) or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == CONDITION), None)


def requested(relay: Relay, claim: str) -> str:
    return str(relay.get("pvc", claim)["spec"]["resources"]["requests"]["storage"])


def set_size(relay: Relay, cluster: str, size: str) -> None:
    patch = json.dumps({"spec": {"storage": {"size": size}}})
    relay.cluster.kubectl(
        "-n", relay.namespace, "patch", "brokercluster", cluster, "--type=merge", "-p", patch
    )


def test_local_path_cannot_grow_a_journal_and_the_status_says_so(relay: Relay) -> None:
    claims = [f"journal-{CLUSTER_NAME}-{ordinal}" for ordinal in (0, 1)]
    assert [relay.get("pvc", claim)["status"]["phase"] for claim in claims] == ["Bound", "Bound"]
    assert storage_condition(relay) is None  # never resized: no condition
    before = relay.status()
    relay.backend("/sim/start", {})

    set_size(relay, CLUSTER_NAME, "3Gi")
    condition = wait_for(
        "StorageResized False with reason ExpansionNotAllowed",
        lambda: (c := storage_condition(relay)) is not None and c["reason"] == "ExpansionNotAllowed" and c,
        timeout=60,
    )
    assert condition["status"] == "False"
    assert condition["message"].startswith("StorageClass standard does not allow volume expansion")
    assert f"{claims[0]} (2Gi), {claims[1]} (2Gi) cannot grow to 3Gi" in condition["message"]
    assert relay.status()["storage"] == {
        "requested": "3Gi",
        "claims": [{"name": claim, "requested": "2Gi", "capacity": "2Gi"} for claim in claims],
    }
    # Three reconcile periods later (the operator's default, 10 s each): the claims untouched, one
    # warning, no retry storm.
    time.sleep(30)
    relay.wait_all_confirmed()
    assert [requested(relay, claim) for claim in claims] == ["2Gi", "2Gi"]
    assert event_counts(relay)["ExpansionNotAllowed"] == 1
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
    after = relay.status()
    assert (after["phase"], after["active"], after.get("failovers", 0)) == (
        "Healthy",
        before["active"],
        before.get("failovers", 0),
    )


@pytest.fixture
def expandable_class(relay: Relay) -> Iterator[str]:
    """A class like ``standard`` (the same provisioner) that allows expansion; deleted after the
    claims made in it."""
    name = f"expandable-{uuid.uuid4().hex[:6]}"
    standard = relay.cluster.get_json("", "storageclass", "standard")
    body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": standard["provisioner"],
        "volumeBindingMode": standard["volumeBindingMode"],
        "reclaimPolicy": standard["reclaimPolicy"],
        "allowVolumeExpansion": True,
    }
    relay.cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:
        yield name
    finally:
        # The claim first, so that the provisioner still finds its class when it removes the volume.
        relay.cluster.kubectl(
            "-n",
            relay.namespace,
            "delete",
            "brokercluster",
            GROWN,
            "--wait=true",
            "--timeout=120s",
            check=False,
        )
        relay.cluster.kubectl(
            "-n", relay.namespace, "delete", "pvc", f"journal-{GROWN}-0", "--wait=true", "--timeout=120s",
            check=False,
        )  # fmt: skip
        relay.cluster.kubectl("delete", "storageclass", name, check=False)


def test_a_class_that_allows_expansion_gets_the_larger_request(relay: Relay, expandable_class: str) -> None:
    spec = dict(relay.get("brokercluster", CLUSTER_NAME)["spec"])
    spec.update(
        company="2000",  # a pair of its own: the relay's is taken
        replicas=1,
        storage={"size": "1Gi", "storageClassName": expandable_class},
    )
    spec.pop("preferredActive", None)
    body = {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": GROWN},
    }
    relay.cluster.kubectl("-n", relay.namespace, "apply", "-f", "-", input=json.dumps({**body, "spec": spec}))
    claim = f"journal-{GROWN}-0"
    # WaitForFirstConsumer: bound once the broker pod is scheduled.
    wait_for(
        f"{claim} bound",
        lambda: ((relay.get("pvc", claim) or {}).get("status") or {}).get("phase") == "Bound",
    )

    set_size(relay, GROWN, "2Gi")
    wait_for(f"{claim} asked for 2Gi", lambda: requested(relay, claim) == "2Gi", timeout=60)
    condition = wait_for(
        "StorageResized False with reason Resizing",
        lambda: (c := storage_condition(relay, GROWN)) is not None and c["reason"] == "Resizing" and c,
        timeout=60,
    )
    assert condition["status"] == "False"
    assert condition["message"].startswith(f"{claim} holds 1Gi of 2Gi")
    events = relay.get(
        "events", f"--field-selector=involvedObject.kind=BrokerCluster,involvedObject.name={GROWN}"
    )
    asked = [e["message"] for e in events["items"] if e["reason"] == "ClaimResizeRequested"]
    assert asked == [
        f"asked for 2Gi on PersistentVolumeClaim/{claim} (it asked for 1Gi): spec.storage.size grew"
    ]
