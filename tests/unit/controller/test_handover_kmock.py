"""The whole controller hands its active over when the operator exits (issue 40).

kopf against kmock, as the other ``*_kmock`` tests: the operator's exit is kopf's stop flag, which
stops every daemon with ``OPERATOR_EXITING``, as SIGTERM does. The brokers are a loopback server
of this test that answers as healthy brokers and records each Heartbeat's ``leaseSeconds``.
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp.web
import kmock

from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import CLUSTERS, cluster_body, objects_of, running_operator, serve_brokers
from tests.unit.controller.test_idle_writes import ACTIVE, EPOCH, REPLY
from tests.unit.controller.test_metrics_forgotten import CLUSTERS_URL

LEASE_ELEMENT = re.compile(rb"<(?:\w+:)?leaseSeconds>([^<]+)</")
HANDOVER_SECONDS = 45.0

# (monotonic time, broker path, active, epoch, leaseSeconds or None), in the order received.
Heard = tuple[float, str, bool, int, float | None]


async def recording_brokers(heard: list[Heard]) -> tuple[aiohttp.web.AppRunner, int]:
    epochs: dict[str, int] = {}

    async def heartbeat(request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.read()
        active_match, epoch_match = ACTIVE.search(body), EPOCH.search(body)
        assert active_match and epoch_match, body
        active, epoch = active_match.group(1) in (b"true", b"1"), int(epoch_match.group(1))
        lease = LEASE_ELEMENT.search(body)
        heard.append(
            (time.monotonic(), request.path, active, epoch, float(lease.group(1)) if lease else None)
        )
        stored = epochs[request.path] = max(epochs.get(request.path, 0), epoch)
        reply = REPLY.format(state="Active" if active else "Inactive", epoch=stored)
        return aiohttp.web.Response(text=reply, content_type="text/xml")

    return await serve_brokers(heartbeat)


async def test_an_exiting_operator_renews_its_active_once_with_the_handover_lease(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    heard: list[Heard] = []
    runner, port = await recording_brokers(heard)
    try:
        async with running_operator(kmock, kube_api):
            endpoints = [
                {"name": b, "url": f"http://127.0.0.1:{port}/handover/{b}/soap", "priority": p}
                for p, b in enumerate(["a", "b"])
            ]
            heartbeat = {"intervalSeconds": 1, "timeoutSeconds": 1, "handoverLeaseSeconds": HANDOVER_SECONDS}
            response = await kmock.post(
                CLUSTERS_URL, json=cluster_body("handover", endpoints=endpoints, heartbeat=heartbeat)
            )
            assert response.status < 300, await response.text()
            for _ in range(300):  # bounded: 30 s
                if (
                    objects_of(kmock, CLUSTERS).get("handover", {}).get("status", {}).get("phase")
                    == "Healthy"
                ):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)  # a renewal or two of the steady active
            assert all(lease is None for *_, lease in heard), "a handover before the exit"
            stopping = time.monotonic()
        # The context's exit set kopf's stop flag and waited for kopf to end.
    finally:
        await runner.cleanup()
    active_path = "/handover/a/soap"
    handovers = [h for h in heard if h[4] is not None]
    assert [(path, active, epoch, lease) for _, path, active, epoch, lease in handovers] == [
        (active_path, True, 1, HANDOVER_SECONDS)
    ], handovers
    assert handovers[0][0] >= stopping
    # Nothing after the handover: a stopped engine sends no other heartbeat.
    assert heard[-1] == handovers[0]
