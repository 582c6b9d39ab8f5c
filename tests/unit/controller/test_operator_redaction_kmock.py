"""The controller inside kopf (against kmock): an endpoint URL's credentials reach no log, status
or event.

An ``endpoints[].url`` may carry ``user:password@`` (the broker runs outside the cluster, behind
something that wants them). The operator heartbeats it with its own token and never sends, shows or
logs the userinfo (aiohttp refused a URL's credentials beside the bearer header, a ValueError that
stopped the heartbeats); the engine's failures, the status and the Warning events hold none of it.
Time is looptime's.
"""

from __future__ import annotations

import json
import logging

import kmock
import pytest

from broker_operator.controller.kube import KubeApi
from tests.unit.controller.conftest import cluster_body, events_of, eventually, running_operator
from tests.unit.controller.test_operator_kmock import cluster_status, create_cluster, unreachable

pytestmark = pytest.mark.looptime

PASSWORD = "EndpointPW-kmock-6b1d"


async def test_an_endpoint_urls_userinfo_reaches_no_log_status_or_event(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    # INFO, as the operator runs (no --verbose): kopf's own DEBUG lines print whole bodies, spec
    # included, which is one more reason docs/crd.md keeps credentials out of a spec.
    caplog.set_level(logging.INFO)
    async with running_operator(kmock, kube_api):
        # Port 9 on loopback (discard) is closed here: each heartbeat is refused at once.
        endpoints = [{"name": "ext-a", "url": f"http://ep-user:{PASSWORD}@127.0.0.1:9/soap", "priority": 0}]
        await create_cluster(kmock, cluster_body("ext", endpoints=endpoints))
        await eventually(lambda: unreachable(cluster_status(kmock, "ext")))
        status = json.dumps(cluster_status(kmock, "ext"))
        events = json.dumps(events_of(kmock, "ext"))
    assert "NoBrokerAvailable" in caplog.text and "cannot connect" in status  # the paths ran
    for where, text in (("log", caplog.text), ("status", status), ("events", events)):
        assert PASSWORD not in text and "ep-user" not in text, where
