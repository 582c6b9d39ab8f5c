"""Only Secrets that opt in are credentials (issue 39, finding 3): the controller inside kopf against kmock.

A BrokerCluster's author could name any Secret of the namespace in ``spec.auth.tokenSecretRef``
(or the backend token, or a URL Secret) and, in endpoints mode, point the operator at a server of
their own: the operator then sent that Secret's value there as a bearer token, and in pods mode it
mounted the Secret into a pod running ``spec.image``. Someone allowed to write BrokerClusters but
not to read Secrets could read every Secret of the namespace. Now a Secret is used only if it
carries ``broker.failover.dev/credential: "true"`` (or is the operator's own generated one); any
other is refused with a condition and an event naming it, never its content, and nothing is sent
or mounted. The brokers here are a loopback server that records every Authorization header.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp.web
import kmock

from broker_operator.controller import names
from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import (
    CLUSTERS,
    NAMESPACE,
    cluster_body,
    events_of,
    eventually,
    objects_of,
    running_operator,
    serve_brokers,
)
from tests.unit.controller.test_metrics_forgotten import CLUSTERS_URL

SECRET_VALUE = "victim-database-password-7f3a-9c1d2e3f4a5b"  # as long as a real token
OPTED_IN_TOKEN = "opted-in-token-long-enough-for-the-32-byte-minimum"
LABEL = "broker.failover.dev/credential"  # the documented opt-in, spelled out as users write it
OPTED_IN = {LABEL: "true"}


async def create_secret(
    api: kmock.KubernetesEmulator, name: str, data: dict[str, str], labels: dict[str, str] | None = None
) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }
    response = await api.post(f"/api/v1/namespaces/{NAMESPACE}/secrets", json=body)
    assert response.status < 300, await response.text()


async def create_cluster(api: kmock.KubernetesEmulator, body: dict[str, Any]) -> None:
    response = await api.post(CLUSTERS_URL, json=body)
    assert response.status < 300, await response.text()


def condition(api: kmock.KubernetesEmulator, cluster: str, kind: str) -> dict[str, Any] | None:
    status = objects_of(api, CLUSTERS).get(cluster, {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


async def recording_brokers() -> tuple[aiohttp.web.AppRunner, int, list[str]]:
    """A loopback server that records the Authorization header of every call and fails it."""
    heard: list[str] = []

    async def heartbeat(request: aiohttp.web.Request) -> aiohttp.web.Response:
        heard.append(request.headers.get("Authorization", ""))
        return aiohttp.web.Response(status=503, text="not a broker")

    runner, port = await serve_brokers(heartbeat)
    return runner, port, heard


def endpoints_at(port: int, cluster: str) -> list[dict[str, Any]]:
    return [{"name": "a", "url": f"http://127.0.0.1:{port}/{cluster}/a/soap", "priority": 0}]


async def test_an_unlabelled_token_secret_is_never_sent_and_the_condition_names_it(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    runner, port, heard = await recording_brokers()
    try:
        async with running_operator(kmock, kube_api):
            await create_secret(kmock, "db-credentials", {"password": SECRET_VALUE})
            body = cluster_body(
                "thief",
                endpoints=endpoints_at(port, "thief"),
                auth={"tokenSecretRef": {"name": "db-credentials", "key": "password"}},
            )
            await create_cluster(kmock, body)
            await eventually(
                lambda: condition(kmock, "thief", "CredentialsAllowed") is not None or bool(heard)
            )
            await asyncio.sleep(3.0)  # the daemon's waits and a reconcile pass: anything it would send
            assert heard == [], "the operator sent a heartbeat with a Secret that did not opt in"
            refused = condition(kmock, "thief", "CredentialsAllowed")
            assert refused is not None and refused["status"] == "False"
            assert refused["reason"] == "SecretNotOptedIn"
            assert f"Secret {NAMESPACE}/db-credentials" in refused["message"]
            assert "spec.auth.tokenSecretRef" in refused["message"]
            assert f"{LABEL}=true" in refused["message"]
            warnings = [e for e in events_of(kmock, "thief") if e["reason"] == "CredentialRefused"]
            assert warnings and warnings[0]["type"] == "Warning"
            ready = condition(kmock, "thief", "Ready")
            assert ready is not None and ready["status"] == "False"
            everything = json.dumps([objects_of(kmock, CLUSTERS), objects_of(kmock, "v1/events")])
            assert SECRET_VALUE not in everything
    finally:
        await runner.cleanup()


async def test_a_labelled_token_secret_is_sent(kmock: kmock.KubernetesEmulator, kube_api: KubeApi) -> None:
    runner, port, heard = await recording_brokers()
    try:
        async with running_operator(kmock, kube_api):
            await create_secret(kmock, "broker-token", {"token": OPTED_IN_TOKEN}, labels=OPTED_IN)
            body = cluster_body(
                "allowed",
                endpoints=endpoints_at(port, "allowed"),
                auth={"tokenSecretRef": {"name": "broker-token"}},
            )
            await create_cluster(kmock, body)
            await eventually(lambda: bool(heard))
            assert set(heard) == {f"Bearer {OPTED_IN_TOKEN}"}
            await eventually(lambda: condition(kmock, "allowed", "CredentialsAllowed") is not None)
            allowed = condition(kmock, "allowed", "CredentialsAllowed")
            assert allowed is not None and allowed["status"] == "True"
    finally:
        await runner.cleanup()


async def test_pods_mode_creates_no_pod_that_would_mount_an_unlabelled_secret(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await create_secret(kmock, "erp-endpoints", {"backend": "http://user:pass@erp"}, labels=OPTED_IN)
        await create_secret(kmock, "other-app", {"token": SECRET_VALUE})
        body = cluster_body(
            "mounts",
            replicas=1,
            backend={"urlSecretRef": {"name": "erp-endpoints", "key": "backend"}},
            auth={"backendTokenSecretRef": {"name": "other-app"}},
        )
        await create_cluster(kmock, body)
        await eventually(lambda: condition(kmock, "mounts", "CredentialsAllowed") is not None)
        await asyncio.sleep(3.0)  # another reconcile pass
        assert objects_of(kmock, "v1/pods") == {}
        refused = condition(kmock, "mounts", "CredentialsAllowed")
        assert refused is not None and refused["status"] == "False"
        assert "Secret erp/other-app (spec.auth.backendTokenSecretRef)" in refused["message"]
        assert "erp-endpoints" not in refused["message"]  # the labelled one is fine
        # Opting in lets the pod be made on a later pass.
        patch = {"metadata": {"labels": OPTED_IN}}
        response = await kmock.patch(f"/api/v1/namespaces/{NAMESPACE}/secrets/other-app", json=patch)
        assert response.status == 200, await response.text()
        await eventually(lambda: "mounts-0" in objects_of(kmock, "v1/pods"))
        await eventually(
            lambda: (condition(kmock, "mounts", "CredentialsAllowed") or {}).get("status") == "True"
        )


async def test_a_missing_named_secret_holds_the_pods_back_and_is_named(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    """A pod made before its Secret exists would mount whatever Secret of that name appears later."""
    async with running_operator(kmock, kube_api):
        body = cluster_body("early", replicas=1, cloud={"urlSecretRef": {"name": "later", "key": "cloud"}})
        await create_cluster(kmock, body)
        await eventually(lambda: condition(kmock, "early", "CredentialsAllowed") is not None)
        refused = condition(kmock, "early", "CredentialsAllowed")
        assert refused is not None and refused["reason"] == "SecretNotFound"
        assert "Secret erp/later (spec.cloud.urlSecretRef)" in refused["message"]
        await asyncio.sleep(3.0)
        assert objects_of(kmock, "v1/pods") == {}
        await create_secret(kmock, "later", {"cloud": "http://cloud"}, labels=OPTED_IN)
        await eventually(lambda: "early-0" in objects_of(kmock, "v1/pods"))
        # The pass that made the pod finishes (its status write) before the operator stops.
        await eventually(
            lambda: (condition(kmock, "early", "CredentialsAllowed") or {}).get("status") == "True"
        )


async def test_generated_secrets_opt_in_and_an_older_unlabelled_one_of_this_cluster_is_kept(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    """The operator's own Secrets carry the label; one an earlier version made (owned by this
    BrokerCluster, no label) still works, so an upgrade does not stop running clusters."""
    owned_by_me = {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": "old", "uid": "uid-old"}
    older = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "old-broker-token",
            "namespace": NAMESPACE,
            "ownerReferences": [{**owned_by_me, "controller": True}],
        },
        "data": {"token": base64.b64encode(b"from-an-earlier-version-of-the-operator-0123").decode()},
    }
    response = await kmock.post(f"/api/v1/namespaces/{NAMESPACE}/secrets", json=older)
    assert response.status < 300, await response.text()
    runner, port, heard = await recording_brokers()
    try:
        async with running_operator(kmock, kube_api):
            await create_cluster(kmock, cluster_body("old", endpoints=endpoints_at(port, "old")))
            await eventually(lambda: bool(heard))
            assert set(heard) == {"Bearer from-an-earlier-version-of-the-operator-0123"}
            # Heartbeats need only the token that was there; the reconcile makes the backend's after
            # the certificates (key generation: a second or more).
            await eventually(lambda: "old-backend-token" in objects_of(kmock, "v1/secrets"))
            secrets = objects_of(kmock, "v1/secrets")
            assert secrets["old-backend-token"]["metadata"]["labels"][LABEL] == "true"
            assert LABEL not in (secrets["old-broker-token"]["metadata"].get("labels") or {})
            await eventually(lambda: condition(kmock, "old", "CredentialsAllowed") is not None)
            allowed = condition(kmock, "old", "CredentialsAllowed")
            assert allowed is not None and allowed["status"] == "True"
    finally:
        await runner.cleanup()


async def test_a_secret_squatting_on_a_generated_name_is_refused(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    """A Secret named like the one the operator would generate, that this BrokerCluster does not
    own: choosing the cluster's name must not be a way to have any Secret mounted."""
    await create_secret(kmock, "squat-backend-token", {"token": SECRET_VALUE})
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("squat", replicas=1))
        await eventually(lambda: condition(kmock, "squat", "CredentialsAllowed") is not None)
        refused = condition(kmock, "squat", "CredentialsAllowed")
        assert refused is not None and refused["status"] == "False"
        assert "Secret erp/squat-backend-token (generated)" in refused["message"]
        await asyncio.sleep(3.0)
        assert objects_of(kmock, "v1/pods") == {}
