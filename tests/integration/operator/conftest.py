"""Fixtures for the engine's integration tests: real brokers and simulators on loopback.

``cluster`` starts the two simulators and three real ``broker-service`` processes
(b0, b1, b2 in priority order) and yields a :class:`BrokerTrio`; everything is
stopped as process groups in teardown, pass or fail. The engine under test is the
real :class:`~broker_operator.engine.ClusterLoop` with the real
:class:`~broker_operator.heartbeat_client.HeartbeatClient` and the local runner's
real state-file shell. The one stand-in is :class:`ProcessShell`'s pod facts:
there is no kubelet here, so "container terminated" is read from the broker
process's exit status, which is what the kubelet would report.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker_operator.core.status import ClusterStatus
from broker_operator.engine import BrokerTarget, ClusterLoop, HeartbeatClient, HeartbeatSettings, PodFacts
from broker_operator.local_runner import LocalShell, StateFile
from broker_simulators.local_processes import DEFAULT_TOKEN, ProcessSet, RunningProcess

pytestmark = pytest.mark.integration

# Fast but not twitchy on a shared 2-core machine: a loopback heartbeat takes ~ms,
# a 0.5 s timeout leaves room for a busy scheduler.
LEASE = 2.0
# The brokers' --max-lease-seconds: what a handover renewal may grant (test_engine_handover.py).
# SETTINGS asks for no more than the lease, so that an engine restarted in the other tests waits
# out a silent broker for the lease's fence and the 2 s handover window, not for 30 s.
HANDOVER_CAP = 6.0
SETTINGS = HeartbeatSettings(
    interval_seconds=0.5,
    timeout_seconds=0.5,
    failure_threshold=2,
    lease_seconds=LEASE,
    handover_lease_seconds=LEASE,
    standby_probe_seconds=1.0,
    failback_stable_seconds=1.0,
    lease_margin_seconds=0.25,
)


def broker_active(broker: RunningProcess) -> bool | None:
    """The broker's own ``broker_active`` gauge (None if it does not answer: dead or stopped).

    A dead broker refuses at once; the timeout only bounds a stopped one. It is long enough that a
    live broker on a machine loaded by make test's builds is not read as silent (one-shot checks
    such as ``actives() == ["b1"]`` rest on it)."""
    try:
        return read_active_gauge(broker, timeout=3.0)
    except OSError:
        return None


def read_active_gauge(broker: RunningProcess, timeout: float) -> bool:
    """Whether the broker's ``/metrics`` has its ``broker_active`` gauge at 1; ``OSError`` (a
    refusal, a reset, a timeout) when it does not answer."""
    with urllib.request.urlopen(broker.url + "/metrics", timeout=timeout) as response:
        metrics = response.read().decode()
    match = re.search(r"^broker_active (\S+)$", metrics, re.MULTILINE)
    return match is not None and float(match.group(1)) == 1.0


class ProcessShell(LocalShell):
    """The local runner's shell, recording events, with pod facts read from process exit (see module doc)."""

    def __init__(self, state: StateFile, brokers: Mapping[str, RunningProcess], pods: bool) -> None:
        super().__init__(state, io.StringIO())
        self.brokers = brokers
        self.pods = pods
        self.events: list[tuple[str, str]] = []
        self.statuses: list[ClusterStatus] = []
        self.status_gate: asyncio.Event | None = None  # when set here, status writes wait for it
        self.held: list[ClusterStatus] = []  # the status writes that began while a gate was set
        self.points: list[str | None] = []  # whom each call to point the Service named, in order
        self.point_gate: asyncio.Event | None = None  # when set here, pointing the Service waits for it

    async def record_event(self, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, message))
        await super().record_event(reason, message, warning)

    async def point_active(self, active: str | None, epoch: int, url: str | None) -> None:
        self.points.append(active)
        if self.point_gate is not None:
            await self.point_gate.wait()
        await super().point_active(active, epoch, url)

    async def record_status(self, status: ClusterStatus) -> None:
        if self.status_gate is not None:
            self.held.append(status)
            await self.status_gate.wait()
        self.statuses.append(status)
        await super().record_status(status)

    def pod_facts(self) -> Mapping[str, PodFacts]:
        if not self.pods:
            return {}
        return {
            name: PodFacts(exists=True, container_terminated=not p.alive) for name, p in self.brokers.items()
        }

    def reasons(self) -> list[str]:
        """Event reasons so far. A step records its events after its calls return, so a status the
        test sees may come before its event: wait for an event, do not assert it at once."""
        return [reason for reason, _ in self.events]


@dataclass
class BrokerTrio:
    processes: ProcessSet
    brokers: dict[str, RunningProcess]
    tmp_path: Path
    loops: list[asyncio.Task[None]] = field(default_factory=list)
    clients: list[HeartbeatClient] = field(default_factory=list)

    def targets(self) -> list[BrokerTarget]:
        return [BrokerTarget(name, p.soap_url, i) for i, (name, p) in enumerate(self.brokers.items())]

    def actives(self) -> list[str]:
        """The brokers whose own gauge says active. It blocks up to a read's timeout per broker:
        an async test calls it in a thread, or the engine's loop beside it stalls."""
        return [name for name, p in self.brokers.items() if broker_active(p)]

    async def start_loop(
        self,
        *,
        pods: bool = False,
        settings: HeartbeatSettings = SETTINGS,
        preferred: str | None = None,
        state_name: str = "state.json",
        targets: list[BrokerTarget] | None = None,
        status_grace_seconds: float = 0.0,
        token: str = DEFAULT_TOKEN,
    ) -> tuple[ClusterLoop, ProcessShell]:
        """Run a ClusterLoop over all three brokers, or over ``targets`` (possibly none) if given."""
        state = StateFile(self.tmp_path / state_name)
        _epoch, status = state.load()
        shell = ProcessShell(state, self.brokers, pods)
        client = HeartbeatClient(token, "integration-test", settings.timeout_seconds)
        brokers = self.targets() if targets is None else targets
        loop = ClusterLoop(
            "acme-1000",
            brokers,
            settings,
            shell,
            client,
            status,
            preferred,
            status_grace_seconds=status_grace_seconds,
        )
        task = asyncio.create_task(loop.run())
        self.loops.append(task)
        self.clients.append(client)
        return loop, shell

    async def stop_loops(self) -> None:
        for task in self.loops:
            task.cancel()
        for task in self.loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for client in self.clients:
            await client.close()


async def eventually(check: Callable[[], object], within: float, what: str) -> None:
    """Poll ``check`` until truthy, at most ``within`` seconds (a bound, not a performance claim)."""
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {within}s waiting for: {what}")


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessSet]:
    started = ProcessSet(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
async def cluster(processes: ProcessSet, tmp_path: Path) -> AsyncIterator[BrokerTrio]:
    cloud = processes.start_cloud_simulator()
    backend = processes.start_backend_simulator()
    brokers = {
        name: processes.start_broker(
            name=name,
            backend_url=backend.url,
            cloud_url=cloud.url,
            lease_seconds=LEASE,
            extra_args=("--max-lease-seconds", f"{HANDOVER_CAP:g}"),
        )
        for name in ("b0", "b1", "b2")
    }
    trio = BrokerTrio(processes, brokers, tmp_path)
    try:
        yield trio
    finally:
        await trio.stop_loops()
