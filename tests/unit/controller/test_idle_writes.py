"""Once its clusters are Healthy and nothing changes, the real controller writes nothing to the API.

``make bench-operator`` counts what the engine would write (``operator_idle_api_writes_per_s``);
this checks the whole controller (kopf, the handlers with their periodic reconcile, the daemon and
the engine) against kmock: every POST, PUT, PATCH and DELETE it sends is recorded by the emulator
(conftest's ``NamingEmulator.writes``). The brokers are a loopback server of this test that
answers ``Heartbeat`` as a healthy broker does (active or standby, the epoch it was given).
"""

from __future__ import annotations

import asyncio
import re

import aiohttp.web
import kmock

from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import (
    CLUSTERS,
    RECONCILE_SECONDS,
    cluster_body,
    objects_of,
    running_operator,
    serve_brokers,
)
from tests.unit.controller.test_metrics_forgotten import CLUSTERS_URL

ACTIVE = re.compile(rb"<(?:\w+:)?active>(true|false|1|0)</")
EPOCH = re.compile(rb"<(?:\w+:)?epoch>(\d+)</")
REPLY = (
    '<?xml version="1.0" encoding="utf-8"?>'
    '<soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Body>'
    '<HeartbeatResponse xmlns="http://broker.failover.dev/soap/v1">'
    "<state>{state}</state><epoch>{epoch}</epoch></HeartbeatResponse></soap:Body></soap:Envelope>"
)
CLUSTER_NAMES = [f"idle-{n}" for n in range(3)]
WINDOW_SECONDS = 12.0  # six periodic reconciles, four renewals, a standby probe (10 s) of each cluster


async def healthy_brokers() -> tuple[aiohttp.web.AppRunner, int]:
    """A loopback server answering every broker's Heartbeat as a healthy broker (epochs kept)."""
    epochs: dict[str, int] = {}

    async def heartbeat(request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.read()
        active_match, epoch_match = ACTIVE.search(body), EPOCH.search(body)
        assert active_match and epoch_match, body
        active, epoch = active_match.group(1) in (b"true", b"1"), int(epoch_match.group(1))
        stored = epochs[request.path] = max(epochs.get(request.path, 0), epoch)
        reply = REPLY.format(state="Active" if active else "Inactive", epoch=stored)
        return aiohttp.web.Response(text=reply, content_type="text/xml")

    return await serve_brokers(heartbeat)


async def test_healthy_clusters_cost_no_api_writes(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    runner, port = await healthy_brokers()
    try:
        # The certificate Secrets are read again every 2 s (60 by default): each such read finds
        # nothing due and must write nothing.
        async with running_operator(kmock, kube_api, certificates_recheck_seconds=2.0) as context:
            for n, name in enumerate(CLUSTER_NAMES):
                endpoints = [
                    {"name": b, "url": f"http://127.0.0.1:{port}/{name}/{b}/soap", "priority": p}
                    for p, b in enumerate(["a", "b"])
                ]
                # Slow heartbeats with a generous timeout: a loaded machine must not turn a late answer
                # into a status change (and a write) this test would count.
                heartbeat = {"intervalSeconds": 3, "timeoutSeconds": 3, "leaseSeconds": 15}
                body = cluster_body(name, endpoints=endpoints, heartbeat=heartbeat)
                body["spec"]["company"] = str(3000 + n)
                response = await kmock.post(CLUSTERS_URL, json=body)
                assert response.status < 300, await response.text()

            def phases() -> dict[str, str | None]:
                found = objects_of(kmock, CLUSTERS)
                return {name: found.get(name, {}).get("status", {}).get("phase") for name in CLUSTER_NAMES}

            for _ in range(600):  # bounded: 60 s
                if set(phases().values()) == {"Healthy"}:
                    break
                await asyncio.sleep(0.1)
            assert set(phases().values()) == {"Healthy"}, phases()
            # mode Operator (the default): each cluster's certificates were issued, and their periodic
            # re-checks (certificates.py) are among what the window below must not see write.
            secrets = objects_of(kmock, "v1/secrets")
            wanted = [{f"{name}-ca", f"{name}-tls", f"{name}-operator-client"} for name in CLUSTER_NAMES]
            assert all(each <= set(secrets) for each in wanted), sorted(secrets)
            # What the periodic token re-reads are spread over (ControllerSettings.token_recheck_for).
            assert context.running_engines == len(CLUSTER_NAMES)
            await asyncio.sleep(2 * RECONCILE_SECONDS)  # the reconciles already under way finish
            before = len(kmock.writes)  # type: ignore[attr-defined]  # conftest's NamingEmulator
            await asyncio.sleep(WINDOW_SECONDS)
            idle = kmock.writes[before:]  # type: ignore[attr-defined]
            assert set(phases().values()) == {"Healthy"}, phases()
    finally:
        await runner.cleanup()
    assert context.running_engines == 0  # every engine stopped with the operator
    assert idle == [], f"{len(idle)} writes in {WINDOW_SECONDS:g} s with nothing changing: {idle[:10]}"
