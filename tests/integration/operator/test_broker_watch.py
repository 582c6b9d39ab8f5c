"""The operator's watch connection (``broker_watch``) against real broker processes on loopback.

What it must tell apart: a process that died (its stream ends with a FIN and its admin port
refuses: ``ProcessGone``, the proof of death) from everything that only looks like it (a reset
from something in between, a port that still accepts: ``ConnectionLost``). And the promise the
proof rests on, kept by the broker: its admin port refuses only once it has stopped acting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_operator.broker_watch import BrokerWatches, watch_url
from broker_operator.core import BrokerTarget, ConnectionLost, HeartbeatSettings, Observation, ProcessGone
from broker_operator.engine import ClusterLoop
from broker_operator.heartbeat_client import HeartbeatClient
from broker_operator.local_runner import StateFile
from broker_simulators.local_processes import (
    DEFAULT_BACKEND_TOKEN,
    DEFAULT_TOKEN,
    ProcessSet,
    RunningProcess,
    free_port,
    loopback_host,
)
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import heartbeat
from tests.integration.operator.conftest import ProcessShell, broker_active, eventually, read_active_gauge

pytestmark = pytest.mark.integration

# A lease long enough that a failover within a few seconds can only come from the watch's proof.
LONG_LEASE = HeartbeatSettings(
    interval_seconds=0.5,
    timeout_seconds=0.5,
    failure_threshold=2,
    lease_seconds=10.0,
    standby_probe_seconds=1.0,
    failback_stable_seconds=60.0,
    lease_margin_seconds=1.0,
)


def start_watched_broker(processes: ProcessSet, tmp_path: Path) -> tuple[RunningProcess, RunningProcess, str]:
    """A broker with an admin port and its simulators, the same process addressed at its admin
    port, and its Heartbeat URL there (the engine's target URL in pods mode)."""
    admin_port = free_port(loopback_host())
    broker = start_relay(
        processes, tmp_path, broker_args={"extra_args": ["--admin-port", str(admin_port)]}
    ).broker
    admin = dataclasses.replace(broker, port=admin_port)
    return broker, admin, admin.soap_url


def test_the_stream_opens_for_the_operators_credential_only(processes: ProcessSet, tmp_path: Path) -> None:
    broker, _, url = start_watched_broker(processes, tmp_path)
    for token in (None, DEFAULT_BACKEND_TOKEN):
        request = urllib.request.Request(watch_url(url))
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401
    request = urllib.request.Request(watch_url(url), headers={"Authorization": f"Bearer {DEFAULT_TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as stream:
        assert stream.readline().decode().startswith(f"watching broker {broker.name} pid ")


class Watching:
    """``BrokerWatches`` on one broker, collecting its signals."""

    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url
        self.signals: list[Observation] = []
        self.client = HeartbeatClient(DEFAULT_TOKEN, "watch-test", timeout=2.0)
        self.watches = BrokerWatches(self.client, self.signals.append)

    async def __aenter__(self) -> Watching:
        self.watches.follow([BrokerTarget(self.name, self.url, 0)])
        await self.until(lambda: self.watches.holding(self.name), "the stream held")
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.watches.close()
        await self.client.close()

    async def until(self, done: Callable[[], object], what: str, within: float = 15.0) -> None:
        try:
            async with asyncio.timeout(within):
                while not done():  # noqa: ASYNC110 - polls what other tasks and a process change
                    await asyncio.sleep(0.01)
        except TimeoutError:
            raise AssertionError(f"no {what} within {within:g}s; signals so far: {self.signals}") from None

    async def first_signal(self) -> Observation:
        await self.until(lambda: self.signals, "a signal")
        return self.signals[0]


def test_a_kill_9_is_proven_gone(processes: ProcessSet, tmp_path: Path) -> None:
    broker, admin, url = start_watched_broker(processes, tmp_path)
    assert heartbeat(admin, active=True, epoch=1).state == "Active"

    async def story() -> Observation:
        async with Watching(broker.name, url) as watching:
            broker.kill(signal.SIGKILL)
            return await watching.first_signal()

    gone = asyncio.run(story())
    assert isinstance(gone, ProcessGone), gone
    assert (gone.broker, gone.url) == (broker.name, url)
    assert "refuses connections" in gone.reason


# An idle broker may finish its whole shutdown before the first read after the signal arrives; each
# try starts a fresh broker, and one read after SIGTERM is enough to check the order. Under make
# test's builds all 5 tries once missed that first read (2026-11-26), so there are more of them.
SIGTERM_TRIES = 20


def read_gauge_until_refused(admin: RunningProcess, seen: list[bool], within: float = 30.0) -> None:
    """Append the broker's own ``broker_active`` gauge to ``seen`` until its admin port refuses.

    Only a refusal ends the reads: a timeout or a reset under load proves nothing about the
    order (CI once read a timeout as the refusal, after a last ``True``)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            seen.append(read_active_gauge(admin, timeout=2.0))
        except OSError as failed:  # urllib wraps the refusal in a URLError's reason
            if isinstance(getattr(failed, "reason", failed), ConnectionRefusedError):
                return
            # a timeout or a reset: ask again
    raise AssertionError(f"the admin port still answered {within:g}s after SIGTERM (seen {seen[-5:]})")


def test_sigterm_stops_acting_before_the_admin_port_refuses(processes: ProcessSet, tmp_path: Path) -> None:
    for attempt in range(SIGTERM_TRIES):
        broker, admin, url = start_watched_broker(processes, tmp_path / f"try-{attempt}")
        assert heartbeat(admin, active=True, epoch=1).state == "Active"
        seen: list[bool] = []

        async def story(
            broker: RunningProcess = broker,
            admin: RunningProcess = admin,
            url: str = url,
            seen: list[bool] = seen,
        ) -> Observation:
            async with Watching(broker.name, url) as watching:
                broker.kill(signal.SIGTERM)
                await asyncio.to_thread(read_gauge_until_refused, admin, seen)
                return await watching.first_signal()

        gone = asyncio.run(story())
        assert isinstance(gone, ProcessGone), gone
        if seen:
            assert seen[-1] is False, (
                f"the admin port closed while the broker reported active (seen {seen[-5:]})"
            )
            return
    raise AssertionError(f"in {SIGTERM_TRIES} tries the admin port refused before any read after SIGTERM")


def test_a_reset_is_no_proof_even_where_the_port_then_refuses(processes: ProcessSet, tmp_path: Path) -> None:
    broker, admin, _ = start_watched_broker(processes, tmp_path)

    async def story() -> Observation:
        # A middlebox: a forwarder in front of the broker that resets the operator's connection
        # and stops listening, so that the port refuses afterwards, as a dead process's would.
        accepted: list[asyncio.StreamWriter] = []

        async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)
            upstream_reader, upstream_writer = await asyncio.open_connection(admin.host, admin.port)

            async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
                with contextlib.suppress(ConnectionError):
                    while data := await source.read(4096):
                        sink.write(data)
                        await sink.drain()

            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

        server = await asyncio.start_server(forward, broker.host, 0)
        port = server.sockets[0].getsockname()[1]
        proxied = f"http://{broker.host}:{port}/soap"
        async with Watching(broker.name, proxied) as watching:
            server.close()  # nothing listens at the forwarder's port any more
            for writer in accepted:
                linger = struct.pack("ii", 1, 0)  # SO_LINGER 0: the close is a reset, not a FIN
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                writer.transport.abort()
            return await watching.first_signal()

    lost = asyncio.run(story())
    assert isinstance(lost, ConnectionLost), lost
    assert broker.alive


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): a connect there is refused."""
    with socket.socket() as sock:
        sock.bind((loopback_host(), 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(("resets", "proven"), [(1, True), (3, False)])
def test_a_probe_reset_as_the_listener_closes_is_asked_again(
    resets: int, proven: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dying broker's kernel resets a connection its closing listener had queued: the probe's
    connect then fails with ECONNRESET, not a refusal (seen in bench-failover-k8s, where the
    proof was then missed and the failover waited for the kubelet). It is asked again; a later
    refusal is the proof, and resets alone stay no proof. The reset is injected at the probe's
    connect (a mock at the kernel's boundary: the race cannot be produced on demand); the
    refusals are a real closed port's."""
    real_connect = asyncio.open_connection
    injected = [resets]

    async def connect(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if injected[0] > 0:
            injected[0] -= 1
            raise ConnectionResetError(104, f"Connect call failed ('{host}', {port})")
        return await real_connect(host, port)

    monkeypatch.setattr("broker_operator.broker_watch.asyncio.open_connection", connect)
    url = f"http://{loopback_host()}:{_closed_port()}/soap"

    async def probe() -> Observation:
        watches = BrokerWatches(HeartbeatClient(DEFAULT_TOKEN, "watch-test", timeout=2.0), lambda _: None)
        return await watches._after_end("b0", url)

    outcome = asyncio.run(probe())
    assert isinstance(outcome, ProcessGone if proven else ConnectionLost), outcome
    assert injected == [0]


def test_the_engine_fails_over_on_the_proof_without_waiting_for_the_lease(
    processes: ProcessSet, tmp_path: Path
) -> None:
    """No pod facts here (nothing reports the container dead) and a 10 s lease: only the watch's
    proof can let the engine activate b1 before the lease runs out."""
    cloud = processes.start_cloud_simulator()
    backend = processes.start_backend_simulator()
    admin: dict[str, RunningProcess] = {}
    for name in ("b0", "b1"):
        port = free_port(loopback_host())
        broker = processes.start_broker(
            name=name,
            backend_url=backend.url,
            cloud_url=cloud.url,
            lease_seconds=LONG_LEASE.lease_seconds,
            extra_args=["--admin-port", str(port)],
        )
        admin[name] = dataclasses.replace(broker, port=port)
    targets = [BrokerTarget(name, p.soap_url, i) for i, (name, p) in enumerate(admin.items())]

    async def story() -> tuple[str | None, str | None, list[tuple[str, str]]]:
        shell = ProcessShell(StateFile(tmp_path / "state.json"), admin, pods=False)
        client = HeartbeatClient(DEFAULT_TOKEN, "watch-test", LONG_LEASE.timeout_seconds)
        loop = ClusterLoop("acme-1000", targets, LONG_LEASE, shell, client, watch=True)
        task = asyncio.create_task(loop.run())
        try:
            await eventually(lambda: broker_active(admin["b0"]), 20, "b0 active")
            await asyncio.sleep(0.5)  # the watch streams are opened at the loop's first step
            admin["b0"].kill(signal.SIGKILL)
            await eventually(lambda: broker_active(admin["b1"]), 5, "b1 active, well before the 10 s lease")
            failover = loop.status.last_failover
            return (failover.reason if failover else None), loop.status.active, shell.events
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()

    reason, active, events = asyncio.run(story())
    assert (reason, active) == ("PROCESS_GONE", "b1")
    assert any(r == "ActiveUnavailable" and "refuses connections" in m for r, m in events), events
