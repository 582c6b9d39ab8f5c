"""The backend simulator's retries: a timed-out request goes again at once, on a new connection;
fast failures back off, doubling from 20 ms and capped at 250 ms.

The simulator runs in-process against a stand-in for the ``<cluster>-active``
Service on loopback: one address whose first connections are pinned to a frozen
pod (the request is read and never answered, as by a SIGSTOPped broker) and whose
later connections reach a broker that accepts everything, or that first answers
``BROKER_INACTIVE``. Nothing here measures time: the simulator counts what it
waited (``timeoutRetries``, ``backoffs``, ``backoffSeconds``, ``backoffMaxSeconds``
in ``/sim/status``), and the stand-in records which connection each request came on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from broker_contracts.soap import AcceptStatus, FaultCode
from broker_service import soap_codec
from broker_simulators.backend import BackendSettings, BackendSimulator, parse_args
from broker_simulators.local_processes import free_port


class ActiveService:
    """One address; the first ``frozen`` connections never answer, then ``inactive`` faults, then Accepted."""

    def __init__(self, *, frozen: int = 0, inactive: int = 0) -> None:
        self.frozen_left = frozen
        self.inactive_left = inactive
        self.frozen_ports: set[int] = set()
        self.answered_ports: list[int] = []
        self.credentials: set[str | None] = set()  # every Authorization header seen
        self.release = asyncio.Event()
        self.url = ""

    async def soap(self, request: web.Request) -> web.Response:
        port = request.transport.get_extra_info("peername")[1] if request.transport else 0
        self.credentials.add(request.headers.get("Authorization"))
        body = await request.read()
        if port in self.frozen_ports or (self.frozen_left and port not in self.answered_ports):
            if port not in self.frozen_ports:
                self.frozen_ports.add(port)
                self.frozen_left -= 1
            await self.release.wait()  # a frozen pod: the request sits there
            return web.Response(status=503)
        self.answered_ports.append(port)
        if self.inactive_left:
            self.inactive_left -= 1
            fault = soap_codec.SoapFaultError(FaultCode.BROKER_INACTIVE, "not Active", client=False)
            response = web.Response(status=500, body=soap_codec.render_fault(fault), content_type="text/xml")
            response.force_close()
            return response
        parsed = soap_codec.parse_request(body)
        assert isinstance(parsed, soap_codec.SendMessagesRequest)
        results = [
            (s, q, AcceptStatus.ACCEPTED, None) for s, q in zip(parsed.streams, parsed.seqs, strict=True)
        ]
        return web.Response(body=soap_codec.render_send_messages(1, results), content_type="text/xml")


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def running() -> AsyncIterator[list[web.AppRunner]]:
    runners: list[web.AppRunner] = []
    yield runners
    for runner in reversed(runners):
        await runner.cleanup()


async def send_everything(
    service: ActiveService, runners: list[web.AppRunner], backoff_max_seconds: float = 0.25
) -> BackendSimulator:
    app = web.Application()
    app.router.add_post("/soap", service.soap)
    runner, service.url = await serve(app)
    runners.append(runner)
    simulator = BackendSimulator(
        BackendSettings(
            broker_urls=[service.url],
            streams=2,
            messages_per_stream=5,
            bundle_size=10,
            per_stream_in_bundle=5,
            lanes=1,
            request_timeout_seconds=0.3,
            backoff_max_seconds=backoff_max_seconds,
            token="backend-secret",
        )
    )
    sim_runner, _ = await serve(simulator.app())  # its cleanup stops the lanes
    runners.insert(0, sim_runner)
    simulator.start_sending()
    try:
        async with asyncio.timeout(20):
            while simulator.accepted < 10:  # noqa: ASYNC110 - the simulator has no event to await
                await asyncio.sleep(0.02)
    finally:
        service.release.set()
    return simulator


async def test_a_timed_out_request_is_retried_at_once_on_a_new_connection(
    running: list[web.AppRunner],
) -> None:
    service = ActiveService(frozen=3)
    simulator = await send_everything(service, running)

    status = simulator.status()
    assert status["timeoutRetries"] == 3
    assert status["backoffs"] == 0 and status["backoffSeconds"] == 0  # the timeouts already waited
    assert sum(status["faults"].values()) == 3  # type: ignore[attr-defined]
    # Three timeouts, each on its own connection (a timed-out one is never used again), and the
    # bundle that got through came on yet another one.
    assert len(service.frozen_ports) == 3
    assert service.answered_ports and service.answered_ports[0] not in service.frozen_ports
    assert status["accepted"] == 10
    assert service.credentials == {"Bearer backend-secret"}  # every request, retries included


async def test_fast_failures_back_off_doubling_up_to_a_quarter_second(running: list[web.AppRunner]) -> None:
    service = ActiveService(inactive=6)
    simulator = await send_everything(service, running)

    status = simulator.status()
    assert status["faults"] == {"BROKER_INACTIVE": 6}
    assert status["timeoutRetries"] == 0
    assert status["backoffs"] == 6
    assert status["backoffMaxSeconds"] == 0.25
    assert status["backoffSeconds"] == pytest.approx(0.02 + 0.04 + 0.08 + 0.16 + 0.25 + 0.25)
    assert status["accepted"] == 10


async def test_a_lower_backoff_cap_retries_at_that_pace(running: list[web.AppRunner]) -> None:
    """``--backoff-max-seconds`` (the failover benchmarks' client retries every 20 ms)."""
    service = ActiveService(inactive=4)
    simulator = await send_everything(service, running, backoff_max_seconds=0.02)

    status = simulator.status()
    assert status["backoffs"] == 4
    assert status["backoffMaxSeconds"] == 0.02
    assert status["backoffSeconds"] == pytest.approx(4 * 0.02)
    assert parse_args(["--backoff-max-seconds", "0.05"]).backoff_max_seconds == 0.05


def test_the_credential_comes_from_a_file_or_the_environment_and_is_required_to_send(tmp_path: Path) -> None:
    token_file = tmp_path / "backend-token"
    token_file.write_text("from-file\n")
    url = ["--broker-url", "http://127.0.0.1:1"]
    assert parse_args([*url, "--backend-token-file", str(token_file)], {}).token == "from-file"
    assert parse_args(url, {"BROKER_BACKEND_TOKEN_FILE": str(token_file)}).token == "from-file"
    assert parse_args(url, {"BROKER_BACKEND_TOKEN": "from-env"}).token == "from-env"
    assert parse_args([], {}).token == ""  # a simulator that sends nothing needs none
    with pytest.raises(SystemExit):
        parse_args(url, {})  # brokers would refuse every bundle: say so at start instead
