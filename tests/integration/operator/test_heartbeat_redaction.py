"""The operator redacts what brokers tell it, whatever the broker: defence in depth.

The brokers redact their own messages (``test_credential_leaks.py``), but the operator does not
rely on it: an older broker, one configured by hand, or one that is compromised may answer with a
URL's credentials, a bearer value, or the operator's own token in its ``unavailabilityMessage`` or
in a SOAP fault. Two stand-in brokers on loopback (real HTTP, replies rendered by the broker's own
SOAP codec) answer so; the real engine with the real heartbeat client and the local runner's
shell heartbeats them, and its statuses, events, output, state file and log records are searched.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from broker_contracts.soap import FaultCode
from broker_operator.core.model import BrokerTarget
from broker_operator.engine import ClusterLoop, HeartbeatClient
from broker_operator.local_runner import StateFile
from broker_service import soap_codec
from tests.integration.operator.conftest import SETTINGS, ProcessShell, eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

OPERATOR_TOKEN = "OpTok-hostile-91c2e8ab"
URL_PASSWORD = "UrlPW-hostile-5a5a5a"
BEARER = "eyBearer-hostile-0d0d0d"
PLANTED = (OPERATOR_TOKEN, URL_PASSWORD, BEARER)


async def unavailable(request: web.Request) -> web.Response:
    await request.read()
    message = (
        f"GET https://sapuser:{URL_PASSWORD}@erp.example/broker failed; it echoed "
        f"'Authorization: Bearer {BEARER}' and the operator's {OPERATOR_TOKEN}"
    )
    body = soap_codec.render_heartbeat("Unavailable", 1, "BACKEND_UNREACHABLE", message)
    return web.Response(body=body, content_type="text/xml")


async def faulting(request: web.Request) -> web.Response:
    await request.read()
    fault = soap_codec.SoapFaultError(
        FaultCode.UNAUTHENTICATED, f"token {OPERATOR_TOKEN} refused; you sent Authorization: Bearer {BEARER}"
    )
    return web.Response(status=500, body=soap_codec.render_fault(fault), content_type="text/xml")


@pytest.fixture
async def hostile_brokers() -> AsyncIterator[list[BrokerTarget]]:
    runners = []
    targets = []
    for priority, (name, handler) in enumerate((("liar", unavailable), ("faulter", faulting))):
        app = web.Application()
        app.router.add_post("/soap", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        runners.append(runner)
        targets.append(
            BrokerTarget(name, f"http://{name}-user:{URL_PASSWORD}@127.0.0.1:{port}/soap", priority)
        )
    try:
        yield targets
    finally:
        for runner in runners:
            await runner.cleanup()


async def test_what_a_broker_says_is_redacted_before_status_events_and_logs(
    hostile_brokers: list[BrokerTarget], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    state = StateFile(tmp_path / "state.json")
    shell = ProcessShell(state, {}, pods=False)
    client = HeartbeatClient(OPERATOR_TOKEN, "redaction-test", SETTINGS.timeout_seconds)
    loop = ClusterLoop("acme-1000", hostile_brokers, SETTINGS, shell, client, None, None)
    task = asyncio.create_task(loop.run())
    try:
        await eventually(
            lambda: (
                {b.name: bool(b.unavailability_message) for b in loop.status.brokers}
                == {"liar": True, "faulter": True}
            ),
            20,
            "both brokers' answers in the status",
        )
        await eventually(lambda: "NoBrokerAvailable" in shell.reasons(), 10, "the NoBrokerAvailable event")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()
    messages = {b.name: b.unavailability_message or "" for b in loop.status.brokers}
    assert (
        "BACKEND_UNREACHABLE" in str(loop.status.to_status_patch())
        and "UNAUTHENTICATED" in messages["faulter"]
    )
    out = shell._out
    assert isinstance(out, io.StringIO)
    seen = {
        "statuses": "\n".join(str(s.to_status_patch()) for s in shell.statuses),
        "events": str(shell.events),
        "output": out.getvalue(),
        "state file": (tmp_path / "state.json").read_text(),
        "log records": caplog.text,
    }
    assert "erp.example" in seen["statuses"]  # the message is there, only without its credentials
    leaks = [f"{where} holds {value}" for where, text in seen.items() for value in PLANTED if value in text]
    assert leaks == []
