"""Fixtures for the broker's integration tests: real processes on loopback, stopped in teardown.

``processes`` is a :class:`broker_simulators.local_processes.ProcessSet` rooted in the
test's ``tmp_path``; everything started through it is SIGTERM-ed (then
SIGKILL-ed) as a process group when the test ends, pass or fail.
``relay_pair`` starts the two simulators and one broker wired to them, the
setup most tests share.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker_contracts.token_verifier import token_verifier
from broker_service.lifecycle import Broker
from broker_service.settings import BrokerSettings
from broker_service.soap_codec import HeartbeatRequest
from broker_simulators.local_processes import ProcessSet, RunningProcess, free_port, loopback_host

pytestmark = pytest.mark.integration


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessSet]:
    started = ProcessSet(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


@dataclass
class Reserved:
    """An address picked before the process that will listen on it exists (the backend needs it first)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def reserve_address() -> Reserved:
    host = loopback_host()
    return Reserved(host, free_port(host))


@dataclass
class RelaySetup:
    backend: RunningProcess
    cloud: RunningProcess
    broker: RunningProcess


@pytest.fixture
def reserve() -> type[Reserved]:
    return Reserved


def start_relay(
    processes: ProcessSet,
    tmp_path: Path,
    *,
    streams: int = 4,
    messages_per_stream: int = 50,
    backend_args: dict[str, object] | None = None,
    cloud_args: dict[str, object] | None = None,
    broker_args: dict[str, object] | None = None,
) -> RelaySetup:
    """Cloud simulator, backend simulator pointed at a broker, and that broker (Inactive)."""
    address = reserve_address()
    cloud = processes.start_cloud_simulator(tmp_path, **(cloud_args or {}))  # type: ignore[arg-type]
    backend = processes.start_backend_simulator(
        tmp_path,
        broker_urls=[address.url],
        streams=streams,
        messages_per_stream=messages_per_stream,
        **(backend_args or {}),  # type: ignore[arg-type]
    )
    broker = processes.start_broker(
        tmp_path,
        backend_url=backend.url,
        cloud_url=cloud.url,
        host=address.host,
        port=address.port,
        **(broker_args or {}),  # type: ignore[arg-type]
    )
    return RelaySetup(backend=backend, cloud=cloud, broker=broker)


@contextlib.asynccontextmanager
async def active_in_process_broker(
    processes: ProcessSet, tmp_path: Path, *, lease_seconds: float
) -> AsyncIterator[Broker]:
    """The real ``Broker`` in the test's own event loop, Active at epoch 1, beside real simulators.

    For tests that reach into it (a held disk write); the simulators send nothing themselves.
    """
    cloud = processes.start_cloud_simulator(tmp_path)
    backend = processes.start_backend_simulator(tmp_path, streams=0)
    settings = BrokerSettings(
        name="in-process",
        cluster="acme-1000",
        account="acme",
        company="1000",
        data_dir=tmp_path / "data",
        backend_url=backend.url,
        cloud_url=cloud.url,
        token_verifier=token_verifier("t"),
        lease_seconds=lease_seconds,
    )
    broker = Broker(settings)
    await broker.start()
    try:
        reply = await broker.heartbeat(HeartbeatRequest(active=True, epoch=1, operator_id="test"))
        assert reply.state == "Active", reply
        yield broker
    finally:
        await broker.stop()
