"""The brokers' verifiers against kmock (issue 39 items 5 and 11): brokers mount the SHA-256 of each
token and never a token, a user's token shorter than 32 bytes is refused with a condition and runs
nothing, and a rotated token reaches the verifiers through the heartbeat daemon's periodic re-read.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

import kmock
import pytest

from broker_contracts.token_verifier import token_verifier
from broker_operator.controller import names
from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import (
    NAMESPACE,
    cluster_body,
    events_of,
    eventually,
    objects_of,
    running_operator,
)
from tests.unit.controller.test_operator_kmock import cluster_status, create_cluster

pytestmark = pytest.mark.looptime

SECRETS_URL = f"/api/v1/namespaces/{NAMESPACE}/secrets"


def secret_value(api: kmock.KubernetesEmulator, name: str, key: str) -> str | None:
    secret = objects_of(api, "v1/secrets").get(name)
    if secret is None:
        return None
    if key in (secret.get("data") or {}):
        return base64.b64decode(secret["data"][key]).decode()
    value = (secret.get("stringData") or {}).get(key)
    return None if value is None else str(value)


async def put_token(api: kmock.KubernetesEmulator, name: str, token: str, *, create: bool) -> None:
    data = {"token": base64.b64encode(token.encode()).decode()}
    if create:
        # Opted in as a credential (credentials.py), as a user's token Secret must be.
        labels = {names.LABEL_CREDENTIAL: names.CREDENTIAL_OPT_IN}
        metadata = {"name": name, "namespace": NAMESPACE, "labels": labels}
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata}
        response = await api.post(SECRETS_URL, json={**body, "data": data})
    else:
        response = await api.patch(f"{SECRETS_URL}/{name}", json={"data": data, "stringData": None})
    assert response.status < 300, await response.text()


async def eventually_in_real_time(check: Callable[[], bool], *, seconds: float = 20.0) -> None:
    """Like ``eventually``, but bounded by the real clock as well: the daemon's token re-read is
    due by ``time.monotonic`` and throttled to once a real second (heartbeat_client), which loop
    time, faked by looptime, would otherwise outrun."""
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        await asyncio.to_thread(time.sleep, 0.02)  # let real time pass too, without spinning
    assert check(), "condition never held"


def tokens_condition(api: kmock.KubernetesEmulator, cluster: str) -> dict[str, Any] | None:
    conditions = cluster_status(api, cluster).get("conditions") or []
    return next((c for c in conditions if c["type"] == "TokensValid"), None)


async def test_brokers_mount_the_verifiers_of_the_generated_tokens_and_never_a_token(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    async with running_operator(kmock, kube_api):
        await create_cluster(kmock, cluster_body("orders", replicas=2))
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 2)
        secrets = objects_of(kmock, "v1/secrets")
        # orders-ca, -operator-client and -tls: the certificates (mode Operator); no token is in any.
        assert sorted(secrets) == [
            "orders-backend-token",
            "orders-broker-token",
            "orders-broker-verifiers",
            "orders-ca",
            "orders-operator-client",
            "orders-tls",
        ]
        operator_token = secret_value(kmock, "orders-broker-token", "token")
        backend_token = secret_value(kmock, "orders-backend-token", "token")
        assert operator_token and backend_token
        assert secret_value(kmock, "orders-broker-verifiers", "operator-token.sha256") == token_verifier(
            operator_token
        )
        assert secret_value(kmock, "orders-broker-verifiers", "backend-token.sha256") == token_verifier(
            backend_token
        )
        for pod in objects_of(kmock, "v1/pods").values():
            assert pod["spec"]["automountServiceAccountToken"] is False
            mounted = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
            # The verifiers and the serving certificate (TLS is on by default), never a token's Secret.
            assert mounted == {"orders-broker-verifiers", "orders-tls"}
        assert tokens_condition(kmock, "orders") is None  # shown only when a token is wrong


async def test_a_short_user_token_is_refused_with_a_condition_and_runs_nothing_until_fixed(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    short, good = "tiny-token-value", "a-user-token-of-forty-bytes-0123456789ab"
    async with running_operator(kmock, kube_api):
        await put_token(kmock, "user-token", short, create=True)
        await create_cluster(
            kmock, cluster_body("orders", replicas=1, auth={"tokenSecretRef": {"name": "user-token"}})
        )
        await eventually(lambda: (tokens_condition(kmock, "orders") or {}).get("status") == "False")
        condition = tokens_condition(kmock, "orders")
        assert condition is not None and condition["reason"] == "InvalidToken"
        assert "Secret default/user-token key 'token'" in condition["message"].replace(NAMESPACE, "default")
        assert "holds 16 bytes" in condition["message"] and "at least 32" in condition["message"]
        assert objects_of(kmock, "v1/pods") == {}
        assert "orders-broker-verifiers" not in objects_of(kmock, "v1/secrets")
        warnings = [e for e in events_of(kmock, "orders") if e["reason"] == "InvalidToken"]
        assert len(warnings) == 1
        assert short not in str(cluster_status(kmock, "orders")) + str(events_of(kmock, "orders"))

        await put_token(kmock, "user-token", good, create=False)
        await eventually(lambda: len(objects_of(kmock, "v1/pods")) == 1)
        assert secret_value(kmock, "orders-broker-verifiers", "operator-token.sha256") == token_verifier(good)
        await eventually(lambda: (tokens_condition(kmock, "orders") or {}).get("status") == "True")


async def test_a_rotated_token_reaches_the_verifiers_through_the_daemons_re_read(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    first, second = "first-operator-token-of-enough-bytes-000", "second-operator-token-of-enough-bytes-00"
    endpoints = [{"name": "ext-a", "url": "http://127.0.0.1:9/soap", "priority": 0}]
    # The re-read is due by the real clock (time.monotonic), not the loop time looptime fakes.
    async with running_operator(kmock, kube_api, token_recheck_seconds=0.01, token_reads_per_second=1000.0):
        await put_token(kmock, "user-token", first, create=True)
        await create_cluster(
            kmock, cluster_body("ext", endpoints=endpoints, auth={"tokenSecretRef": {"name": "user-token"}})
        )
        await eventually(
            lambda: secret_value(kmock, "ext-broker-verifiers", "operator-token.sha256") is not None
        )
        assert secret_value(kmock, "ext-broker-verifiers", "operator-token.sha256") == token_verifier(first)
        # Endpoints mode: the engine runs (its brokers refuse connections), so its daemon re-reads.
        await eventually(lambda: (cluster_status(kmock, "ext").get("epoch") or 0) >= 1)
        await put_token(kmock, "user-token", second, create=False)
        await eventually_in_real_time(
            lambda: (
                secret_value(kmock, "ext-broker-verifiers", "operator-token.sha256") == token_verifier(second)
            )
        )
        backend = secret_value(kmock, "ext-backend-token", "token")
        assert backend is not None
        assert secret_value(kmock, "ext-broker-verifiers", "backend-token.sha256") == token_verifier(backend)
