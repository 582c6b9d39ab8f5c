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


CLUSTER_NAMES = [f"handover-{n}" for n in range(3)]


async def test_an_exiting_operator_renews_each_active_once_with_the_handover_lease(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    heard: list[Heard] = []
    runner, port = await recording_brokers(heard)
    try:
        async with running_operator(kmock, kube_api):
            for n, name in enumerate(CLUSTER_NAMES):
                endpoints = [
                    {"name": b, "url": f"http://127.0.0.1:{port}/{name}/{b}/soap", "priority": p}
                    for p, b in enumerate(["a", "b"])
                ]
                heartbeat = {
                    "intervalSeconds": 1,
                    "timeoutSeconds": 1,
                    "handoverLeaseSeconds": HANDOVER_SECONDS,
                }
                body = cluster_body(name, endpoints=endpoints, heartbeat=heartbeat)
                body["spec"]["company"] = str(4000 + n)
                response = await kmock.post(CLUSTERS_URL, json=body)
                assert response.status < 300, await response.text()

            def phases() -> set[str | None]:
                found = objects_of(kmock, CLUSTERS)
                return {found.get(name, {}).get("status", {}).get("phase") for name in CLUSTER_NAMES}

            for _ in range(300):  # bounded: 30 s
                if phases() == {"Healthy"}:
                    break
                await asyncio.sleep(0.1)
            assert phases() == {"Healthy"}
            await asyncio.sleep(1.5)  # a renewal or two of each steady active
            assert all(lease is None for *_, lease in heard), "a handover before the exit"
            stopping = time.monotonic()
        # The context's exit set kopf's stop flag and waited for kopf to end.
    finally:
        await runner.cleanup()
    handovers = [h for h in heard if h[4] is not None]
    assert sorted((path, active, epoch, lease) for _, path, active, epoch, lease in handovers) == [
        (f"/{name}/a/soap", True, 1, HANDOVER_SECONDS) for name in CLUSTER_NAMES
    ], handovers
    first = min(at for at, *_ in handovers)
    assert first >= stopping
    # Once one engine saw the exit, no engine of the process acts again but to hand over (a request
    # already on its way may land just after: 0.2 s on loopback).
    late = [h for h in heard if h[0] > first + 0.2 and h[4] is None]
    assert late == [], late


class RecordingLoop:
    """Stands in for a ClusterLoop: records the deadline its handover was asked for."""

    def __init__(self) -> None:
        self.deadlines: list[float] = []

    async def hand_over(self, deadline: float) -> bool:
        self.deadlines.append(deadline)
        return True


async def test_the_first_daemon_to_see_the_exit_hands_every_running_engine_over_at_once() -> None:
    # Waiting for kopf to stop each daemon, the last of 50 came after the send window and their
    # actives got no handover (make bench-operator-k8s): the first one hands over all of them.
    from broker_operator.controller.context import ControllerContext
    from broker_operator.controller.settings import ControllerSettings

    context = ControllerContext(settings=ControllerSettings(namespaces=("ns",), operator_id="t"), api=None)  # type: ignore[arg-type]
    loops = [RecordingLoop() for _ in range(3)]
    context.running_loops.update(loops)  # type: ignore[arg-type]
    await context.hand_over_all()
    assert [len(loop.deadlines) for loop in loops] == [1, 1, 1]
    assert len({loop.deadlines[0] for loop in loops}) == 1  # one window for the whole process
    await context.hand_over_all()  # a later daemon: nothing more
    assert [len(loop.deadlines) for loop in loops] == [1, 1, 1]
