"""Rotating the operator token on the real control plane (issue 13 item 5): no restart, no failover.

The operator runs as its own process (in the sealed cluster's namespaces), the brokers as pods
on the real kubelet whose token is a Secret volume, which the kubelet re-syncs with its atomic
``..data`` swap (``syncFrequency`` 10 s on this node). A new value patched into the generated
Secret must reach every broker (it re-reads the file it was given) and the operator (it re-reads
the Secret) while heartbeats go on: same active, same epoch, no Failover event, no container
restarted; and once the brokers' grace window (30 s by default) has passed, the old token opens
nothing.

Waits are bounded failure limits, not performance assertions.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME, NAMESPACE, SOAP_ENV_NAMESPACE
from local_cluster.broker_pod_calls import BrokerPodCallError, pod_call
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import LocalProcess, installed_crd, wait_for
from tests.e2e.test_operator import (
    apply,
    broker_cluster,
    event_reasons,
    new_namespace,
    pod,
    start_operator,
    start_simulator,
    wait_for_row,
)

pytestmark = pytest.mark.e2e

CLUSTER = "rotate"
BROKERS = [f"{CLUSTER}-0", f"{CLUSTER}-1"]
BROKER_GRACE_SECONDS = 30.0  # the broker's default --token-grace-seconds
LIST_HELD = (
    f'<soap:Envelope xmlns:soap="{SOAP_ENV_NAMESPACE}" xmlns:t="{NAMESPACE}">'
    "<soap:Body><t:ListHeld/></soap:Body></soap:Envelope>"
).encode()


@pytest.fixture(scope="module")
def crd(sealed_cluster: SealedCluster) -> Iterator[None]:
    with installed_crd(sealed_cluster):
        yield


@pytest.fixture
def backend_and_cloud(sealed_cluster: SealedCluster, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A backend and a cloud simulator of this test's own (targets remember epochs per account)."""
    started: list[LocalProcess] = []
    urls: dict[str, str] = {}
    try:
        for role in ("backend", "cloud"):
            process, urls[role] = start_simulator(sealed_cluster, role, tmp_path / f"{role}.log")
            started.append(process)
        yield urls
    finally:
        for process in started:
            process.stop()


def list_held_status(cluster: SealedCluster, namespace: str, broker: str, token: str) -> str:
    """``ListHeld`` (changes nothing) with ``token`` at the admin port: "ok", a fault code, or why not.

    Sent from the cluster's network, where the pod IP routes."""
    body = pod(cluster, namespace, broker) or {}
    try:
        # The admin port (the main port refuses ListHeld: WRONG_PORT), over TLS when the pod serves
        # it, with the operator's client certificate: only the token is under test.
        call = pod_call(
            cluster, body, 8081, "/soap", data=LIST_HELD, client=True, timeout=5,
            headers={"Content-Type": "text/xml; charset=utf-8", AUTH_HEADER: f"{AUTH_SCHEME} {token}"},
        )  # fmt: skip
        cluster.call_in_network(call, timeout=25)
        return "ok"  # urllib raises HTTPError for any other status
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")
        return (
            body.split("<tns:code>", 1)[-1].split("<", 1)[0] if "<tns:code>" in body else f"HTTP {error.code}"
        )
    except (OSError, BrokerPodCallError) as error:
        return f"unreachable: {error}"


def secret_token(cluster: SealedCluster, namespace: str, name: str) -> str:
    secret = cluster.get_json(namespace, "secret", name)
    return base64.b64decode(secret["data"]["token"]).decode()


def containers(cluster: SealedCluster, namespace: str) -> dict[str, tuple[str, int]]:
    """Each broker's (containerID, restartCount): a restart changes one or the other."""
    found = {}
    for name in BROKERS:
        (status,) = (pod(cluster, namespace, name) or {})["status"]["containerStatuses"]
        found[name] = (status.get("containerID", ""), status["restartCount"])
    return found


def test_a_rotated_token_reaches_brokers_and_operator_without_restart_or_failover(
    sealed_cluster: SealedCluster,
    crd: None,
    backend_and_cloud: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = new_namespace(sealed_cluster, "rotate")
    # The operator reads the Secret again every 2 s here (default 30 s), so the test sees the
    # ordinary path; a broker refusing the old token would also make it read the Secret.
    monkeypatch.setenv("OPERATOR_TOKEN_RECHECK_SECONDS", "2")
    operator = start_operator(sealed_cluster, namespace, tmp_path / "operator.log")
    try:
        manifest = broker_cluster(
            CLUSTER,
            replicas=2,
            company=f"rotate-{uuid.uuid4().hex[:4]}",
            failback="Manual",
            backend={"url": backend_and_cloud["backend"]},
            cloud={"url": backend_and_cloud["cloud"]},
        )
        assert apply(sealed_cluster, namespace, manifest).returncode == 0
        before = wait_for_row(
            sealed_cluster,
            namespace,
            CLUSTER,
            f"{CLUSTER}-0 active",
            lambda row: row["ACTIVE"] == BROKERS[0] and row["PHASE"] == "Healthy",
            timeout=120,
        )
        status_before = sealed_cluster.get_json(namespace, "bc", CLUSTER)["status"]
        started = containers(sealed_cluster, namespace)
        secret = f"{CLUSTER}-broker-token"
        old = secret_token(sealed_cluster, namespace, secret)
        for broker in BROKERS:
            assert list_held_status(sealed_cluster, namespace, broker, old) == "ok"

        new = uuid.uuid4().hex
        patch = json.dumps({"stringData": {"token": new}})
        sealed_cluster.kubectl("-n", namespace, "patch", "secret", secret, "--type=merge", "-p", patch)

        # Every broker takes the new token without a restart (the kubelet swapped ..data; it syncs
        # a pod's Secret volumes every syncFrequency, 10 s, plus its jitter).
        for broker in BROKERS:
            wait_for(
                f"{broker} to accept the new token",
                lambda broker=broker: list_held_status(sealed_cluster, namespace, broker, new) == "ok",
                timeout=90,
            )
        # Both brokers have seen the change by now, so their grace window ends before this + 30 s.
        all_seen_at = time.monotonic()
        # The operator switches too: its log says so, and after the grace window only the new
        # token can renew the active's lease, which the checks below need.
        wait_for(
            "the operator to switch its heartbeat token",
            lambda: "the operator token changed" in operator.log.read_text(errors="replace"),
            timeout=30,
        )

        # Through the grace window and past it, heartbeats never fail: same active, same epoch.
        rows: list[dict[str, str]] = []
        while time.monotonic() < all_seen_at + BROKER_GRACE_SECONDS + 5:
            rows.append(wait_for_row(sealed_cluster, namespace, CLUSTER, "a row", lambda row: True))
            time.sleep(1)
        assert {(r["ACTIVE"], r["EPOCH"], r["PHASE"]) for r in rows} == {
            (BROKERS[0], before["EPOCH"], "Healthy")
        }, rows

        # The old token stops working once the window has passed; the new one keeps working.
        for broker in BROKERS:
            assert list_held_status(sealed_cluster, namespace, broker, old) == "UNAUTHENTICATED"
            assert list_held_status(sealed_cluster, namespace, broker, new) == "ok"
        status = sealed_cluster.get_json(namespace, "bc", CLUSTER)["status"]
        assert status.get("failovers", 0) == status_before.get("failovers", 0)
        assert status["active"] == BROKERS[0] and status["epoch"] == status_before["epoch"]
        reasons = event_reasons(sealed_cluster, namespace, CLUSTER)
        assert "Failover" not in reasons, reasons
        assert containers(sealed_cluster, namespace) == started, "a broker container was restarted"
        assert operator.process.poll() is None, "the operator must not have restarted either"
    finally:
        operator.stop()
        print(operator.tail())  # shown by pytest on failure
        sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
