"""Fixtures for the broker's integration tests: real processes on loopback, stopped in teardown.

``processes`` is a :class:`broker_simulators.local_processes.ProcessSet` rooted in the
test's ``tmp_path``; everything started through it is SIGTERM-ed (then
SIGKILL-ed) as a process group when the test ends, pass or fail.
:func:`start_relay` starts the two simulators and one broker wired to them, the
setup most tests share, over plain HTTP or (``pki``) TLS on every leg
(``local_cluster.loopback_relay``); ``local_pki`` is one run's certificates, made once per module.
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
from broker_simulators.local_processes import ProcessSet, free_port, loopback_host
from local_cluster import loopback_relay
from local_cluster.run_pki import LocalPki, create_local_pki

pytestmark = pytest.mark.integration


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessSet]:
    started = ProcessSet(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture(scope="module")
def local_pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    """A CA and the operator's and backend's client certificates, shared by a module's tests."""
    return create_local_pki(tmp_path_factory.mktemp("pki"))


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


RelaySetup = loopback_relay.LoopbackRelay


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
    pki: LocalPki | None = None,
) -> RelaySetup:
    """Cloud simulator, backend simulator pointed at a broker, and that broker (Inactive); with
    ``pki``, TLS on every leg."""
    return loopback_relay.start_relay(
        processes,
        tmp_path,
        pki=pki,
        streams=streams,
        messages_per_stream=messages_per_stream,
        backend_args=backend_args,
        cloud_args=cloud_args,
        broker_args=broker_args,
    )


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
